"""Submodule closed-form merging (Dai et al., "Leveraging Submodule Linearity Enhances
Task Arithmetic Performance in LLMs", ICLR 2025).

The premise: a submodule ``m`` (a block, an attention, an MLP, a head) is close to
linear in its parameters around the base, so with task vectors ``τ_i`` the merged
submodule's output change is ``≈ Σ_i α_i δ_i(x)`` with
``δ_i(x) = f_m(x; θ_i) − f_m(x; θ0)``. Ask it to reproduce, on task ``t``'s data,
what expert ``t`` does there: minimise ``Σ_t Σ_x ‖Σ_i α_i δ_i(x) − δ_t(x)‖²``. The
normal equations give, per submodule,

    G_ij = Σ_t Σ_x ⟨δ_i(x), δ_j(x)⟩,   b_i = Σ_t Σ_x ⟨δ_i(x), δ_t(x)⟩,
    α* = (G + εI)⁻¹ b,                 θ_m = θ0_m + Σ_i α*_i τ_i,m.

The authors' code was never released; the choices of this reference version:

* **Data.** ~30 samples per task (``n_samples``); sums run over every real token
  position (padding masked out) and over ``d_model`` (or ``d_vocab`` at model level).
  ``fit_masks`` narrows the positions the least squares runs over (e.g. the
  answer side of a few-shot prompt, so the fit is not dominated by the few-shot
  prefix, where the experts' outputs matter least); inputs are still cached over
  the whole prompt, so attention sees every token.
* **Inputs x.** The submodule's input cached from expert ``t`` running task ``t``
  (``inputs_from="expert"``, default: each expert sees the activations it would
  produce) or from the base (``"base"``). The submodule itself is then run with
  each parameter set on those inputs (:mod:`merging.blocks`), not the whole model.
* **Solve.** float64; ``ε = ridge · mean(diag G)`` (relative, default 1e-8) so the
  solve is scale-free; a submodule no expert changed (``G = 0``) gets α = 0,
  harmless because its ``τ`` is 0.
* **Levels** (:data:`LEVELS`): ``"model"`` (one α from the logits, applied to every
  parameter, embeddings included, since the fit saw them), ``"layer"`` (whole
  block), ``"attn_mlp"`` (attention incl. ``ln1``/``ln1_post``; MLP incl.
  ``ln2``/``ln2_post``) and ``"head"`` (each head's ``z_h @ W_O[h]`` for its own
  slices; ``b_O``, norms and shared grouped/multi-query K/V get an attention-level
  α; the MLP is merged at MLP level). For non-model levels, embeddings,
  positional embeddings, the final norm and the unembedding use task arithmetic
  with ``embed_lambda`` (default ``1/n_experts``: the mean task vector).
* **Per-layer levels.** ``levels`` may be a mapping ``layer -> level`` or a callable
  ``layer -> level``; this is the hook for circuit-aware merging (e.g. head level
  in the layers a circuit lives in, attention/MLP level elsewhere).

Memory: unlike :func:`merging.merge`, this method runs models, so it holds the
model, one expert's full weights while caching inputs, and one block per expert
while fitting a layer.
"""

from __future__ import annotations

import math

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import plotly.graph_objects as go
import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.arguments import check_option
from merging import blocks
from merging.state_dicts import (
    EMBEDDING_PREFIXES,
    SourceLike,
    StateDictSource,
    as_sources,
    check_compatible,
    combine_experts,
    is_buffer,
)
from merging.methods.catalogue import LEVELS, Level  # where a command line reads them without torch

LayerLevel = Literal["layer", "attn_mlp", "head"]  # a level that can differ per layer
InputsFrom = Literal["expert", "base"]
LevelSpec = Level | Mapping[int, LayerLevel] | Callable[[int], LayerLevel]


