"""Cost model of the sweeps: FLOPs and memory as functions of the model's shape and the prompts, calibrated here.

    python -m experiments.cost_model measure --model gemma-3-270m --out runs/cost/gemma
    python -m experiments.cost_model measure --model smollm2-135m --out runs/cost/smollm2
    python -m experiments.cost_model fit runs/cost/gemma runs/cost/smollm2 --out runs/cost/fit

Shape: L layers, H query heads, G key/value heads, d width, d_h head width, m MLP width (k = 3
matrices for gated MLPs, 2 otherwise), V vocabulary; T prompt tokens, of which S are after the
shared prefix of reference and counterfactual (the sweeps run only those) and the first P of which
every prompt shares (few-shot lines, run once by path patching), B prompts; the edge
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

``--out`` is a run folder, as for every experiment (default ``runs/cost_model-<measure|fit>-<timestamp>``):
``measure`` writes ``<out>/results.json`` after every sweep (status ``running``, then ``complete`` or
``failed: <sweep>: <why>``), so a run cut short still holds the sweeps it finished; ``fit`` reads such
folders (or their results.json, or a measurement file of an earlier version) and writes its fit and
predictions to ``<out>/results.json``. ``--model tiny-gpt2`` (``tiny-llama``, ``tiny-gemma``, ...) times
a random tiny model, to try the script in seconds. ``python -m experiments.cost_model measure --help``
and ``... fit --help`` list each command's flags.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from circuits.errors import InputError
from circuits.peak_memory import peak_rss, reset_peak_rss
from experiments.runtime.run_folder import RESULTS_FILE, RUN_MARKER
from circuits.atomic_files import write_text_atomic

from experiments.runtime import ModelLoader, Run, RunSettings, cli, option, run_experiment
from experiments.runtime.cli import override

if TYPE_CHECKING:  # the library loads torch: imported where used, so --help answers before it loads
    from circuits.graph import GraphLayout

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
    P: int = 0  # leading positions every prompt shares (few-shot lines), run once by path patching
    bytes: int = 4  # per element: 4 for float32, 2 for bf16

    @property
    def layout(self) -> GraphLayout:
        from circuits.graph import GraphLayout

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


def batch_prefix(tokens) -> int:
    """``P``: the positions every prompt of the batch shares, as :func:`circuits.prefix_cache.run_after_shared_prefix`
    runs them once (0 where it would not: fewer than its minimum, or one prompt)."""
    from circuits.prefix_cache import MIN_SHARED_PREFIX, batch_common_prefix_length

    shared = batch_common_prefix_length(tokens) if tokens.shape[0] > 1 else 0
    return shared if shared >= MIN_SHARED_PREFIX else 0


def shape_of(model) -> Shape:
    import torch

    cfg = model.cfg
    gated = cfg.gated_mlp if hasattr(cfg, "gated_mlp") else cfg.act_fn in ("silu", "gelu_pytorch_tanh")
    return Shape(L=cfg.n_layers, H=cfg.n_heads, G=cfg.n_key_value_heads or cfg.n_heads, d=cfg.d_model, dh=cfg.d_head,
                 m=cfg.d_mlp, V=cfg.d_vocab_out, k=3 if gated else 2, bytes=torch.finfo(cfg.dtype).bits // 8)


def patched_counts(layout: GraphLayout, edges) -> dict:
    """``edge_patch``'s sizes: Σ blocks run, edges that run any (not into the logits), edges into an MLP."""
    import torch

    per_layer = 3 * layout.n_heads + 1
    receivers = torch.as_tensor(edges, dtype=torch.long).reshape(-1, 2)[:, 1]
    patched = receivers[receivers != layout.logits_backward]
    return {"edges": len(receivers), "patched_layers": patched_layers(layout, edges), "n_patched": len(patched),
            "n_mlp": int((patched % per_layer == per_layer - 1).sum())}


def patched_layers(layout: GraphLayout, edges) -> int:
    """Σ over edges of the blocks a patched forward runs: from the receiver's layer up (0 for edges into the logits)."""
    import torch

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
        # the few-shot lines once (the counterfactuals share them: the model's prefix cache has them), the rest per row
        lambda s, x: _fwd(s, 1, s.P, s.L, s.f - 4 * s.H * s.dh * (s.T - s.P)) + 2 * _fwd(s, s.B, s.T - s.P, s.L, s.f)
        + s.B * (s.H + 1) * s.L * (s.L + 1) / 2 * s.f_end,
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


