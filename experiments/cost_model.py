"""Cost model of the sweeps: FLOPs and memory as functions of the model's shape and the prompts, calibrated here.

    python -m experiments.cost_model measure --model gemma-3-270m --out runs/cost/gemma.json
    python -m experiments.cost_model measure --model smollm2-135m --out runs/cost/smollm2.json
    python -m experiments.cost_model fit runs/cost/gemma.json runs/cost/smollm2.json --out runs/cost/fit.json

Shape: L layers, H query heads, G key/value heads, d width, d_h head width, m MLP width (k = 3
matrices for gated MLPs, 2 otherwise), V vocabulary; T prompt tokens, of which S are after the
shared prefix of reference and counterfactual (the sweeps run only those), B prompts; the edge
graph has n_f = 1 + L(H + 1) senders, n_b = L(3H + 1) + 1 receivers and E edges.

One position through one block costs ``f = 2 d d_h (2H + 2G) + 4 H d_h T + 2 k d m`` FLOPs; in the
edge graph's mode (per-head q/k/v inputs, K/V ungrouped) ``f_e = 8 d d_h H + 4 H d_h T + 2 k d m``;
an END-only row through the MLP ``f_end = 2 d d_h H + 2 k d m``. :data:`SWEEPS` gives each sweep's
FLOPs ``W`` (see docs/gpu.md for the table) and activation memory.

``measure`` times every sweep once (after a warm-up forward) on small sizes and records the peak
resident memory above the loaded model; the plain forward's time gives the machine's effective
FLOP/s ``R``. ``fit`` fits one constant per sweep, ``α = measured time / (W / R)`` (the
implementation's overhead over a plain forward of the same FLOPs; geometric mean over the two
models), prints predicted against measured time for both models, and predicts Llama-2-7B and
Llama-3-8B on one 80 GB GPU at a stated throughput. Predictions are not measurements.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from circuits.graph import GraphLayout
from circuits.nodes import Head
from circuits.peak_memory import peak_rss, reset_peak_rss
from experiments.runtime.run_folder import write_json_atomic, write_text_atomic

from experiments.runtime import cli

GPU_PEAK_FLOPS = 989e12  # H100 SXM dense bf16 (NVIDIA's datasheet, without sparsity)
GPU_EFFICIENCY = 0.35  # assumed fraction of peak a plain forward reaches at these batch sizes
GPU_MEMORY = 80e9


@dataclass(frozen=True)
class Shape:
    """A model's shape and the sweep's sizes (see the module docstring for the letters)."""

    L: int
    H: int
    G: int
    d: int
    dh: int
    m: int
    V: int
    k: int
    T: int = 0
    S: int = 0
    B: int = 0
    bytes: int = 4  # per element: 4 for float32, 2 for bf16

    @property
    def layout(self) -> GraphLayout:
        return GraphLayout(n_layers=self.L, n_heads=self.H)

    @property
    def params(self) -> int:
        return 2 * self.V * self.d + self.L * (self.d * self.dh * (2 * self.H + 2 * self.G) + self.k * self.d * self.m)

    @property
    def f(self) -> float:
        return 2 * self.d * self.dh * (2 * self.H + 2 * self.G) + 4 * self.H * self.dh * self.T + 2 * self.k * self.d * self.m

    @property
    def f_edge(self) -> float:
        return 8 * self.d * self.dh * self.H + 4 * self.H * self.dh * self.T + 2 * self.k * self.d * self.m

    @property
    def f_end(self) -> float:
        return 2 * self.d * self.dh * self.H + 2 * self.k * self.d * self.m


def shape_of(model) -> Shape:
    cfg = model.cfg
    gated = cfg.gated_mlp if hasattr(cfg, "gated_mlp") else cfg.act_fn in ("silu", "gelu_pytorch_tanh")
    return Shape(L=cfg.n_layers, H=cfg.n_heads, G=cfg.n_key_value_heads or cfg.n_heads, d=cfg.d_model, dh=cfg.d_head,
                 m=cfg.d_mlp, V=cfg.d_vocab_out, k=3 if gated else 2, bytes=torch.finfo(cfg.dtype).bits // 8)


def patched_counts(layout: GraphLayout, edges) -> dict:
    """``edge_patch``'s sizes: Σ blocks run, edges that run any (not into the logits), edges into an MLP."""
    per_layer = 3 * layout.n_heads + 1
    receivers = torch.as_tensor(edges, dtype=torch.long).reshape(-1, 2)[:, 1]
    patched = receivers[receivers != layout.logits_backward]
    return {"edges": len(receivers), "patched_layers": patched_layers(layout, edges), "n_patched": len(patched),
            "n_mlp": int((patched % per_layer == per_layer - 1).sum())}