@dataclass(frozen=True)
class SubmoduleMergeConfig:
    """Hyper-parameters of closed-form submodule merging (see the module docstring)."""

    level: Level = "attn_mlp"
    inputs_from: InputsFrom = "expert"
    n_samples: int = 30
    batch_size: int = 8
    ridge: float = 1e-8
    embed_lambda: float | None = None

    def __post_init__(self):
        if not (math.isfinite(self.ridge) and self.ridge >= 0):
            raise InputError(f"SubmoduleMergeConfig.ridge={self.ridge}: give a finite number >= 0 (relative ridge ε).")
        if self.n_samples < 1 or self.batch_size < 1:
            raise InputError(
                f"SubmoduleMergeConfig needs n_samples >= 1 and batch_size >= 1, got n_samples={self.n_samples}, "
                f"batch_size={self.batch_size}: the closed form fits α on task samples."
            )
        if self.embed_lambda is not None and not math.isfinite(self.embed_lambda):
            raise InputError(f"SubmoduleMergeConfig.embed_lambda={self.embed_lambda}: give a finite number or None.")
        check_option("level", self.level, Level)
        check_option("inputs_from", self.inputs_from, InputsFrom)


@dataclass(frozen=True)
class Submodule:
    """One fitted unit: ``name`` (``"L3.attn"``, ``"L3H1"``...), how it is evaluated and what it owns.

    ``kind`` is the :mod:`merging.blocks` evaluation (``"heads"`` for a head, with
    ``head`` picking its output slice); ``params`` lists block-relative parameter
    names with the head index they are sliced at (None = whole tensor).
    """

    name: str
    kind: str
    layer: int
    head: int | None
    params: tuple[tuple[str, int | None], ...]


@dataclass
class AlphaTable:
    """Fitted α per submodule (rows) and expert (columns), with the Gram data behind them."""

    names: list[str]
    values: Tensor  # [n_submodules, n_experts], float64
    expert_names: list[str]
    gram: dict[str, Tensor] = field(default_factory=dict)
    rhs: dict[str, Tensor] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Tensor:
        return self.values[self.names.index(name)]

    def to_dict(self) -> dict[str, list[float]]:
        """``{submodule: [α per expert]}`` (JSON-friendly)."""
        return {n: [float(a) for a in row] for n, row in zip(self.names, self.values)}


@dataclass
class SubmoduleMergeResult:
    """The merged state dict (loadable into the base's architecture) and the α table."""

    state_dict: dict[str, Tensor]
    alphas: AlphaTable


def level_of(levels: LevelSpec, layer: int, default: str = "attn_mlp") -> str:
    """The level used for ``layer`` under a global, per-layer mapping (missing layers: ``default``) or callable spec."""
    if isinstance(levels, str):
        level = levels
    elif callable(levels):
        level = levels(layer)
    else:
        level = levels.get(layer, default)
    return check_option("per-layer level", level, LayerLevel, where=f"Layer {layer}: ")


def plan_layer(model: HookedTransformer, layer: int, level: str) -> list[Submodule]:
    """The submodules of block ``layer`` at ``level``; every block parameter is owned exactly once."""
    names = blocks.kind_param_names(model, layer, "layer")
    whole = lambda kind: tuple((n, None) for n in blocks.kind_param_names(model, layer, kind))  # noqa: E731
    if level == "layer":
        subs = [Submodule(f"L{layer}", "layer", layer, None, whole("layer"))]
    else:
        blocks.check_block_layout(model)
        attn = whole("attn")
        subs = []
        if level == "head":
            head_names = blocks.head_param_names(model, layer)
            subs += [
                Submodule(f"L{layer}H{h}", "heads", layer, h, tuple((n, h) for n in head_names))
                for h in range(model.cfg.n_heads)
            ]
            attn = tuple(p for p in attn if p[0] not in head_names)
        subs.append(Submodule(f"L{layer}.attn", "attn", layer, None, attn))
        if not model.cfg.attn_only:
            subs.append(Submodule(f"L{layer}.mlp", "mlp", layer, None, whole("mlp")))
    owned = {n for s in subs for n, _ in s.params}
    if level != "head":
        missing = set(names) - owned
    else:
        missing = set(names) - owned - set(blocks.head_param_names(model, layer))
    if missing:
        raise InputError(f"Block {layer} parameters {sorted(missing)} belong to no submodule at level {level!r}.")
    return subs