@dataclass(frozen=True)
class MeasureConfig(RunSettings):
    """The flags of ``python -m experiments.cost_model measure`` beyond :class:`RunSettings`, with their defaults."""

    n_prompts: int = option(8, "prompts per sweep", type=cli.positive_int)
    edge_stride: int = option(25, "patch every n-th edge", type=cli.positive_int)
    knockout_sets: int = option(8, "random knockout sets", type=cli.positive_int)
    knockout_pool: int = option(64, "pool prompts for the knockout means", type=cli.positive_int)
    only: tuple[str, ...] | None = option(None, "sweeps to run (default: all)", choices=tuple(SWEEPS), nargs="*")


def _measure_model(run: Run):
    """The model to time: the named one, or a random tiny one (``tiny-gpt2`` etc.) to try the script quickly."""
    name = run.cfg.model
    if not name.startswith("tiny-"):
        return run.load_model().eval()
    from circuits.random_models import tiny_model

    with run.stage("load model", f"building a random {name}"):
        return tiny_model(style=name.removeprefix("tiny-"), n_layers=4).eval()


def _sweeps(model, cfg: MeasureConfig) -> tuple[dict, dict, dict, Shape]:
    """Every sweep as a callable, the per-sweep extra facts for the fit, the shared state and the prompts' shape."""
    import torch

    from circuits.graph import GraphLayout
    from circuits import Head
    from circuits.seeds import derived_seed
    from circuits.tasks import make_dataset
    from circuits.templates import get_templates
    from patching import SweepOptions, activation_patch, path_patch
    from patching.edges import edge_attribution, edge_patch, faithfulness_curve
    from patching.node_level.knockout_curves import knockout_correct
    from patching.sweeps.forward import shared_prefix_length
    from patching.all_for_one import AF1Runner
    from patching.all_for_one.runner import NoEvalPromptsError
    from patching.all_for_one.search import grid_faithfulness

    template = get_templates("+", ("equation",))[0]
    data = make_dataset(model, op="+", n_prompts=cfg.n_prompts, template_ids=(template.id,), n_shots=2, seed=cfg.seed)
    tokens, cf = torch.tensor(data["tokens"]), torch.tensor(data["cf_tokens"])
    T = tokens.shape[1]
    shape = replace(shape_of(model), T=T, S=T - shared_prefix_length(tokens, cf), B=len(data), P=batch_prefix(tokens))
    layout = GraphLayout.of(model)
    edges = layout.real_edge_mask.nonzero().tolist()[:: cfg.edge_stride]
    rng = random.Random(cfg.seed)
    heads = [Head(l, h) for l in range(shape.L) for h in range(shape.H)]
    sets = [rng.sample(heads, 4) for _ in range(cfg.knockout_sets)]
    af1_data = make_dataset(model, op="+", n_prompts=2 * cfg.n_prompts, template_ids=(template.id,), n_shots=2,
                            seed=derived_seed(cfg.seed, "af1 prompts"))
    state: dict = {"tokens": tokens}
    extra: dict = {"forward": {}, "path_patch": {}, "activation_patch": {},
                   "knockout": {"pool": cfg.knockout_pool, "sets": len(sets)}, "edge_attribution": {"steps": 5},
                   "edge_patch": patched_counts(layout, edges),
                   "faithfulness_curve": {"circuits": 12}}

    def af1():
        try:
            runner = AF1Runner.from_dataset(model, af1_data,
                                            options=SweepOptions(batch_size=cfg.n_prompts, progress=False))
        except NoEvalPromptsError:  # a random model answers nothing right
            state["af1_eval"] = 0
            return
        grid_faithfulness(runner)
        extra["af1_grid"] = {"fit": len(af1_data) - runner.n_eval_total, "eval_all": runner.n_eval_total}
        state["af1_eval"] = runner.n_eval

    # cheap and edge sweeps first: a run cut short by its time limit still leaves them in the JSON
    runs = {
        "forward": lambda: model(tokens, stop_at_layer=shape.L),
        "path_patch": lambda: path_patch(model, data, options=SweepOptions(progress=False)),
        "edge_attribution": lambda: state.update(graph=edge_attribution(model, data, ig_steps=5,
                                                                        options=SweepOptions(progress=False))),
        "faithfulness_curve": lambda: faithfulness_curve(model, state["graph"], data, n_bootstrap=200,
                                                         options=SweepOptions(progress=False)),
        "edge_patch": lambda: edge_patch(model, edges, data, options=SweepOptions(progress=False)),
        "knockout": lambda: knockout_correct(model, data, sets, n_pool=cfg.knockout_pool),
        "af1_grid": af1,
        "activation_patch": lambda: activation_patch(model, data, component="z", options=SweepOptions(progress=False)),
    }
    return runs, extra, state, shape