def patched_layers(layout: GraphLayout, edges) -> int:
    """Σ over edges of the blocks a patched forward runs: from the receiver's layer up (0 for edges into the logits)."""
    per_layer = 3 * layout.n_heads + 1
    receivers = torch.as_tensor(edges, dtype=torch.long).reshape(-1, 2)[:, 1]
    blocks = layout.n_layers - torch.div(receivers, per_layer, rounding_mode="floor")
    return int(torch.where(receivers == layout.logits_backward, 0, blocks).sum())


# ---------------------------------------------------------------------------- FLOPs and memory of each sweep
# Each takes the shape and the sweep's extra sizes (a dict) and returns FLOPs or activation bytes.


def _fwd(s: Shape, rows: float, positions: float, layers: float, per: float) -> float:
    return rows * positions * layers * per


@dataclass(frozen=True)
class Sweep:
    flops: Callable[[Shape, dict], float]
    memory: Callable[[Shape, dict], float]
    what: str


def _width(s: Shape) -> float:  # live activation elements per position in a no-grad forward (one block at a time)
    return 12 * s.d + 3 * s.m + 2 * s.H * s.T


SWEEPS: dict[str, Sweep] = {
    "forward": Sweep(
        lambda s, x: _fwd(s, s.B, s.T, s.L, s.f),
        lambda s, x: s.B * s.T * _width(s) * s.bytes,
        "one plain forward of the B prompts (no unembedding): the reference for R"),
    "path_patch": Sweep(
        lambda s, x: 2 * _fwd(s, s.B, s.T, s.L, s.f) + s.B * (s.H + 1) * s.L * (s.L + 1) / 2 * s.f_end,
        lambda s, x: s.B * s.T * _width(s) * s.bytes + s.B * (s.H + 1) * s.L * 4 * s.d * s.bytes,
        "every head and MLP to the logits (END-only fast path)"),
    "activation_patch": Sweep(
        lambda s, x: _fwd(s, s.B, s.T + s.S, s.L, s.f) + s.B * s.S * s.H * s.L * (s.L + 1) / 2 * s.f,
        lambda s, x: s.B * s.S * s.L * (2 * s.H * s.dh + s.d) * s.bytes + s.B * s.H * s.S * _width(s) * s.bytes,
        "every head's z, all positions"),
    "knockout": Sweep(
        lambda s, x: _fwd(s, s.B, s.T, s.L, s.f) + _fwd(s, x["pool"] + x["sets"] * s.B, s.S, s.L, s.f)
        + (x["sets"] + 1) * s.B * 2 * s.d * s.V,
        lambda s, x: x["pool"] * s.T * s.L * s.H * s.dh * s.bytes + x["sets"] * s.B * s.S * _width(s) * s.bytes,
        "K mean-ablation sets, top-1 correctness (pool means included)"),
    "edge_attribution": Sweep(
        lambda s, x: _fwd(s, s.B, s.T - s.S, s.L, s.f) + (3 + 2 * x["steps"]) * _fwd(s, s.B, s.S, s.L, s.f_edge)
        + 2 * s.layout.n_forward * s.layout.n_backward * s.B * s.S * s.d,
        lambda s, x: s.B * s.S * (s.L * (16 * s.d + 3 * s.H * s.d + 3 * s.m + s.H * (4 * s.dh + 3 * s.d + 2 * s.T))
                                  + 3 * (s.layout.n_forward + s.layout.n_backward) * s.d) * s.bytes,
        "EAP-IG-inputs, every edge (steps forward + input-gradient backward passes)"),
    "edge_patch": Sweep(
        lambda s, x: _fwd(s, s.B, s.T - s.S, s.L, s.f) + 2 * _fwd(s, s.B, s.S, s.L, s.f_edge)
        + s.B * s.S * x["patched_layers"] * s.f - s.B * s.S * x["n_mlp"] * (s.f - 2 * s.k * s.d * s.m)
        - s.B * (s.S - 1) * x["n_patched"] * 2 * s.k * s.d * s.m + s.B * s.S * (x["n_patched"] - x["n_mlp"]) * 2 * s.d * s.dh,
        lambda s, x: s.B * s.S * (s.layout.n_forward + s.L) * s.d * s.bytes,
        "exact patching of E edges (Σ blocks run per edge = patched_layers; the fast path runs plain blocks, MLP receivers skip attention, the last MLP runs at END only)"),
    "faithfulness_curve": Sweep(
        lambda s, x: _fwd(s, s.B, s.T - s.S, s.L, s.f) + (x["circuits"] + 1) * _fwd(s, s.B, s.S, s.L, s.f_edge)
        + 2 * x["circuits"] * s.B * s.S * s.d * s.layout.n_edges,
        lambda s, x: s.B * s.S * s.layout.n_forward * s.d * s.bytes * 2,
        "C circuits (10 points + full + empty), counterfactual ablation"),
    "af1_grid": Sweep(
        lambda s, x: _fwd(s, x["fit"] + 2 * x["eval_all"], s.T, s.L, s.f) + s.B * s.T * s.f * s.L * (s.L + 1) / 2
        + s.B * s.f * s.L * (s.L + 1) * (s.L + 2) / 6 + s.B * 2 * s.d * s.V * (s.L + 1) * (s.L + 2) / 2,
        lambda s, x: (s.B * s.T * (s.L + 1) * s.d + (s.L + 1) * s.T * s.d + s.B * s.T * _width(s)) * s.bytes,
        "the whole (L_wait, L_transfer) grid with the runner's CAMA fit"),
}