def block_params(src: StateDictSource, layer: int, device, dtype) -> dict[str, Tensor]:
    """Block ``layer``'s parameters from ``src``, block-relative names, on ``device``/``dtype``."""
    prefix = blocks.block_prefix(layer)
    return {
        k[len(prefix):]: src.get(k).to(device=device, dtype=dtype)
        for k in src.param_keys()
        if k.startswith(prefix)
    }


def full_params(src: StateDictSource, device, dtype) -> dict[str, Tensor]:
    """Every parameter of ``src`` (no buffers) on ``device`` in ``dtype``."""
    return {k: src.get(k).to(device=device, dtype=dtype) for k in src.param_keys()}


def solve_alpha(gram: Tensor, rhs: Tensor, ridge: float) -> Tensor:
    """``α = (G + εI)⁻¹ b`` in float64 with ``ε = ridge · mean(diag G)`` (α = 0 when G = 0)."""
    gram, rhs = gram.double(), rhs.double()
    scale = float(gram.diagonal().mean())
    if scale <= 0.0:
        return torch.zeros_like(rhs)
    eye = torch.eye(len(rhs), dtype=torch.float64, device=gram.device)
    return torch.linalg.solve(gram + ridge * scale * eye, rhs)


class _Accumulator:
    """Running ``G`` and ``b`` of one submodule."""

    def __init__(self, n: int):
        self.gram = torch.zeros(n, n, dtype=torch.float64)
        self.rhs = torch.zeros(n, dtype=torch.float64)

    def add(self, deltas: Sequence[Tensor], task: int, mask: Tensor) -> None:
        """Add one chunk: ``deltas[i]`` is δ_i on task ``task``'s chunk, ``mask`` its real positions."""
        mask = mask.to(deltas[0].device)
        flat = torch.stack([(d.double() * mask).reshape(-1) for d in deltas])  # on the deltas' device
        self.gram += (flat @ flat.T).cpu()
        self.rhs += (flat @ flat[task]).cpu()


def cache_task_inputs(model, sources, task_batches, hooks, inputs_from: str, dtype, progress: bool = False):
    """Per task ``t``, per chunk: ``{hook: activation}`` from expert ``t`` (``inputs_from="expert"``) or the base."""
    device = model.cfg.device
    out = []
    for t, chunks in enumerate(tqdm(task_batches, desc="caching inputs", disable=not progress)):
        params = None if inputs_from == "base" else full_params(sources[t], device, dtype)
        with torch.no_grad():
            out.append([blocks.collect_inputs(model, tok, m, hooks, params) for tok, m, *_ in chunks])
        del params
    return out


