"""Measure exact edge patching and a faithfulness curve on gemma-3-270m.

    python -m experiments.measure_edges --n-prompts 32 --stride 1 --out runs/measure_edges

1. Samples two-shot one-digit addition prompts of one template and one token length, keeping
   those the model answers correctly (top-1 first answer token).
2. Times ``patching.edges.edge_patch`` over every ``--stride``-th edge in index order (``--stride 1``:
   all 10,342 edges); with a stride > 1 the time for all edges is extrapolated linearly
   (every stride-th edge samples the layers in proportion) and marked as extrapolated.
3. Scores every edge by a naive baseline, the product of the sizes of its sender's output
   change and its receiver's input change, each ``mean_prompts Σ_pos ‖·(X_c) − ·(X_r)‖`` (an
   attribution method should beat it), and computes the ten-point MIB faithfulness curve,
   CPR and CMD with 95% bootstrap intervals (counterfactual ablation).
4. Writes everything to ``<out>/results.json`` (atomic writes, after every stage) and prints a summary;
   its ``status`` says ``running``, ``complete`` or ``failed: <stage>: <why>`` (Ctrl-C included).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from experiments.runtime import ModelLoader, Run, RunSettings, cli, option, run_experiment
from experiments.runtime.bench_prompts import one_length_prompts
from experiments.runtime.timing import wall_and_cpu
from experiments.runtime.cli import override
from experiments.runtime.settings import PromptSettings

if TYPE_CHECKING:  # the library loads torch: imported where used, so --help answers before it loads
    import torch


@dataclass(frozen=True)
class MeasureEdgesConfig(PromptSettings, RunSettings):
    """Every flag of ``python -m experiments.measure_edges`` beyond :class:`RunSettings`, with its default."""

    n_prompts: int = override(PromptSettings, "n_prompts", 32, "prompts (one token length, answered correctly)")
    n_shots: int = override(PromptSettings, "n_shots", 2)
    stride: int = option(1, "patch every stride-th edge (1: all edges)", type=cli.positive_int)
    memory_mb: float = option(512.0, "activation budget per batched forward", type=cli.positive_float)
    n_bootstrap: int = option(1000, "bootstrap resamples", type=cli.positive_int)


parser = cli.config_parser(MeasureEdgesConfig, "measure_edges", __doc__)


def output_change_scores(model, data) -> torch.Tensor:
    """Naive edge scores [n_forward, n_backward]: each sender's summed output-change norm, copied to its edges."""
    import torch

    from circuits.graph import GraphLayout
    from circuits.tasks import single_batch
    from patching.sweeps import forward
    from patching.edges.engine import edge_mode, edge_prefix_kv, sender_outputs

    batch = single_batch(data, device=model.cfg.device)
    layout = GraphLayout.of(model)
    with edge_mode(model):
        start = forward.shared_prefix_length(batch.tokens, batch.cf_tokens)
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


def correct_prompts(model, cfg: MeasureEdgesConfig):
    """``cfg.n_prompts`` addition prompts of the most common token length that the model answers correctly."""
    return one_length_prompts(model, op="+", n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, seed=cfg.seed,
                              correct_only=True)


def time_edge_patch(model, cfg: MeasureEdgesConfig, data) -> dict:
    """``edge_patch`` of every ``stride``-th edge, timed (wall and CPU), extrapolated to all edges when strided."""
    from patching import SweepOptions
    from circuits.graph import GraphLayout
    from patching.edges import edge_patch

    layout = GraphLayout.of(model)
    all_edges = [tuple(e) for e in layout.real_edge_mask.nonzero().tolist()]
    edges = all_edges[:: cfg.stride]
    effects, wall, cpu = wall_and_cpu(lambda: edge_patch(model, edges, data,
                                                         options=SweepOptions(memory_mb=cfg.memory_mb)))
    scale = len(all_edges) / len(edges)
    print(f"edge_patch: {len(edges)} edges in {wall:.1f} s wall ({cpu:.1f} s CPU); all {len(all_edges)} edges: "
          f"{'' if cfg.stride == 1 else 'extrapolated '}{wall * scale / 60:.1f} min wall")
    top = effects.effects.abs().argsort(descending=True)[:20].tolist()
    return {"n_edges": len(edges), "stride": cfg.stride, "wall_s": wall, "cpu_s": cpu,
            "all_edges_wall_s": wall * scale, "extrapolated": cfg.stride != 1,
            "reference_metric": effects.reference_metric,
            "top_edges": {layout.edge_name(*edges[i]): float(effects.effects[i]) for i in top}}


def baseline_curve(model, cfg: MeasureEdgesConfig, data) -> dict:
    """The faithfulness curve of the naive output x input change scores, timed."""
    from patching import SweepOptions
    from patching.edges import faithfulness_curve

    scores = output_change_scores(model, data)
    curve_wall = time.perf_counter()
    curve = faithfulness_curve(model, scores, data, n_bootstrap=cfg.n_bootstrap,
                               options=SweepOptions(memory_mb=cfg.memory_mb))
    curve_wall = time.perf_counter() - curve_wall
    print(f"faithfulness curve (output x input change scores): CPR {curve.cpr}, CMD {curve.cmd}, {curve_wall:.1f} s")
    for x, n, f in zip(curve.fractions, curve.n_edges, curve.faithfulness):
        print(f"  {100 * x:6.1f}% ({n:5d} edges): f = {f}")
    return {"scores": "sender output-change norm x receiver input-change norm", "wall_s": curve_wall, **curve.to_dict()}


def run(cfg: MeasureEdgesConfig, *, loader: ModelLoader | None = None) -> dict:
    """Prompts, exact edge patching, the baseline curve; returns the results that results.json holds."""
    return run_experiment("measure_edges", cfg, _stages, loader=loader, plan=plan(cfg))


def plan(cfg: MeasureEdgesConfig) -> list[str]:
    """The stages every run goes through, in order (their names as in results.json ``seconds``)."""
    return ["load model", "prompts", "exact edge patching", "baseline curve"]


def _stages(run: Run) -> None:
    import torch

    from circuits.graph import GraphLayout
    from circuits.tasks import single_batch
    from patching.sweeps import forward

    cfg, results = run.cfg, run.results
    model = run.load_model()
    model.eval()
    with run.stage("prompts"):
        data = correct_prompts(model, cfg)
        batch = single_batch(data)
        prefix = forward.shared_prefix_length(batch.tokens, batch.cf_tokens)
    print(f"{len(data)} prompts of {batch.tokens.shape[1]} tokens (shared prefix {prefix}), e.g. {batch.prompts[0]!r}")
    results |= {"model": cfg.model, "n_prompts": len(data), "n_tokens": int(batch.tokens.shape[1]),
                "shared_prefix": prefix, "threads": torch.get_num_threads(), "memory_mb": cfg.memory_mb,
                "n_edges_total": GraphLayout.of(model).n_edges, "settings": dataclasses.asdict(cfg)}
    with run.stage("exact edge patching"):
        results["edge_patch"] = time_edge_patch(model, cfg, data)
    with run.stage("baseline curve"):
        results["curve"] = baseline_curve(model, cfg, data)
    print(f"wrote {run.out / 'results.json'}")


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Run the measurement with command-line flags ``argv`` (default: ``sys.argv``)."""
    return run(cli.parse_config(parser, MeasureEdgesConfig, argv), loader=loader)


if __name__ == "__main__":
    cli.run_cli(main, "measure_edges")
