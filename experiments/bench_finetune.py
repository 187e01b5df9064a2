"""Benchmark: precise SFT vs full SFT per optimizer step, side by side in one process.

    python -m experiments.bench_finetune --out runs/bench_finetune

1. Loads gemma-3-270m and builds a small arithmetic training set.
2. Key heads: ``--heads L9H1,...``, else the top ``--k`` heads by path patching on
   addition prompts.
3. Alternates ``--rounds`` short runs of each arm on the same model object
   (precise, full, full_all, precise, ...) so load changes on a shared machine
   hit all alike; each run's first step (allocation) is not timed.
4. Reports seconds per step, trainable entries, optimizer-state bytes (AdamW
   moments, measured from the optimizer), each run's peak resident memory, the
   ratios against the goals (precise >= 2x faster per step, <= 5% of full SFT's
   optimizer memory), and writes ``<out>/results.json``.

Two full-SFT arms: ``full`` is this package's default (embeddings frozen, see
finetune.masks.full_selection) and ``full_all`` trains every parameter, the
paper's full SFT. Ratios are given against both (``--no-full-all`` skips the
second, which needs ~4 GB more memory). ``--nokv`` adds precise SFT with the
K/V slices frozen (``tune_kv=False``), timed against the K/V-tuning arm.
"""

from __future__ import annotations

import dataclasses
import os
import statistics

import torch

from circuits.loading import load_model
from circuits.runs import complete_run, prepare_run_dir, release_freed_memory
from circuits.nodes import parse_node
from circuits.tasks import make_dataset
from finetune import ArithmeticMix, TrainConfig, arithmetic_train_set, train
from patching.path_patching import path_patch

from experiments import _cli as cli

parser = cli.make_parser("bench_finetune", __doc__)
parser.add_argument("--model", default="gemma-3-270m", help="offline model name, TransformerLens model name, or a saved model directory")
parser.add_argument("--heads", default=None, help="comma-separated key heads, e.g. L9H1,L11H0 (default: ranked)")
parser.add_argument("--k", type=cli.positive_int, metavar="N", default=8, help="number of key heads when ranked")
parser.add_argument("--steps", type=cli.positive_int, metavar="N", default=4, help="optimizer steps per run (the first is not timed)")
parser.add_argument("--rounds", type=cli.positive_int, metavar="N", default=2, help="alternating precise/full runs per method")
parser.add_argument("--batch-size", type=cli.positive_int, default=16, metavar="N", help="examples per optimizer step")
parser.add_argument("--micro-batch-size", type=cli.positive_int, default=8, metavar="N", help="examples per forward/backward pass")
parser.add_argument("--threads", type=cli.nonnegative_int, default=0, metavar="N", help="torch CPU threads (0: torch's default)")
cli.add_device_flags(parser, dtype=False)
parser.add_argument("--out", default="runs/bench_finetune", help="output folder")
parser.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out")
parser.add_argument("--no-full-all", action="store_true", help="skip the all-parameter full SFT arm")
parser.add_argument("--nokv", action="store_true", help="add a precise arm that leaves the K/V slices frozen (tune_kv=False)")


def main(argv: list[str] | None = None) -> None:
    """Run the experiment with command-line flags ``argv`` (default: ``sys.argv``)."""
    args = parser.parse_args(argv)

    out = prepare_run_dir(args.out, overwrite=args.overwrite)
    if args.threads:
        torch.set_num_threads(args.threads)

    model = load_model(args.model, device=args.device)
    data = arithmetic_train_set(model, ArithmeticMix(n_examples=args.batch_size * args.steps, seed=1))

    if args.heads:
        heads = [parse_node(h) for h in args.heads.split(",")]
        head_source = "--heads"
    else:
        probe = make_dataset(model, op="+", n_prompts=32, styles=("equation",), seed=7)
        scores, head_source = path_patch(model, probe, progress=False), "path_patching"
        heads = [node for node, _ in scores.ranked("heads", by="neg")[: args.k]]
    print(f"key heads ({head_source}): {', '.join(map(str, heads))}")

    config = TrainConfig(lr=1e-5, batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
                         max_steps=args.steps, progress=False)
    arms = {"precise": ("precise", config), "full": ("full", config)}
    if args.nokv:
        arms["precise_nokv"] = ("precise", dataclasses.replace(config, tune_kv=False))
    if not args.no_full_all:
        arms["full_all"] = ("full", dataclasses.replace(config, train_embeddings=True))
    runs = {arm: [] for arm in arms}
    for round_ in range(args.rounds):
        for arm, (method, arm_config) in arms.items():
            release_freed_memory()  # else memory freed by the previous arm counts in this arm's peak RSS
            result = train(model, data, arm_config, method=method, heads=heads if method == "precise" else None)
            runs[arm].append(result.summary())
            print(f"round {round_}: {arm:8s} {result.seconds_per_step:6.2f} s/step, "
                  f"optimizer state {result.optimizer_state_bytes / 2**20:8.1f} MiB, "
                  f"peak RSS {result.peak_rss_bytes / 2**30:5.2f} GiB, trainable {result.n_trainable:,}")

    summary = {}
    for arm, results in runs.items():
        summary[arm] = {
            "seconds_per_step_median": statistics.median(r["seconds_per_step"] for r in results),
            "seconds_per_step_all": [r["seconds_per_step"] for r in results],
            "optimizer_state_bytes": results[0]["optimizer_state_bytes"],
            # smallest over rounds: memory the allocator kept from earlier runs can only add to a run's peak
            "peak_rss_bytes": min(r["peak_rss_bytes"] for r in results),
            "n_trainable": results[0]["n_trainable"],
            "selection": results[0]["selection"],
        }
    precise = summary["precise"]
    ratios = {arm: {"speedup_over_precise": summary[arm]["seconds_per_step_median"] / precise["seconds_per_step_median"],
                    "precise_optimizer_memory_ratio": precise["optimizer_state_bytes"] / summary[arm]["optimizer_state_bytes"]}
              for arm in summary if not arm.startswith("precise")}
    if "precise_nokv" in summary:  # against the K/V-tuning precise arm: >1 means freezing K/V is faster
        nokv = summary["precise_nokv"]
        results_nokv = {"speedup_over_precise_with_kv": precise["seconds_per_step_median"] / nokv["seconds_per_step_median"],
                        "optimizer_memory_ratio_to_precise_with_kv": nokv["optimizer_state_bytes"] / precise["optimizer_state_bytes"]}
    else:
        results_nokv = None
    results = {
        "model": args.model, "heads": [str(h) for h in heads], "head_source": head_source,
        "steps_per_run": args.steps, "rounds": args.rounds, "batch_size": args.batch_size,
        "micro_batch_size": args.micro_batch_size, "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(), "methods": summary, "ratios": ratios,
        "goals": {arm: {"speedup>=2": r["speedup_over_precise"] >= 2, "memory_ratio<=0.05": r["precise_optimizer_memory_ratio"] <= 0.05}
                  for arm, r in ratios.items()},
    }
    if results_nokv is not None:
        results["precise_nokv"] = results_nokv
    for arm, r in ratios.items():
        print(f"vs {arm} ({summary[arm]['selection']}): precise is {r['speedup_over_precise']:.2f}x faster per step "
              f"(goal >= 2x); optimizer memory {100 * r['precise_optimizer_memory_ratio']:.2f}% (goal <= 5%)")
    complete_run(out, results)
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    cli.run_cli(main, "bench_finetune")