def merge_submodules(
    model: HookedTransformer,
    experts: Sequence[SourceLike],
    tasks: Sequence,
    config: SubmoduleMergeConfig = SubmoduleMergeConfig(),
    *,
    levels: LevelSpec | None = None,
    attention_masks: Sequence | None = None,
    fit_masks: Sequence | None = None,
    expert_names: Sequence[str] | None = None,
    progress: bool = True,
) -> SubmoduleMergeResult:
    """Closed-form submodule merging of ``experts`` into ``model`` (which holds the base θ0).

    ``tasks[t]`` is task ``t``'s data (Int tensor ``[batch, pos]``, a list of them,
    or a list of strings); expert ``t`` is the expert for task ``t``.
    ``levels`` overrides ``config.level`` per layer (mapping or callable).
    ``fit_masks[t]`` (0/1, mirroring ``tasks[t]``: a tensor or a list of tensors, so the
    tasks must be token tensors) picks the positions the least squares runs over; by
    default every real (non-padding) position.
    """
    base, sources = as_sources(model, experts)
    if len(tasks) != len(sources):
        raise InputError(f"{len(tasks)} tasks for {len(sources)} experts: give one task (data) per expert.")
    check_compatible(base, sources)
    n = len(sources)
    names = list(expert_names) if expert_names is not None else [f"expert {i}" for i in range(n)]
    device, dtype = model.cfg.device, next(model.parameters()).dtype
    masks = attention_masks if attention_masks is not None else [None] * n
    task_batches = [
        blocks.batches(model, task, m, n_samples=config.n_samples, batch_size=config.batch_size)
        for task, m in zip(tasks, masks)
    ]
    task_batches = _with_fit_masks(model, task_batches, tasks, fit_masks, config)
    spec = levels if levels is not None else config.level
    if spec == "model":
        return _merge_model_level(model, base, sources, task_batches, config, names, progress)
    plans = [plan_layer(model, layer, level_of(spec, layer, config.level)) for layer in range(model.cfg.n_layers)]
    hooks = sorted({blocks.input_hook(model, s.layer, s.kind) for plan in plans for s in plan})
    inputs = cache_task_inputs(model, sources, task_batches, hooks, config.inputs_from, dtype, progress)

    rows, alphas, grams, rhss = [], [], {}, {}
    merged: dict[str, Tensor] = {}
    for layer, plan in enumerate(tqdm(plans, desc="fitting layers", disable=not progress)):
        theta0 = block_params(base, layer, device, dtype)
        thetas = [block_params(s, layer, device, dtype) for s in sources]
        accs = _fit_layer(model, layer, plan, theta0, thetas, task_batches, inputs)
        for s in plan:
            a = solve_alpha(accs[s.name].gram, accs[s.name].rhs, config.ridge)
            rows.append(s.name)
            alphas.append(a)
            grams[s.name], rhss[s.name] = accs[s.name].gram, accs[s.name].rhs
            _apply(merged, s, a, theta0, thetas, layer)
    table = AlphaTable(rows, torch.stack(alphas), names, grams, rhss)
    lam = config.embed_lambda if config.embed_lambda is not None else 1.0 / n
    return SubmoduleMergeResult(_assemble(base, sources, merged, lam), table)


def _fit_layer(model, layer: int, plan: list[Submodule], theta0, thetas, task_batches, inputs) -> dict[str, _Accumulator]:
    """``G`` and ``b`` of every submodule of block ``layer``: each kind of submodule is run on every task's cached
    inputs with the base's and each expert's parameters, over the fitted positions."""
    n = len(thetas)
    accs = {s.name: _Accumulator(n) for s in plan}
    for kind in dict.fromkeys(s.kind for s in plan):
        swap = blocks.kind_param_names(model, layer, kind)
        hook = blocks.input_hook(model, layer, kind)
        for t in range(n):
            for (tok, m, fit), cache in zip(task_batches[t], inputs[t]):
                mask = _fit_positions(tok, m, fit)
                with torch.no_grad():
                    y0 = blocks.submodule_output(model, layer, kind, theta0, cache[hook], m)
                    deltas = [
                        blocks.submodule_output(model, layer, kind, {**theta0, **{k: th[k] for k in swap}}, cache[hook], m) - y0
                        for th in thetas
                    ]
                for s in (s for s in plan if s.kind == kind):
                    ds = deltas if s.head is None else [d[:, :, s.head] for d in deltas]
                    accs[s.name].add(ds, t, mask)
    return accs


def _with_fit_masks(model, task_batches, tasks, fit_masks, config) -> list[list[tuple]]:
    """Each task's ``(tokens, attention mask)`` chunks with the matching chunk of its fit mask (None: all)."""
    if fit_masks is None:
        return [[(tok, m, None) for tok, m in chunks] for chunks in task_batches]
    if len(fit_masks) != len(tasks):
        raise InputError(f"{len(fit_masks)} fit masks for {len(tasks)} tasks: give one (or None) per task.")
    out = []
    for chunks, task, fit in zip(task_batches, tasks, fit_masks):
        if fit is None:
            out.append([(tok, m, None) for tok, m in chunks])
            continue
        if isinstance(task, (list, tuple)) and task and isinstance(task[0], str):
            raise InputError("fit_masks need the tasks as token tensors (strings are tokenised here, so a mask "
                             "cannot be aligned with them): pass tokens and their masks.")
        # batches() chunks a mask that mirrors the task the way it chunks the task: reuse it for the fit mask.
        fits = blocks.batches(model, task, fit, n_samples=config.n_samples, batch_size=config.batch_size)
        out.append([(tok, m, f) for (tok, m), (_, f) in zip(chunks, fits)])
    return out


