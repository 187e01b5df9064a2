"""Linearity analysis: how far is a submodule (or the model) from linear in its task vectors?

Dai et al. (ICLR 2025) motivate submodule merging by measuring that submodules
are much more linear than the whole model. For an interpolation
``θ(α) = θ0 + Σ_i α_i τ_i`` and a submodule ``f_m``:

    Δ(x)       = f_m(x; θ(α)) − f_m(x; θ0)        (what the interpolation does)
    Σα_iδ_i(x) = Σ_i α_i (f_m(x; θ_i) − f_m(x; θ0))  (what linearity predicts)
    score      = E_x ‖Δ(x) − Σ_i α_i δ_i(x)‖ / ‖Δ(x)‖

0 means exactly linear. Choices of this reference version:

* the norm is taken per prompt ``x`` over all its real token positions and
  features (``d_model``, or ``d_vocab`` for the model), then averaged over the
  prompts of all tasks (a per-position ratio is dominated by positions where
  ``Δ`` is tiny); prompts with ``Δ = 0`` are skipped;
* only the submodule's own parameters are interpolated (the rest stay at θ0),
  on inputs cached from the base (``inputs_from="base"``, default: the
  interpolation is a path out of the base) or from expert ``t`` on task ``t``;
* the whole-model score uses the logits at every position with every
  parameter interpolated;
* submodules follow :func:`merging.submodule.plan_layer` (``"layer"``,
  ``"attn_mlp"``, ``"head"``; per-layer specs allowed).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.arguments import check_option
from merging import blocks
from merging.state_dicts import SourceLike, as_sources, check_compatible, combine_experts
from merging.submodule import InputsFrom, LayerLevel, LevelSpec, block_params, cache_task_inputs, full_params, level_of, plan_layer

KIND_LABELS = {"layer": "layer", "attn": "attention", "mlp": "MLP", "heads": "head", "model": "model"}


@dataclass(frozen=True)
class LinearityConfig:
    """Which submodules to score, on which inputs, with how much data."""

    level: LayerLevel = "attn_mlp"
    inputs_from: InputsFrom = "base"
    n_samples: int = 30
    batch_size: int = 8
    include_model: bool = True

    def __post_init__(self):
        check_option("LinearityConfig.level", self.level, LayerLevel)
        check_option("LinearityConfig.inputs_from", self.inputs_from, InputsFrom)


@dataclass
class LinearityResult:
    """One record per (α, submodule): ``{"alpha", "submodule", "kind", "layer", "score"}``."""

    records: list[dict]

    def scores(self, kind: str | None = None) -> list[float]:
        """All scores, or those of one kind (``"layer"``, ``"attn"``, ``"mlp"``, ``"heads"``, ``"model"``)."""
        return [r["score"] for r in self.records if kind is None or r["kind"] == kind]


def alpha_grid(n_experts: int, values: Sequence[float] = (0.25, 0.5, 0.75, 1.0)) -> list[tuple[float, ...]]:
    """Every combination of ``values`` over ``n_experts`` (the all-zero point left out)."""
    return [a for a in itertools.product(values, repeat=n_experts) if any(v != 0 for v in a)]


def _per_sample(delta: Tensor, linear: Tensor, mask: Tensor) -> list[float]:
    """``‖Δ − lin‖ / ‖Δ‖`` per prompt over masked positions and features (NaN where ``Δ = 0``)."""
    d, r = delta.double() * mask, (delta.double() - linear.double()) * mask
    num, den = r.flatten(1).norm(dim=1), d.flatten(1).norm(dim=1)
    return [float(a / b) if b > 0 else float("nan") for a, b in zip(num, den)]


def _interpolate(theta0: dict, thetas: Sequence[dict], alpha: Sequence[float], names) -> dict:
    return {k: combine_experts(theta0[k], [th[k] for th in thetas], alpha) for k in names}


def nonlinearity_scores(
    model: HookedTransformer,
    experts: Sequence[SourceLike],
    tasks: Sequence,
    alphas: Sequence[Sequence[float]],
    config: LinearityConfig = LinearityConfig(),
    *,
    levels: LevelSpec | None = None,
    attention_masks: Sequence | None = None,
    progress: bool = True,
) -> LinearityResult:
    """Non-linearity score of every submodule (and the model) for each interpolation in ``alphas``.

    ``model`` holds θ0; ``tasks`` are token data as in :func:`merging.merge_submodules`
    (one task per expert when ``inputs_from="expert"``; any number otherwise).
    """
    base, sources = as_sources(model, experts)
    check_compatible(base, sources)
    n = len(sources)
    for a in alphas:
        if len(a) != n:
            raise InputError(f"Interpolation {tuple(a)} has {len(a)} coefficients for {n} experts.")
    if config.inputs_from == "expert" and len(tasks) != n:
        raise InputError(f"inputs_from='expert' needs one task per expert: {len(tasks)} tasks, {n} experts.")
    device, dtype = model.cfg.device, next(model.parameters()).dtype
    masks = attention_masks if attention_masks is not None else [None] * len(tasks)
    task_batches = [
        blocks.batches(model, t, m, n_samples=config.n_samples, batch_size=config.batch_size)
        for t, m in zip(tasks, masks)
    ]
    spec = levels if levels is not None else config.level
    plans = [plan_layer(model, layer, level_of(spec, layer, config.level)) for layer in range(model.cfg.n_layers)]
    hooks = sorted({blocks.input_hook(model, s.layer, s.kind) for plan in plans for s in plan})
    inputs = cache_task_inputs(model, sources, task_batches, hooks, config.inputs_from, dtype, progress)

    samples: dict[tuple[int, str], list[float]] = {}
    meta: dict[str, tuple[str, int | None]] = {}
    for layer, plan in enumerate(tqdm(plans, desc="linearity", disable=not progress)):
        theta0 = block_params(base, layer, device, dtype)
        thetas = [block_params(s, layer, device, dtype) for s in sources]
        for kind in dict.fromkeys(s.kind for s in plan):
            swap = blocks.kind_param_names(model, layer, kind)
            hook = blocks.input_hook(model, layer, kind)
            merged = [{**theta0, **_interpolate(theta0, thetas, a, swap)} for a in alphas]
            for t, chunks in enumerate(task_batches):
                for (tok, m), cache in zip(chunks, inputs[t]):
                    mask = blocks.position_mask(tok, m)
                    x = cache[hook]
                    with torch.no_grad():
                        y0 = blocks.submodule_output(model, layer, kind, theta0, x, m)
                        deltas = [
                            blocks.submodule_output(model, layer, kind, {**theta0, **{k: th[k] for k in swap}}, x, m) - y0
                            for th in thetas
                        ]
                        for ai, (a, params) in enumerate(zip(alphas, merged)):
                            big = blocks.submodule_output(model, layer, kind, params, x, m) - y0
                            lin = sum(c * d for c, d in zip(a, deltas))
                            for s in (s for s in plan if s.kind == kind):
                                sl = (lambda v: v) if s.head is None else (lambda v, h=s.head: v[:, :, h])
                                samples.setdefault((ai, s.name), []).extend(_per_sample(sl(big), sl(lin), mask))
                                meta[s.name] = ("heads" if s.head is not None else s.kind, layer)
    if config.include_model:
        _model_scores(model, base, sources, task_batches, alphas, samples, meta, progress)
    records = []
    for (ai, name), vals in samples.items():
        finite = [v for v in vals if v == v]
        kind, layer = meta[name]
        score = sum(finite) / len(finite) if finite else float("nan")
        records.append({"alpha": list(alphas[ai]), "submodule": name, "kind": kind, "layer": layer, "score": score})
    return LinearityResult(records)


def _model_scores(model, base, sources, task_batches, alphas, samples, meta, progress) -> None:
    """Whole-model scores from the logits, every parameter interpolated.

    The interpolated model is built once per α; base and expert logits are
    recomputed per chunk (forward passes are cheaper than storing every
    chunk's ``[batch, pos, d_vocab]`` logits per expert, or re-interpolating).
    """
    device, dtype = model.cfg.device, next(model.parameters()).dtype
    keys = base.param_keys()
    meta["model"] = ("model", None)
    chunks = [c for task in task_batches for c in task]
    with torch.no_grad():
        for ai, a in enumerate(tqdm(alphas, desc="model linearity", disable=not progress)):
            params = {k: combine_experts(base.get(k).to(device=device, dtype=dtype),
                                         [s.get(k).to(device=device, dtype=dtype) for s in sources], a) for k in keys}
            for tok, m in chunks:
                y0 = blocks.logits(model, tok, m)
                big = blocks.logits(model, tok, m, params) - y0
                lin = sum(ca * (blocks.logits(model, tok, m, full_params(s, device, dtype)) - y0)
                          for ca, s in zip(a, sources))
                samples.setdefault((ai, "model"), []).extend(_per_sample(big, lin, blocks.position_mask(tok, m)))
            del params


def nonlinearity_figure(result: LinearityResult, title: str = "Non-linearity of submodules vs the model") -> go.Figure:
    """Box plot of scores per submodule kind (all submodules and interpolations), model last, log scale."""
    fig = go.Figure()
    order = [k for k in ("layer", "attn", "mlp", "heads", "model") if result.scores(k)]
    for kind in order:
        recs = [r for r in result.records if r["kind"] == kind and r["score"] == r["score"]]
        fig.add_trace(
            go.Box(
                y=[r["score"] for r in recs],
                name=KIND_LABELS[kind],
                boxpoints="all",
                jitter=0.4,
                text=[f"{r['submodule']} α={r['alpha']}" for r in recs],
                hovertemplate="%{text}: %{y:.3g}<extra></extra>",
            )
        )
    fig.update_layout(
        title=title,
        yaxis_title="non-linearity score  E‖Δ − Σα_iδ_i‖ / ‖Δ‖",
        yaxis_type="log",
        showlegend=False,
    )
    return fig