# ---------------------------------------------------------------------------- measurement


def _measure_model(args):
    """The model to time: the named one, or a random tiny one (``tiny-gpt2`` etc.) to try the script quickly."""
    from circuits.loading import load_model

    if args.model.startswith("tiny-"):
        from circuits.random_models import tiny_model

        model = tiny_model(style=args.model.removeprefix("tiny-"), n_layers=4)
    else:
        model = load_model(args.model, device=args.device)
    return model.eval()


def _sweeps(model, args) -> tuple[dict, dict, dict, Shape]:
    """Every sweep as a callable, the per-sweep extra facts for the fit, the shared state and the prompts' shape."""
    from circuits.tasks import make_dataset
    from circuits.templates import get_templates
    from patching import (activation_patch, edge_attribution, edge_patch, faithfulness_curve, knockout_correct,
                          path_patch)
    from patching.forward import shared_prefix_length
    from patching.all_for_one.search import AF1Config, AF1Runner, NoEvalPromptsError, grid_faithfulness

    template = get_templates("+", ("equation",))[0]
    data = make_dataset(model, op="+", n_prompts=args.n_prompts, template_ids=(template.id,), n_shots=2, seed=args.seed)
    tokens, cf = torch.tensor(data["tokens"]), torch.tensor(data["cf_tokens"])
    T = tokens.shape[1]
    shape = replace(shape_of(model), T=T, S=T - shared_prefix_length(tokens, cf), B=len(data))
    layout = GraphLayout.of(model)
    edges = layout.real_edge_mask.nonzero().tolist()[:: args.edge_stride]
    rng = random.Random(args.seed)
    heads = [Head(l, h) for l in range(shape.L) for h in range(shape.H)]
    sets = [rng.sample(heads, 4) for _ in range(args.knockout_sets)]
    af1_data = make_dataset(model, op="+", n_prompts=2 * args.n_prompts, template_ids=(template.id,), n_shots=2,
                            seed=args.seed + 1)
    state: dict = {"tokens": tokens}
    extra: dict = {"forward": {}, "path_patch": {}, "activation_patch": {},
                   "knockout": {"pool": args.knockout_pool, "sets": len(sets)}, "edge_attribution": {"steps": 5},
                   "edge_patch": patched_counts(layout, edges),
                   "faithfulness_curve": {"circuits": 12}}

    def af1():
        try:
            runner = AF1Runner.from_dataset(model, af1_data, AF1Config(batch_size=args.n_prompts))
        except NoEvalPromptsError:  # a random model answers nothing right
            state["af1_eval"] = 0
            return
        grid_faithfulness(runner, progress=False)
        extra["af1_grid"] = {"fit": len(af1_data) - runner.n_eval_total, "eval_all": runner.n_eval_total}
        state["af1_eval"] = runner.n_eval

    # cheap and edge sweeps first: a run cut short by its time limit still leaves them in the JSON
    runs = {
        "forward": lambda: model(tokens, stop_at_layer=shape.L),
        "path_patch": lambda: path_patch(model, data, progress=False),
        "edge_attribution": lambda: state.update(graph=edge_attribution(model, data, ig_steps=5, progress=False)),
        "faithfulness_curve": lambda: faithfulness_curve(model, state["graph"], data, n_bootstrap=200, progress=False),
        "edge_patch": lambda: edge_patch(model, edges, data, progress=False),
        "knockout": lambda: knockout_correct(model, data, sets, n_pool=args.knockout_pool),
        "af1_grid": af1,
        "activation_patch": lambda: activation_patch(model, data, component="z", progress=False),
    }
    return runs, extra, state, shape


