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
second, which needs ~4 GB more memory). Without ``--out`` the folder is
``runs/bench_finetune``.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from experiments.runtime.run_folder import release_freed_memory

from experiments.runtime import ModelLoader, Run, RunSettings, cli, option, run_experiment

if TYPE_CHECKING:  # the library loads torch: imported where used, so --help answers before it loads
    from patching.node_level.head_ranking import KeyHeads

DEFAULT_OUT = "runs/bench_finetune"  # one folder, not runs/<name>-<timestamp>


@dataclass(frozen=True)
class BenchFinetuneConfig(RunSettings):
    """Every flag of ``python -m experiments.bench_finetune``, with its default (model, device, dtype, threads,
    seed, out and overwrite: :class:`experiments.runtime.RunSettings`; ``out`` None means ``runs/bench_finetune``)."""

    heads: str | None = option(None, "comma-separated key heads, e.g. L9H1,L11H0 (default: ranked)")
    k: int = option(8, "number of key heads when ranked", type=cli.positive_int)
    steps: int = option(4, "optimizer steps per run (the first is not timed)", type=cli.positive_int)
    rounds: int = option(2, "alternating precise/full runs per method", type=cli.positive_int)
    batch_size: int = option(16, "examples per optimizer step", type=cli.positive_int)
    micro_batch_size: int = option(8, "examples per forward/backward pass", type=cli.positive_int)
    no_full_all: bool = option(False, "skip the all-parameter full SFT arm")
    nokv: bool = option(False, "add a precise arm that leaves the K/V slices frozen (tune_kv=False)")


parser = cli.config_parser(BenchFinetuneConfig, "bench_finetune", __doc__, help_texts={"out": f"output folder (default: {DEFAULT_OUT})"})


def choose_heads(model, cfg: BenchFinetuneConfig) -> KeyHeads:
    """``--heads``, or the top ``--k`` heads by path patching on 32 addition prompts."""
    from circuits import parse_node
    from circuits.tasks import make_dataset
    from patching.node_level.head_ranking import given_key_heads, rank_key_heads

    if cfg.heads:
        return given_key_heads([parse_node(h) for h in cfg.heads.split(",")])
    probe = make_dataset(model, op="+", n_prompts=32, styles=("equation",), seed=7)
    return rank_key_heads(model, {"+": probe}, top_k=cfg.k)


def run_arms(model, data, heads, cfg: BenchFinetuneConfig) -> dict[str, list[dict]]:
    """``--rounds`` rounds of each arm in turn on the same model object; each run's ``TrainResult.summary()``."""
    from finetune import FullSFTConfig, PreciseSFTConfig, train

    shared = dict(lr=1e-5, batch_size=cfg.batch_size, micro_batch_size=cfg.micro_batch_size, max_steps=cfg.steps,
                  progress=False)
    arms = {"precise": PreciseSFTConfig(**shared), "full": FullSFTConfig(**shared)}
    if cfg.nokv:
        arms["precise_nokv"] = PreciseSFTConfig(**shared, tune_kv=False)
    if not cfg.no_full_all:
        arms["full_all"] = FullSFTConfig(**shared, train_embeddings=True)
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for round_ in range(cfg.rounds):
        for arm, config in arms.items():
            release_freed_memory()  # else memory freed by the previous arm counts in this arm's peak RSS
            result = train(model, data, config, heads=heads if isinstance(config, PreciseSFTConfig) else None)
            runs[arm].append(result.summary())
            print(f"round {round_}: {arm:8s} {result.seconds_per_step:6.2f} s/step, "
                  f"optimizer state {result.optimizer_state_bytes / 2**20:8.1f} MiB, "
                  f"peak RSS {result.peak_rss_bytes / 2**30:5.2f} GiB, trainable {result.n_trainable:,}")
    return runs


def summarize(runs: dict[str, list[dict]]) -> tuple[dict, dict]:
    """Per arm: median seconds per step, optimizer bytes, smallest peak RSS; the ratios of every arm to precise."""
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
    if "precise_nokv" in summary:  # >1: freezing K/V is faster than tuning it
        nokv = summary["precise_nokv"]
        ratios_nokv = {"speedup_over_precise_with_kv": precise["seconds_per_step_median"] / nokv["seconds_per_step_median"],
                       "optimizer_memory_ratio_to_precise_with_kv": nokv["optimizer_state_bytes"] / precise["optimizer_state_bytes"]}
        summary["precise_nokv"]["vs_precise_with_kv"] = ratios_nokv
    for arm, r in ratios.items():
        print(f"vs {arm} ({summary[arm]['selection']}): precise is {r['speedup_over_precise']:.2f}x faster per step "
              f"(goal >= 2x); optimizer memory {100 * r['precise_optimizer_memory_ratio']:.2f}% (goal <= 5%)")
    return summary, ratios


def run(cfg: BenchFinetuneConfig, *, loader: ModelLoader | None = None) -> dict:
    """Run the benchmark; return the results dict that is also written to results.json."""
    if cfg.out is None:
        cfg = dataclasses.replace(cfg, out=DEFAULT_OUT)
    return run_experiment("bench_finetune", cfg, _stages, loader=loader, plan=plan(cfg),
                          results={"model": cfg.model, "settings": dataclasses.asdict(cfg)})


def plan(cfg: BenchFinetuneConfig) -> list[str]:
    """The stages every run goes through, in order (their names as in results.json ``seconds``)."""
    return ["load model", "data and key heads", "arms"]


def _stages(run: Run) -> None:
    import torch

    from finetune import ArithmeticMix, arithmetic_train_set

    cfg = run.cfg
    model = run.load_model()
    with run.stage("data and key heads"):
        data = arithmetic_train_set(model, ArithmeticMix(n_examples=cfg.batch_size * cfg.steps, seed=1))
        chosen = choose_heads(model, cfg)
    print(f"key heads ({chosen.rule['source']}): {', '.join(map(str, chosen.heads))}")
    with run.stage("arms"):
        summary, ratios = summarize(run_arms(model, data, chosen.heads, cfg))
    run.results |= {
        "heads": [str(h) for h in chosen.heads],
        "head_source": chosen.rule["source"], "key_heads_rule": chosen.rule,
        "steps_per_run": cfg.steps, "rounds": cfg.rounds, "batch_size": cfg.batch_size,
        "micro_batch_size": cfg.micro_batch_size, "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(), "methods": summary, "ratios": ratios,
        "goals": {arm: {"speedup>=2": r["speedup_over_precise"] >= 2, "memory_ratio<=0.05": r["precise_optimizer_memory_ratio"] <= 0.05}
                  for arm, r in ratios.items()},
    }
    print(f"wrote {run.out / 'results.json'}")


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Run the benchmark with command-line flags ``argv`` (default: ``sys.argv``)."""
    return run(cli.parse_config(parser, BenchFinetuneConfig, argv), loader=loader)


if __name__ == "__main__":
    cli.run_cli(main, "bench_finetune")