def _fit_positions(tokens: Tensor, attention_mask: Tensor | None, fit: Tensor | None) -> Tensor:
    """``[batch, pos, 1]`` float mask of the positions the least squares runs over."""
    mask = blocks.position_mask(tokens, attention_mask)
    return mask if fit is None else mask * fit.to(mask.device, torch.float64).unsqueeze(-1)


def _apply(merged, sub: Submodule, alpha: Tensor, theta0, thetas, layer: int) -> None:
    """Write ``θ0 + Σ α_i τ_i`` for ``sub``'s parameters (or head slices) into ``merged``."""
    prefix = blocks.block_prefix(layer)
    for name, head in sub.params:
        key = prefix + name
        if key not in merged:
            merged[key] = theta0[name].detach().clone()
        base_t = theta0[name] if head is None else theta0[name][head]
        acc = combine_experts(base_t, [th[name] if head is None else th[name][head] for th in thetas], alpha.tolist())
        if head is None:
            merged[key] = acc
        else:
            merged[key][head] = acc


def _assemble(base: StateDictSource, sources, merged: dict[str, Tensor], lam: float) -> dict[str, Tensor]:
    """Final state dict in the base's key order: fitted blocks, TA for embeddings/unembedding, base buffers.

    Every tensor is returned on the CPU, whatever device the model and the experts are on."""
    out = {}
    for key in base.keys():
        t = base.get(key)
        if key in merged:
            out[key] = merged[key].to(t.dtype).cpu()
        elif is_buffer(key):
            out[key] = t.detach().cpu().clone()
        elif key.startswith(EMBEDDING_PREFIXES):
            out[key] = combine_experts(t.cpu(), [s.get(key) for s in sources], [lam] * len(sources))
        else:
            raise InputError(f"Parameter {key} is neither in a block nor an embedding/unembedding/final norm.")
    return out


def _merge_model_level(model, base, sources, task_batches, config, names, progress) -> SubmoduleMergeResult:
    """One α for the whole model, fitted on the logits; applied to every parameter.

    Chunks are the outer loop so only one chunk's logits per expert are alive;
    each expert's weights are materialised per chunk (free for in-memory sources
    already on the model's device and dtype, a file read for safetensors sources).
    """
    device, dtype = model.cfg.device, next(model.parameters()).dtype
    n = len(sources)
    acc = _Accumulator(n)
    work = [(t, tok, m, fit) for t, chunks in enumerate(task_batches) for tok, m, fit in chunks]
    with torch.no_grad():
        for t, tok, m, fit in tqdm(work, desc="model-level fit", disable=not progress):
            y0 = blocks.logits(model, tok, m)
            deltas = [blocks.logits(model, tok, m, full_params(src, device, dtype)) - y0 for src in sources]
            acc.add(deltas, t, _fit_positions(tok, m, fit))
    alpha = solve_alpha(acc.gram, acc.rhs, config.ridge)
    out = {}
    for key in base.keys():
        t = base.get(key)
        if is_buffer(key):
            out[key] = t.detach().cpu().clone()
            continue
        out[key] = combine_experts(t.cpu(), [s.get(key) for s in sources], alpha.tolist())
    table = AlphaTable(["model"], alpha.unsqueeze(0), names, {"model": acc.gram}, {"model": acc.rhs})
    return SubmoduleMergeResult(out, table)


def alpha_heatmap(table: AlphaTable, title: str = "Closed-form merging weights α") -> go.Figure:
    """Plotly heatmap of the α table: submodules (rows) x experts (columns)."""
    z = table.values.float().numpy()
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=table.expert_names,
            y=table.names,
            colorscale="RdBu",
            zmid=0.0,
            colorbar=dict(title="α"),
            hovertemplate="%{y} · %{x}: α=%{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=title,
        xaxis_title="expert",
        yaxis_title="submodule",
        yaxis=dict(autorange="reversed"),
        height=max(300, 18 * len(table.names) + 120),
    )
    return fig