def _measure(args) -> None:
    """Time every sweep once on the model and write the measurements (after each sweep, atomically)."""
    model = _measure_model(args)
    runs, extra, state, shape = _sweeps(model, args)
    with torch.no_grad():
        model(state["tokens"][:2], stop_at_layer=shape.L)  # warm-up
    measured, shapes = {}, {}
    for name, run in runs.items():
        if args.only and name not in args.only:
            continue
        torch.manual_seed(0)
        exact = reset_peak_rss()
        before = peak_rss(exact)
        began = time.perf_counter()
        with torch.no_grad() if name == "forward" else torch.enable_grad():
            run()
        seconds = time.perf_counter() - began
        if name == "af1_grid" and not state.get("af1_eval"):
            continue  # no evaluation prompts: nothing was measured
        measured[name] = {"seconds": seconds, "peak_rss_above_start_mb": (peak_rss(exact) - before) / 2**20,
                          "peak_exact": exact, **extra.get(name, {})}
        shapes[name] = asdict(replace(shape, B=state["af1_eval"]) if name == "af1_grid" else shape)
        print(f"{name:20s} {seconds:8.2f} s  peak +{measured[name]['peak_rss_above_start_mb']:.0f} MB", flush=True)
        write_json_atomic(args.out, {"model": args.model, "threads": torch.get_num_threads(), "shape": asdict(shape),
                                     "sweep_shapes": shapes, "measured": measured,
                                     "command": f"python -m experiments.cost_model measure --model {args.model} "
                                                f"--n-prompts {args.n_prompts}"})


# ---------------------------------------------------------------------------- fit and predictions

# Prediction settings: 32 two-shot prompts of ~30 tokens, 8 after the shared prefix, bf16.
PREDICT = {
    "Llama-2-7B": Shape(L=32, H=32, G=32, d=4096, dh=128, m=11008, V=32000, k=3, T=30, S=8, B=32, bytes=2),
    "Llama-3-8B": Shape(L=32, H=32, G=8, d=4096, dh=128, m=14336, V=128256, k=3, T=30, S=8, B=32, bytes=2),
}


def _extra_for(shape: Shape, name: str) -> dict:
    if name == "edge_patch":  # only here: listing a Llama's 1.6M edges in Python takes seconds
        layout = shape.layout
        return patched_counts(layout, layout.real_edge_mask.nonzero())
    return {"knockout": {"pool": 512, "sets": 32}, "edge_attribution": {"steps": 5},
            "faithfulness_curve": {"circuits": 12},
            "af1_grid": {"fit": shape.B, "eval_all": shape.B}}.get(name, {})


def _fit(args) -> None:
    runs = [json.loads(Path(p).read_text()) for p in args.files]
    for r in runs:  # each run's own effective FLOP/s: the machine's load varies between runs
        r["rate"] = SWEEPS["forward"].flops(Shape(**r["shape"]), {}) / r["measured"]["forward"]["seconds"]
    alphas, table = {}, []
    for name, sweep in SWEEPS.items():
        ratios = []
        for r in runs:
            if name not in r["measured"]:
                continue
            s = Shape(**r["sweep_shapes"][name])
            ratios.append(r["measured"][name]["seconds"] / (sweep.flops(s, r["measured"][name]) / r["rate"]))
        if ratios:
            alphas[name] = math.exp(sum(map(math.log, ratios)) / len(ratios))
    for r in runs:
        for name, sweep in SWEEPS.items():
            if name not in r["measured"] or name not in alphas:
                continue
            m = r["measured"][name]
            s = Shape(**r["sweep_shapes"][name])
            table.append({"model": r["model"], "sweep": name, "measured_s": m["seconds"],
                          "B": s.B, "predicted_s": alphas[name] * sweep.flops(s, m) / r["rate"],
                          "measured_peak_mb": m["peak_rss_above_start_mb"],
                          "predicted_mem_mb": sweep.memory(s, m) / 2**20, "gflops": sweep.flops(s, m) / 1e9})
    gpu_rate = GPU_PEAK_FLOPS * GPU_EFFICIENCY
    predictions = []
    for model_name, s in PREDICT.items():
        for name, sweep in SWEEPS.items():
            x = _extra_for(s, name)
            predictions.append({"model": model_name, "sweep": name, "tflops": sweep.flops(s, x) / 1e12,
                                "predicted_s": alphas.get(name, 1.0) * sweep.flops(s, x) / gpu_rate,
                                "activation_gb_unchunked": sweep.memory(s, x) / 1e9,
                                "weights_gb": s.params * s.bytes / 1e9, **x})
    out = {"alphas": alphas, "cpu_flops_per_s": {f"{r['model']} B={r['shape']['B']}": r["rate"] for r in runs}, "table": table, "gpu_assumed_flops_per_s": gpu_rate,
           "predictions": predictions, "prediction_shapes": {k: asdict(v) for k, v in PREDICT.items()}}
    write_json_atomic(args.out, out)
    print(f"{'model':14s} {'B':>3s} {'sweep':20s} {'meas s':>8s} {'pred s':>8s} {'meas MB':>8s} {'pred MB':>8s}")
    for row in table:
        print(f"{row['model']:14s} {row['B']:3d} {row['sweep']:20s} {row['measured_s']:8.2f} {row['predicted_s']:8.2f} "
              f"{row['measured_peak_mb']:8.0f} {row['predicted_mem_mb']:8.0f}")
    print("alphas:", {k: round(v, 2) for k, v in alphas.items()})
    if args.markdown:
        write_text_atomic(args.markdown, _markdown(out))
    for p in predictions:
        print(f"{p['model']:12s} {p['sweep']:20s} {p['tflops']:10.1f} TFLOP {p['predicted_s']:9.1f} s "
              f"act {p['activation_gb_unchunked']:7.2f} GB")