def _measure(run: Run) -> None:
    """Time every sweep once on the model; results.json is saved after each sweep (atomically)."""
    import torch

    cfg, results = run.cfg, run.results
    model = _measure_model(run)
    with run.stage("prompts"):
        runs, extra, state, shape = _sweeps(model, cfg)
        with torch.no_grad():
            model(state["tokens"][:2], stop_at_layer=shape.L)  # warm-up
    measured, shapes = {}, {}
    results |= {"model": cfg.model, "threads": torch.get_num_threads(), "shape": asdict(shape),
                "sweep_shapes": shapes, "measured": measured,
                "command": f"python -m experiments.cost_model measure --model {cfg.model} --n-prompts {cfg.n_prompts}"}
    for name, sweep in runs.items():
        if cfg.only and name not in cfg.only:
            continue
        with run.stage(name):
            torch.manual_seed(cfg.seed)  # each sweep draws the same numbers whichever ran before it (--only)
            exact = reset_peak_rss()
            before = peak_rss(exact)
            began = time.perf_counter()
            with torch.no_grad() if name == "forward" else torch.enable_grad():
                sweep()
            seconds = time.perf_counter() - began
            if name == "af1_grid" and not state.get("af1_eval"):
                continue  # no evaluation prompts: nothing was measured
            measured[name] = {"seconds": seconds, "peak_rss_above_start_mb": (peak_rss(exact) - before) / 2**20,
                              "peak_exact": exact, **extra.get(name, {})}
            shapes[name] = asdict(replace(shape, B=state["af1_eval"]) if name == "af1_grid" else shape)
        print(f"{name:20s} {seconds:8.2f} s  peak +{measured[name]['peak_rss_above_start_mb']:.0f} MB", flush=True)
    print(f"wrote {run.out / RESULTS_FILE}")


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


@dataclass(frozen=True)
class FitConfig:
    """The flags of ``python -m experiments.cost_model fit`` (``files``: its arguments).

    ``fit`` loads no model and draws nothing at random, so of :class:`RunSettings` it takes the run folder's flags
    only; ``threads`` and ``seed`` are there for the run lifecycle, which sets both, and are no flags.
    """

    files: tuple[str, ...] = ()  # the positional arguments: measure run folders (or their results.json)
    markdown: str | None = option(None, "also write the tables for docs/gpu.md to this file (an existing file is "
                                        "replaced only with --overwrite)")
    out: str | None = override(RunSettings, "out", None)
    overwrite: bool = override(RunSettings, "overwrite", False)
    threads: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.markdown:
            check_markdown_path(self.markdown, self.out, overwrite=self.overwrite)


def check_markdown_path(markdown: str, out: str | None, *, overwrite: bool) -> None:
    """Refuse, before any work, a ``--markdown`` the fit could not write or would lose: a folder, an existing file
    without ``--overwrite``, a file the run itself writes into ``--out`` (results.json, the run marker, ``--out``
    itself), or one in a folder that cannot be made or written."""
    path = Path(markdown)
    if path.is_dir():
        raise InputError(f"--markdown {markdown} is a folder; give the path of a file to write the tables to "
                         f"(e.g. {path / 'gpu_tables.md'}).")
    if out is not None:
        run_dir, target = Path(out).resolve(), path.resolve()
        if target == run_dir:
            raise InputError(f"--markdown {markdown} is the --out folder itself; give the path of a file to write "
                             f"the tables to (e.g. {Path(out) / 'gpu_tables.md'}).")
        if target in (run_dir / RESULTS_FILE, run_dir / RUN_MARKER):
            raise InputError(f"--markdown {markdown} is {target.name} of --out {out}, which the run writes itself "
                             "after the tables, so they would be overwritten; name another file "
                             f"(e.g. {Path(out) / 'gpu_tables.md'}).")
    if path.exists() and not overwrite:
        raise InputError(f"--markdown {markdown} already exists; pass --overwrite to replace it, or name "
                         "another file.")
    folder = path.absolute().parent
    while not folder.exists() and folder != folder.parent:  # missing folders are made when the tables are written
        folder = folder.parent
    if not folder.is_dir():
        raise InputError(f"--markdown {markdown} cannot be written: {folder} is a file, not a folder. Choose a "
                         "path in a folder you can write.")
    try:  # the only sure test of "can a file be made here" (root passes os.access; /proc refuses new files)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".markdown-probe-", suffix=".tmp")
    except OSError as err:
        raise InputError(f"--markdown {markdown} cannot be written: {err.strerror or err} ({folder}). Choose a "
                         "path in a folder you can write.") from None
    os.close(fd)
    os.unlink(probe)


