"""Measure exact edge patching and a faithfulness curve on gemma-3-270m.

    python -m experiments.measure_edges --n-prompts 32 --stride 1 --out runs/measure_edges

1. Samples two-shot one-digit addition prompts of one template and one token length, keeping
   those the model answers correctly (top-1 first answer token).
2. Times ``patching.edge_patch`` over every ``--stride``-th edge in index order (``--stride 1``:
   all 10,342 edges); with a stride > 1 the time for all edges is extrapolated linearly
   (every stride-th edge samples the layers in proportion) and marked as extrapolated.
3. Scores every edge by a naive baseline, the product of the sizes of its sender's output
   change and its receiver's input change, each ``mean_prompts Σ_pos ‖·(X_c) − ·(X_r)‖`` (an
   attribution method should beat it), and computes the ten-point MIB faithfulness curve,
   CPR and CMD with 95% bootstrap intervals (counterfactual ablation).
4. Writes everything to ``<out>/results.json`` (atomic write) and prints a summary.
"""

from __future__ import annotations

import time

import torch

from circuits.graph import GraphLayout
from circuits.loading import load_model
from circuits.run_dirs import prepare_run_dir, write_json_atomic
from circuits.tasks import accuracy_mask, make_dataset, single_batch
from circuits.templates import get_templates
from patching import _forward_cache
from patching.edge_patching import edge_patch
from patching.edge_runs import edge_mode, edge_prefix_kv, sender_outputs
from patching.faithfulness import faithfulness_curve


from experiments import _cli as cli

parser = cli.make_parser("measure_edges", __doc__)
parser.add_argument("--model", default="gemma-3-270m", help="model name for circuits.loading.load_model")
parser.add_argument("--n-prompts", type=int, default=32, help="prompts (one token length, answered correctly)")
parser.add_argument("--n-shots", type=int, default=2, help="few-shot examples before each prompt")
parser.add_argument("--stride", type=int, default=1, help="patch every stride-th edge (1: all edges)")
parser.add_argument("--threads", type=cli.nonnegative_int, default=0, help="torch threads (0: torch's default)")
parser.add_argument("--memory-mb", type=float, default=512.0, help="activation budget per batched forward")
parser.add_argument("--n-bootstrap", type=int, default=1000, help="bootstrap resamples")
cli.add_device_flags(parser, dtype=False)
parser.add_argument("--seed", type=int, default=0, help="data seed")
parser.add_argument("--out", default="runs/measure_edges", help="output folder")
parser.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out")


def output_change_scores(model, data) -> torch.Tensor:
    """Naive edge scores [n_forward, n_backward]: each sender's summed output-change norm, copied to its edges."""
    batch = single_batch(data, device=model.cfg.device)
    layout = GraphLayout.of(model)
    with edge_mode(model):
        start = _forward_cache.shared_prefix_length(batch.tokens, batch.cf_tokens)
        kv = edge_prefix_kv(model, batch.tokens[:, :start])
        ref = sender_outputs(model, batch.tokens, start=start, prefix_kv=kv)
        cf = sender_outputs(model, batch.cf_tokens, start=start, prefix_kv=kv)
    change = cf - ref  # [n_forward, batch, pos, d_model]
    per_sender = change.norm(dim=-1).sum(-1).mean(-1).cpu()  # [n_forward]
    # A receiver's input change is the sum of its senders' changes (the edge convention).
    cumulative = change.cumsum(0)
    limits = torch.tensor([layout.forward_limit(b) for b in range(layout.n_backward)])
    per_receiver = cumulative[limits - 1].norm(dim=-1).sum(-1).mean(-1).cpu()  # [n_backward]
    return torch.where(layout.real_edge_mask, per_sender[:, None] * per_receiver[None, :], torch.nan)


def main(argv: list[str] | None = None) -> None:
    """Run the measurement with command-line flags ``argv`` (default: ``sys.argv``)."""
    args = parser.parse_args(argv)
    out = prepare_run_dir(args.out, overwrite=args.overwrite)
    cli.set_threads(args.threads)
    torch.manual_seed(args.seed)
    model = load_model(args.model, device=args.device)
    model.eval()
    template = get_templates("+", ("equation",))[0]
    data = make_dataset(model, op="+", n_prompts=4 * args.n_prompts, template_ids=(template.id,), n_shots=args.n_shots,
                        seed=args.seed)
    correct = accuracy_mask(model, data)
    lengths = data["end_pos"]
    common = max(set(lengths), key=lengths.count)
    keep = [i for i, (n, ok) in enumerate(zip(lengths, correct)) if n == common and ok][: args.n_prompts]
    if len(keep) < args.n_prompts:
        raise SystemExit(f"Only {len(keep)} correctly answered prompts of one token length; lower --n-prompts.")
    data = data.select(keep)
    batch = single_batch(data)
    prefix = _forward_cache.shared_prefix_length(batch.tokens, batch.cf_tokens)
    print(f"{len(data)} prompts of {batch.tokens.shape[1]} tokens (shared prefix {prefix}), e.g. {batch.prompts[0]!r}")

    layout = GraphLayout.of(model)
    all_edges = [tuple(e) for e in layout.real_edge_mask.nonzero().tolist()]
    edges = all_edges[:: args.stride]
    wall, cpu = time.perf_counter(), time.process_time()
    effects = edge_patch(model, edges, data, memory_mb=args.memory_mb)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    scale = len(all_edges) / len(edges)
    print(f"edge_patch: {len(edges)} edges in {wall:.1f} s wall ({cpu:.1f} s CPU); all {len(all_edges)} edges: "
          f"{'' if args.stride == 1 else 'extrapolated '}{wall * scale / 60:.1f} min wall")

    scores = output_change_scores(model, data)
    curve_wall = time.perf_counter()
    curve = faithfulness_curve(model, scores, data, n_bootstrap=args.n_bootstrap, memory_mb=args.memory_mb)
    curve_wall = time.perf_counter() - curve_wall
    print(f"faithfulness curve (output x input change scores): CPR {curve.cpr}, CMD {curve.cmd}, {curve_wall:.1f} s")
    for x, n, f in zip(curve.fractions, curve.n_edges, curve.faithfulness):
        print(f"  {100 * x:6.1f}% ({n:5d} edges): f = {f}")

    top = effects.effects.abs().argsort(descending=True)[:20].tolist()
    write_json_atomic(out / "results.json", {
        "model": args.model, "n_prompts": len(data), "n_tokens": int(batch.tokens.shape[1]), "shared_prefix": prefix,
        "threads": torch.get_num_threads(), "memory_mb": args.memory_mb, "n_edges_total": len(all_edges),
        "edge_patch": {"n_edges": len(edges), "stride": args.stride, "wall_s": wall, "cpu_s": cpu,
                       "all_edges_wall_s": wall * scale, "extrapolated": args.stride != 1,
                       "reference_metric": effects.reference_metric,
                       "top_edges": {layout.edge_name(*edges[i]): float(effects.effects[i]) for i in top}},
        "curve": {"scores": "sender output-change norm x receiver input-change norm", "wall_s": curve_wall, **curve.to_dict()},
    })
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    cli.run_cli(main, "measure_edges")
