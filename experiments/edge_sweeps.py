"""The edge sweeps on one or several processes: EAP-IG scores, exact patching of edges, the faithfulness curve.

    python -m experiments.edge_sweeps --n-prompts 32 --stride 10 --out runs/edge_sweeps [--threads 1]
    accelerate launch --num_processes 4 -m experiments.edge_sweeps --device cuda --stride 1 --out runs/edge_sweeps
    accelerate launch --multi_gpu --num_processes 2 -m experiments.edge_sweeps --device cpu --out runs/edge_sweeps

The same command runs on one process or on all processes of a launch (:mod:`patching.edges.distributed`
splits the prompts of the attribution, the edges of the exact patching and the circuits of the
curve; every process gets the combined results, and only the main process prepares, writes and
completes the run folder ``--out``). Each process loads the model on its own device (``accelerate``'s
``PartialState().device`` under a CUDA launch).
The last line is the CPU form: accelerate 1.x starts one process for ``--cpu --num_processes 2``,
while ``--multi_gpu`` on a machine without CUDA starts two that talk through gloo.

Prompts: ``--n-prompts`` two-shot one-digit additions of one template and one token length, the
same as ``experiments.bench_circuits`` samples with the same seed.
Writes ``<out>/results.json`` (after every stage; its ``status`` says ``running``, ``complete`` or
``failed: <stage>: <why>``): wall times and the main process's CPU times, the number of
processes, the top edges by EAP-IG and by exact effect, their Spearman correlation over the patched
edges, and the curve with CPR/CMD; and the exact effects (``exact_edges.safetensors``, per prompt;
``exact_edges_eap.json``, EAP-IG's graph format).
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ContextManager

from circuits.errors import InputError
from experiments.runtime import ModelLoader, Run, RunSettings, cli, option, run_experiment
from experiments.runtime.bench_prompts import one_length_prompts
from experiments.runtime.timing import wall_and_cpu

if TYPE_CHECKING:  # the library loads torch: imported where used, so --help answers before it loads
    from circuits import Graph
    from circuits.graph import GraphLayout
    from patching.edges import distributed
    from patching.edges.patch import EdgeEffects
    from patching.edges.curves import FaithfulnessCurve


@dataclass(frozen=True)
class EdgeSweepsConfig(RunSettings):
    """Every flag of ``python -m experiments.edge_sweeps`` beyond :class:`RunSettings`, with its default.

    ``--threads`` is per process; ``--out`` is written by the main process only.
    """

    n_prompts: int = option(32, "prompts (one template, one token length)", type=cli.positive_int)
    ig_steps: int = option(5, "EAP-IG-inputs integration steps", type=cli.positive_int)
    stride: int = option(10, "patch every stride-th edge exactly (1: all)", type=cli.positive_int)
    memory_mb: float = option(1024.0, "activation budget per batched forward", type=cli.positive_float)
    n_bootstrap: int = option(1000, "bootstrap resamples of the curve", type=cli.positive_int)


parser = cli.config_parser(EdgeSweepsConfig, "edge_sweeps", __doc__)


def _device(requested: str, shard: distributed.Shard) -> str:
    import torch

    if shard.world_size > 1 and requested in ("auto", "cuda") and torch.cuda.is_available():
        from accelerate import PartialState

        return str(PartialState().device)  # one GPU per process
    return requested


@dataclass
class Sweeps:
    """What the three sweeps found: EAP-IG scores, exact effects of the patched edges, the curve; wall times."""

    layout: GraphLayout
    edges: list[tuple[int, int]]  # the exactly patched edges: every stride-th real edge
    graph: Graph  # EAP-IG-inputs scores of every edge
    effects: EdgeEffects
    curve: FaithfulnessCurve
    seconds: dict[str, float]


def sweep(model, data, cfg: EdgeSweepsConfig,
          stage: Callable[[str], ContextManager] = lambda name: nullcontext()) -> Sweeps:
    """EAP-IG-inputs scores, exact effects of every stride-th edge, the faithfulness curve, each split over the processes.

    ``stage(name)`` wraps each sweep (:meth:`experiments.runtime.Run.stage` in a run).
    """
    from circuits.graph import GraphLayout
    from patching.edges import distributed
    from patching import SweepOptions

    options = SweepOptions(memory_mb=cfg.memory_mb)
    layout = GraphLayout.of(model)
    edges = [tuple(e) for e in layout.real_edge_mask.nonzero().tolist()][:: cfg.stride]
    times = {}
    with stage("edge attribution"):
        graph, times["edge_attribution_s"], times["edge_attribution_cpu_s"] = wall_and_cpu(
            lambda: distributed.distributed_edge_attribution(model, data, method="EAP-IG-inputs",
                                                             ig_steps=cfg.ig_steps, options=options))
    with stage("exact edge patching"):
        effects, times["edge_patch_s"], times["edge_patch_cpu_s"] = wall_and_cpu(
            lambda: distributed.distributed_edge_patch(model, edges, data, options=options))
    with stage("faithfulness curve"):
        curve, times["faithfulness_curve_s"], times["faithfulness_curve_cpu_s"] = wall_and_cpu(
            lambda: distributed.distributed_faithfulness_curve(model, graph, data, n_bootstrap=cfg.n_bootstrap,
                                                               options=options))
    return Sweeps(layout, edges, graph, effects, curve, times)


#: The fewest exactly patched edges a rank correlation with the EAP-IG scores is computed over.
MIN_RANKED_EDGES = 3


def check_stride(cfg: EdgeSweepsConfig, model) -> None:
    """Right after the model loads (its edge count bounds ``--stride``): refuse a stride that leaves too few edges
    for the Spearman correlation, before any sweep runs."""
    from circuits.graph import GraphLayout

    n_edges = GraphLayout.of(model).n_edges
    n_patched = len(range(0, n_edges, cfg.stride))
    if n_patched < MIN_RANKED_EDGES:
        raise InputError(f"--stride {cfg.stride} patches {n_patched} of the {n_edges} edges of {cfg.model} exactly; "
                         f"their Spearman correlation with EAP-IG needs at least {MIN_RANKED_EDGES}: give --stride "
                         f"{max(1, n_edges // MIN_RANKED_EDGES)} or less.")


def summarize(cfg: EdgeSweepsConfig, shard: distributed.Shard, model, data, sweeps: Sweeps) -> dict:
    """results.json: wall times, processes, Spearman of EAP-IG against the exact effects, the top edges, the curve."""
    import torch
    from scipy.stats import spearmanr

    effects, curve, times, layout = sweeps.effects, sweeps.curve, sweeps.seconds, sweeps.layout
    f, b = torch.tensor(effects.edges).T
    attributed = sweeps.graph.scores[f, b].double()
    rho = float(spearmanr(attributed.numpy(), effects.effects.numpy()).statistic)
    undefined = None
    if not math.isfinite(rho):  # constant scores or effects: no ranking to correlate
        undefined = ("the EAP-IG scores" if bool((attributed == attributed[0]).all()) else "the exact effects") + \
            f" of the {len(sweeps.edges)} patched edges are all equal, so they rank nothing"
        rho = None
    top = effects.effects.abs().argsort(descending=True)[:20].tolist()
    print(f"{shard.world_size} process(es), {len(data)} prompts: attribution {times['edge_attribution_s']:.1f} s, "
          f"{len(sweeps.edges)} exact edges {times['edge_patch_s']:.1f} s, curve {times['faithfulness_curve_s']:.1f} s; "
          f"Spearman(EAP-IG, exact) = {f'{rho:.3f}' if undefined is None else f'undefined ({undefined})'}; "
          f"CPR {curve.cpr}, CMD {curve.cmd}")
    return {
        "model": cfg.model, "settings": dataclasses.asdict(cfg), "n_processes": shard.world_size, "n_prompts": len(data),
        "threads": torch.get_num_threads(), "device": str(model.cfg.device), **times,
        "n_edges_patched": len(sweeps.edges), "stride": cfg.stride, "spearman_eap_ig_vs_exact": rho,
        **({"spearman_undefined": undefined} if undefined else {}),
        "n_edges_total": layout.n_edges,
        "top_exact_edges": {layout.edge_name(*effects.edges[i]): float(effects.effects[i]) for i in top},
        "curve": curve.to_dict(),
    }


def run(cfg: EdgeSweepsConfig, *, loader: ModelLoader | None = None) -> dict | None:
    """Run the sweeps on this process's share; the main process writes and returns the results (others: None)."""
    from patching.edges import distributed

    shard = distributed.current_shard()  # sets up the launch's process group
    results = run_experiment("edge_sweeps", cfg, lambda run: _stages(run, shard), loader=loader,
                             main_process=shard.rank == 0, plan=plan(cfg))
    return results if shard.rank == 0 else None