MEASUREMENT_HINT = "Pass the run folders (or their results.json) that `python -m experiments.cost_model measure` writes."


def load_measurement(path: str | Path) -> dict:
    """The measurements in a ``measure`` run folder (or its results.json, or an earlier version's JSON file).

    Raises :class:`circuits.errors.InputError`, naming the file, when it is missing, not JSON, or not a
    measurement the fit can use (the plain forward, which gives the machine's FLOP/s, must be in it).
    """
    path = Path(path)
    file = path / RESULTS_FILE if path.is_dir() else path

    def bad(why: str) -> InputError:
        return InputError(f"{file}: {' '.join(why.split())}\n{MEASUREMENT_HINT}")

    try:
        r = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise bad("no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise bad(f"cannot be read ({err})") from None
    except (ValueError, RecursionError) as err:  # RecursionError: JSON nested deeper than the parser follows
        raise bad(f"is not JSON ({err})") from None
    if not isinstance(r, dict) or not isinstance(r.get("model"), str) \
            or not all(isinstance(r.get(k), dict) for k in ("shape", "sweep_shapes", "measured")):
        raise bad("is not a cost_model measurement (it needs model, shape, sweep_shapes and measured)")
    if "forward" not in r["measured"]:
        raise bad("has no measurement of the plain forward, which gives the machine's FLOP/s for every other sweep "
                  "(measure it: leave --only out, or name forward in it)")
    name = "shape"
    try:
        Shape(**r["shape"])
        for name, m in r["measured"].items():
            if name in SWEEPS:
                s = Shape(**r["sweep_shapes"][name])
                float(m["seconds"]), float(m["peak_rss_above_start_mb"])
                SWEEPS[name].flops(s, m), SWEEPS[name].memory(s, m)
        name = "forward"
        rate = SWEEPS["forward"].flops(Shape(**r["shape"]), {}) / r["measured"]["forward"]["seconds"]
    except KeyError as err:
        raise bad(f"its {name} measurement has no {err} entry") from None
    except (TypeError, ValueError, AttributeError, ZeroDivisionError) as err:
        raise bad(f"its {name} measurement is malformed ({type(err).__name__}: {err})") from None
    if not rate > 0:
        raise bad("its forward measurement gives no FLOP/s (zero FLOPs or a time <= 0)")
    return r


def fit_and_predict(runs: list[dict]) -> dict:
    """One α per sweep from the measurements ``runs`` (:func:`load_measurement`), the table of predicted against
    measured time and memory, and the predictions for :data:`PREDICT` on one GPU: results.json of ``fit``."""
    # each run's own effective FLOP/s: the machine's load varies between runs
    rates = [SWEEPS["forward"].flops(Shape(**r["shape"]), {}) / r["measured"]["forward"]["seconds"] for r in runs]
    alphas, table = {}, []
    for name, sweep in SWEEPS.items():
        ratios = []
        for r, rate in zip(runs, rates):
            if name not in r["measured"]:
                continue
            s = Shape(**r["sweep_shapes"][name])
            ratios.append(r["measured"][name]["seconds"] / (sweep.flops(s, r["measured"][name]) / rate))
        if ratios:
            alphas[name] = math.exp(sum(map(math.log, ratios)) / len(ratios))
    for r, rate in zip(runs, rates):
        for name, sweep in SWEEPS.items():
            if name not in r["measured"] or name not in alphas:
                continue
            m = r["measured"][name]
            s = Shape(**r["sweep_shapes"][name])
            table.append({"model": r["model"], "sweep": name, "measured_s": m["seconds"],
                          "B": s.B, "predicted_s": alphas[name] * sweep.flops(s, m) / rate,
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
    return {"alphas": alphas, "cpu_flops_per_s": {f"{r['model']} B={r['shape']['B']}": rate for r, rate in zip(runs, rates)},
            "table": table, "gpu_assumed_flops_per_s": gpu_rate,
            "predictions": predictions, "prediction_shapes": {k: asdict(v) for k, v in PREDICT.items()}}


def _fit(run: Run, runs: list[dict]) -> None:
    """Fit, predict, print the tables; ``--markdown``: also the tables of docs/gpu.md."""
    cfg, results = run.cfg, run.results
    with run.stage("fit and predictions"):
        fit = fit_and_predict(runs)
        results |= fit
    print(f"{'model':14s} {'B':>3s} {'sweep':20s} {'meas s':>8s} {'pred s':>8s} {'meas MB':>8s} {'pred MB':>8s}")
    for row in fit["table"]:
        print(f"{row['model']:14s} {row['B']:3d} {row['sweep']:20s} {row['measured_s']:8.2f} {row['predicted_s']:8.2f} "
              f"{row['measured_peak_mb']:8.0f} {row['predicted_mem_mb']:8.0f}")
    print("alphas:", {k: round(v, 2) for k, v in fit["alphas"].items()})
    if cfg.markdown:
        with run.stage("markdown"):
            write_text_atomic(cfg.markdown, _markdown(fit))
    for p in fit["predictions"]:
        print(f"{p['model']:12s} {p['sweep']:20s} {p['tflops']:10.1f} TFLOP {p['predicted_s']:9.1f} s "
              f"act {p['activation_gb_unchunked']:7.2f} GB")
    print(f"wrote {run.out / RESULTS_FILE}")


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


# ---------------------------------------------------------------------------- command line

#: command -> (its config, what it does)
COMMANDS = {"measure": (MeasureConfig, "time every sweep on one model"),
            "fit": (FitConfig, "fit the constants on measure outputs and predict the Llama models")}

parser = cli.make_parser("cost_model", __doc__)
_commands = parser.add_subparsers(dest="command", required=True, metavar="{measure,fit}")
for _name, (_config, _what) in COMMANDS.items():
    _sub = _commands.add_parser(_name, help=_what, description=_what, formatter_class=parser.formatter_class)
    _sub.add_argument(cli.DEBUG_FLAG, action="store_true", help="show the full traceback of an error")
    if _config is FitConfig:
        _sub.add_argument("files", nargs="*", metavar="MEASUREMENT",
                          help="measure run folders or their results.json (none: predict with α = 1, the FLOP-bound "
                               "time)")
    cli.add_config_flags(_sub, _config)


def parse_config(argv: list[str] | None = None) -> MeasureConfig | FitConfig:
    """The config of the command in ``argv`` (default: ``sys.argv``): a :class:`MeasureConfig` or a :class:`FitConfig`."""
    return cli.parse_config(parser, lambda command, **fields: COMMANDS[command][0](**fields), argv)


def run(cfg: MeasureConfig | FitConfig, *, loader: ModelLoader | None = None) -> dict:
    """``measure`` or ``fit`` (by the config's type) in its run folder; returns the results that results.json holds."""
    if isinstance(cfg, FitConfig):
        runs = [load_measurement(p) for p in cfg.files]  # a bad input file: one line, before any folder is made
        stages, command = (lambda run: _fit(run, runs)), "fit"
    else:
        stages, command = _measure, "measure"
    return run_experiment("cost_model", cfg, stages, loader=loader, default_out=f"cost_model-{command}",
                          plan=plan(cfg))


#: the sweeps in the order ``measure`` times them (cheap and edge sweeps first, as :func:`_sweeps` lists them)
MEASURE_ORDER = ("forward", "path_patch", "edge_attribution", "faithfulness_curve", "edge_patch", "knockout",
                 "af1_grid", "activation_patch")


def plan(cfg: MeasureConfig | FitConfig) -> list[str]:
    """The stages a ``measure`` or ``fit`` with these settings goes through, in order (their names as in results.json
    ``seconds``): one per sweep timed (``--only``: those), or the fit (and ``--markdown``'s tables)."""
    if isinstance(cfg, FitConfig):
        return ["fit and predictions", *(["markdown"] if cfg.markdown else [])]
    return ["load model", "prompts", *[name for name in MEASURE_ORDER if not cfg.only or name in cfg.only]]


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Run ``measure`` or ``fit`` with command-line arguments ``argv`` (default: ``sys.argv``)."""
    return run(parse_config(argv), loader=loader)


if __name__ == "__main__":
    cli.run_cli(main, "cost_model")
