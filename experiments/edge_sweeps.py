"""The edge sweeps on one or several processes: EAP-IG scores, exact patching of edges, the faithfulness curve.

    python -m experiments.edge_sweeps --n-prompts 32 --stride 10 --out runs/edge_sweeps
    accelerate launch --num_processes 4 -m experiments.edge_sweeps --device cuda --stride 1 --out runs/edge_sweeps
    accelerate launch --multi_gpu --num_processes 2 -m experiments.edge_sweeps --device cpu --out runs/edge_sweeps

The same command runs on one process or on all processes of a launch (:mod:`patching.distributed`
splits the prompts of the attribution, the edges of the exact patching and the circuits of the
curve; every process gets the combined results, and the main process writes them). Each process
loads the model on its own device (``accelerate``'s ``PartialState().device`` under a CUDA launch).
The last line is the CPU form: accelerate 1.x starts one process for ``--cpu --num_processes 2``,
while ``--multi_gpu`` on a machine without CUDA starts two that talk through gloo.

Prompts: ``--n-prompts`` two-shot one-digit additions of one template (one token length).
Writes ``<out>/results.json``: wall times, the number of processes, the top edges by EAP-IG and by
exact effect, their Spearman correlation over the patched edges, and the curve with CPR/CMD.
"""

from __future__ import annotations

import time

import torch
from scipy.stats import spearmanr

from circuits.graph import GraphLayout
from circuits.loading import load_model
from circuits.run_dirs import complete_run, prepare_run_dir
from circuits.tasks import make_dataset
from circuits.templates import get_templates
from experiments import _cli as cli
from patching import distributed

parser = cli.make_parser("edge_sweeps", __doc__)
parser.add_argument("--model", default="gemma-3-270m", help="model name or saved folder for circuits.loading.load_model")
parser.add_argument("--n-prompts", type=cli.positive_int, default=32, help="prompts (one template, one token length)")
parser.add_argument("--ig-steps", type=cli.positive_int, default=5, help="EAP-IG-inputs integration steps")
parser.add_argument("--stride", type=cli.positive_int, default=10, help="patch every stride-th edge exactly (1: all)")
parser.add_argument("--memory-mb", type=cli.positive_float, default=1024.0, help="activation budget per batched forward")
parser.add_argument("--n-bootstrap", type=cli.positive_int, default=1000, help="bootstrap resamples of the curve")
cli.add_device_flags(parser)
parser.add_argument("--seed", type=int, default=0, help="data seed")
parser.add_argument("--out", default="runs/edge_sweeps", help="output folder (written by the main process)")
parser.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out")


def _device(requested: str, shard: distributed.Shard) -> str:
    if shard.world_size > 1 and requested in ("auto", "cuda") and torch.cuda.is_available():
        from accelerate import PartialState

        return str(PartialState().device)  # one GPU per process
    return requested


def main(argv: list[str] | None = None) -> None:
    """Run the sweeps with command-line flags ``argv`` (default: ``sys.argv``)."""
    args = parser.parse_args(argv)
    shard = distributed.current_shard()
    main_process = shard.rank == 0
    out = prepare_run_dir(args.out, overwrite=args.overwrite) if main_process else None
    model = load_model(args.model, device=_device(args.device, shard), dtype=args.dtype)
    model.eval()
    template = get_templates("+", ("equation",))[0]
    data = make_dataset(model, op="+", n_prompts=args.n_prompts, template_ids=(template.id,), n_shots=2, seed=args.seed)
    layout = GraphLayout.of(model)
    edges = [tuple(e) for e in layout.real_edge_mask.nonzero().tolist()][:: args.stride]
    times = {}

    began = time.perf_counter()
    graph = distributed.edge_attribution(model, data, method="EAP-IG-inputs", ig_steps=args.ig_steps,
                                         memory_mb=args.memory_mb)
    times["edge_attribution_s"] = time.perf_counter() - began
    began = time.perf_counter()
    effects = distributed.edge_patch(model, edges, data, memory_mb=args.memory_mb)
    times["edge_patch_s"] = time.perf_counter() - began
    began = time.perf_counter()
    curve = distributed.faithfulness_curve(model, graph, data, n_bootstrap=args.n_bootstrap, memory_mb=args.memory_mb)
    times["faithfulness_curve_s"] = time.perf_counter() - began
    if not main_process:
        return

    f, b = torch.tensor(effects.edges).T
    attributed = graph.scores[f, b].double()
    rho = float(spearmanr(attributed.numpy(), effects.effects.numpy()).statistic)
    top = effects.effects.abs().argsort(descending=True)[:20].tolist()
    print(f"{shard.world_size} process(es), {len(data)} prompts: attribution {times['edge_attribution_s']:.1f} s, "
          f"{len(edges)} exact edges {times['edge_patch_s']:.1f} s, curve {times['faithfulness_curve_s']:.1f} s; "
          f"Spearman(EAP-IG, exact) = {rho:.3f}; CPR {curve.cpr}, CMD {curve.cmd}")
    complete_run(out, {
        "model": args.model, "n_processes": shard.world_size, "n_prompts": len(data), "threads": torch.get_num_threads(),
        "device": str(model.cfg.device), **times, "n_edges_patched": len(edges), "stride": args.stride,
        "spearman_eap_ig_vs_exact": rho, "n_edges_total": layout.n_edges,
        "top_exact_edges": {layout.edge_name(*effects.edges[i]): float(effects.effects[i]) for i in top},
        "curve": curve.to_dict(),
    })
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    cli.run_cli(main, "edge_sweeps")