def plan(cfg: EdgeSweepsConfig) -> list[str]:
    """The stages every run goes through, in order (their names as in results.json ``seconds``; the other processes
    of a launch run all but the last)."""
    return ["load model", "prompts", "edge attribution", "exact edge patching", "faithfulness curve",
            "save exact effects"]


def _stages(run: Run, shard: distributed.Shard) -> None:
    cfg = run.cfg
    with run.stage("load model", f"loading {cfg.model}"):
        model = run.loader(cfg.model, device=_device(cfg.device, shard), dtype=cfg.dtype)
    model.eval()
    check_stride(cfg, model)
    with run.stage("prompts"):
        # bench_circuits' prompts: one template and one token length, so the shared prefix is long
        data = one_length_prompts(model, op="+", n_prompts=cfg.n_prompts, n_shots=2, seed=cfg.seed)
    sweeps = sweep(model, data, cfg, run.stage)
    if not run.main_process:
        return
    run.results |= summarize(cfg, shard, model, data, sweeps)
    with run.stage("save exact effects"):
        sweeps.effects.save(run.out, model.cfg.d_model, overwrite=True)  # the run folder is this run's own
    print(f"wrote {run.out / 'results.json'}")


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict | None:
    """Run the sweeps with command-line flags ``argv`` (default: ``sys.argv``); a launched run ends its process group."""
    results = run(cli.parse_config(parser, EdgeSweepsConfig, argv), loader=loader)
    from circuits.process_group import end_process_group  # after parsing: --help answers before torch loads

    end_process_group()  # no process may exit while the main one still writes the run folder
    return results


if __name__ == "__main__":
    cli.run_cli(main, "edge_sweeps")