def _markdown(fit: dict) -> str:
    """The calibration and prediction tables of docs/gpu.md."""
    lines = ["| model | B | sweep | GFLOP | measured s | predicted s | measured peak MB | predicted MB |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['B']} | {r['sweep']} | {r['gflops']:.1f} | {r['measured_s']:.2f} | {r['predicted_s']:.2f} "
              f"| {r['measured_peak_mb']:.0f} | {r['predicted_mem_mb']:.0f} |" for r in fit["table"]]
    lines += ["", "| sweep | α | " + " | ".join(f"{m} TFLOP | {m} time | {m} activations GB" for m in PREDICT) + " |",
              "|---|---|" + "---|---|---|" * len(PREDICT)]
    by = {(p["model"], p["sweep"]): p for p in fit["predictions"]}
    for name in SWEEPS:
        cells = []
        for m in PREDICT:
            p = by[(m, name)]
            t = p["predicted_s"]
            cells.append(f"{p['tflops']:.1f} | {t:.2g} s" if t < 120 else f"{p['tflops']:.1f} | {t / 60:.0f} min")
            cells[-1] += f" | {p['activation_gb_unchunked']:.1f}"
        alpha = fit["alphas"].get(name)
        lines.append(f"| {name} | {'1 (not fitted)' if alpha is None else f'{alpha:.2f}'} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


parser = cli.make_parser("cost_model", __doc__)
_commands = parser.add_subparsers(dest="command", required=True)
_measure_parser = _commands.add_parser("measure", help="time every sweep on one model")
_measure_parser.add_argument("--model", default="gemma-3-270m", help="model name for circuits.loading.load_model")
_measure_parser.add_argument("--device", default=None, help="torch device (default: the model loader's choice)")
_measure_parser.add_argument("--n-prompts", type=int, default=8, help="prompts per sweep")
_measure_parser.add_argument("--edge-stride", type=int, default=25, help="patch every n-th edge")
_measure_parser.add_argument("--knockout-sets", type=int, default=8, help="random knockout sets")
_measure_parser.add_argument("--knockout-pool", type=int, default=64, help="pool prompts for the knockout means")
_measure_parser.add_argument("--only", nargs="*", default=None, help="sweeps to run (default: all)")
_measure_parser.add_argument("--seed", type=int, default=0, help="data and sampling seed")
_measure_parser.add_argument("--out", required=True, help="JSON file to write (after every sweep)")
_fit_parser = _commands.add_parser("fit", help="fit the constants on measure outputs and predict the Llama models")
_fit_parser.add_argument("files", nargs="*", help="measure outputs (none: predict with α = 1, the FLOP-bound time)")
_fit_parser.add_argument("--out", required=True, help="JSON file to write")
_fit_parser.add_argument("--markdown", default=None, help="also write the tables for docs/gpu.md here")


def main(argv: list[str] | None = None) -> None:
    args = parser.parse_args(argv)
    (_measure if args.command == "measure" else _fit)(args)


if __name__ == "__main__":
    cli.run_cli(main, "cost_model")
