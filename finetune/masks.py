"""Which parameter entries a fine-tuning run may change: precise (key heads), full, or none.

Precise SFT (Zhang et al. 2024, Algorithm 2) tunes only the parameters of a few
*key heads*. In a `HookedTransformer` the heads of layer ``l`` live stacked in
shared tensors, head index first:

=====================  ===========================  =========================
tensor                 shape                        slice of head h
=====================  ===========================  =========================
``attn.W_Q``           ``[n_heads, d_model, d_head]``  ``[h]``
``attn.b_Q``           ``[n_heads, d_head]``           ``[h]``
``attn.W_O``           ``[n_heads, d_head, d_model]``  ``[h]``
``attn.W_K``/``W_V``   ``[n_heads, d_model, d_head]``  ``[h]`` (multi-head)
``attn._W_K``/``_W_V`` ``[n_kv, d_model, d_head]``     ``[h // (n_heads // n_kv)]``
``attn.b_K``/``b_V``   like the weights                like the weights
=====================  ===========================  =========================

Under grouped/multi-query attention (TransformerLens stores K/V as ``_W_K``,
``_W_V``, ``_b_K``, ``_b_V`` with one row per KV head) a KV head serves several
query heads; its slice is tuned when *any* of its query heads is selected
(``tune_kv=False`` leaves every K/V entry frozen instead). ``b_O`` is one
vector shared by all heads of the layer, so it is not a head's parameter and
stays frozen. Selected MLPs (`circuits.nodes.MLP`) are tuned in full (every
parameter of ``blocks.l.mlp``; the surrounding norms stay frozen).

A :class:`Selection` lists :class:`TunableSlice`\\ s: a parameter name plus the
rows of dim 0 that may change (``None``: all of it). :func:`apply_selection`
turns a selection into autograd state:

* every parameter outside the selection gets ``requires_grad=False``, so
  backward never computes its gradient (this is where precise SFT saves time);
* a parameter tuned only in some rows gets a gradient hook that zeroes the
  other rows, so their gradient is exactly 0;
* the hook also multiplies the tuned rows of layer ``l`` by ``H / h_l``
  (``H`` heads per layer, ``h_l`` of them tuned), following Yu et al. (2023) as
  the paper does. The factor is a *per layer* constant; under Adam a constant
  factor cancels except against ``eps``, so it matters little in practice,
  but it is applied as specified. K/V slices of a layer get the same factor.

The optimizer (:mod:`finetune.optim`) updates only the selected rows, so
masked entries (including their weight decay) are never written: they stay
bit-identical to the base model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch import nn
from transformer_lens import HookedTransformer

from circuits.errors import InputError, InputKeyError
from circuits.nodes import MLP, Head, validate_nodes

EMBEDDING_PARAMS = ("embed.W_E", "unembed.W_U", "unembed.b_U", "pos_embed.W_pos")


@dataclass(frozen=True)
class TunableSlice:
    """Rows ``index`` (dim 0) of parameter ``name`` may change; ``index=None`` means the whole tensor.

    ``grad_scale`` multiplies the gradient of the tuned rows (1.0: unchanged).
    ``decay`` says whether AdamW weight decay applies (matrices yes; biases and norm gains no).
    """

    name: str
    index: tuple[int, ...] | None = None
    grad_scale: float = 1.0
    decay: bool = True


@dataclass(frozen=True)
class Selection:
    """The set of trainable parameter slices of a run, and a description for reports."""

    slices: tuple[TunableSlice, ...]
    description: str = ""

    def names(self) -> list[str]:
        return [s.name for s in self.slices]

    def n_trainable(self, model: nn.Module) -> int:
        """Number of trainable scalar entries under this selection."""
        params = dict(model.named_parameters())
        total = 0
        for s in self.slices:
            p = params[s.name]
            total += p.numel() if s.index is None else len(s.index) * p[0].numel()
        return total


def _decays(name: str, param: torch.Tensor) -> bool:
    # HF Trainer convention: no decay on biases and norm gains (1-D tensors); decay on matrices.
    return param.ndim >= 2 and not name.split(".")[-1].startswith("b_")


def _kv_names(model: HookedTransformer, layer: int) -> list[str]:
    attn = model.blocks[layer].attn
    prefix = f"blocks.{layer}.attn."
    if hasattr(attn, "_W_K"):  # grouped/multi-query attention
        names = ["_W_K", "_W_V", "_b_K", "_b_V"]
    else:
        names = ["W_K", "W_V", "b_K", "b_V"]
    params = dict(attn.named_parameters(recurse=False))
    return [prefix + n for n in names if n in params]


def kv_group(model: HookedTransformer, head: int) -> int:
    """The KV head that query head ``head`` reads under grouped/multi-query attention (itself otherwise)."""
    n_kv = model.cfg.n_key_value_heads or model.cfg.n_heads
    return head // (model.cfg.n_heads // n_kv)


def precise_selection(
    model: HookedTransformer,
    heads: Sequence[Head],
    mlps: Sequence[MLP] = (),
    *,
    tune_kv: bool = True,
    rescale: bool = True,
) -> Selection:
    """The slices precise SFT tunes: Q, O (and K, V of the head's KV group) of each head, plus whole MLPs.

    Args:
        heads: key heads as `circuits.nodes.Head`; duplicates are ignored.
        mlps: MLPs tuned in full (e.g. the top-m by path-patching effect).
        tune_kv: tune the K/V slice (shared KV head under GQA/MQA) of selected heads.
        rescale: multiply tuned head gradients of layer l by ``n_heads / h_l`` (Yu et al. 2023).
    """
    nodes = validate_nodes(model, [*heads, *mlps])
    if not nodes:
        raise InputError("precise_selection needs at least one Head or MLP to tune: pass heads (or mlps).")
    heads = sorted({n for n in nodes if isinstance(n, Head)})
    mlps = sorted({n for n in nodes if isinstance(n, MLP)})
    params = dict(model.named_parameters())
    n_heads = model.cfg.n_heads
    slices: list[TunableSlice] = []
    for layer in sorted({h.layer for h in heads}):
        rows = tuple(h.head for h in heads if h.layer == layer)
        scale = n_heads / len(rows) if rescale else 1.0
        prefix = f"blocks.{layer}.attn."
        for short in ("W_Q", "b_Q", "W_O"):
            name = prefix + short
            if name in params:
                slices.append(TunableSlice(name, rows, scale, _decays(name, params[name])))
        if tune_kv:
            for name in _kv_names(model, layer):
                n_rows = params[name].shape[0]
                kv_rows = tuple(sorted({kv_group(model, h) for h in rows})) if n_rows != n_heads else rows
                slices.append(TunableSlice(name, kv_rows, scale, _decays(name, params[name])))
    for mlp in mlps:
        prefix = f"blocks.{mlp.layer}.mlp."
        for name, p in params.items():
            if name.startswith(prefix):
                slices.append(TunableSlice(name, None, 1.0, _decays(name, p)))
    text = f"precise: {len(heads)} heads ({', '.join(map(str, heads))})"
    if mlps:
        text += f" + {len(mlps)} MLPs ({', '.join(map(str, mlps))})"
    text += "" if tune_kv else ", K/V frozen"
    return Selection(tuple(slices), text)


def full_selection(model: nn.Module, *, train_embeddings: bool = False) -> Selection:
    """Every parameter (full SFT).

    ``train_embeddings=False`` (the default) freezes ``W_E``, ``W_U``, ``b_U`` and
    ``W_pos``. Gemma ties its input and output embeddings, but TransformerLens
    holds them as two separate 262144 x 640 tensors (2 x 168M of the model's
    ~436M entries): training them would untie the copies and quadruple the
    AdamW memory (~7 GB more in fp32) for a task whose answers are ten digits.
    Pass ``True`` for the literal all-parameter baseline.

    On models that normalise attention outputs (gemma-2/3), an attention output bias ``b_O`` that is
    zero everywhere stays frozen: the checkpoint has no such bias (TransformerLens adds zeros), and a
    trained one would change the architecture and leave the residual stream no longer a sum of
    per-head outputs (:mod:`patching.edges.engine` refuses such a model for edge circuits).
    """
    post_norm = bool(getattr(getattr(model, "cfg", None), "use_normalization_before_and_after", False))
    slices = []
    for name, p in model.named_parameters():
        if not train_embeddings and name in EMBEDDING_PARAMS:
            continue
        if post_norm and name.endswith("attn.b_O") and not bool(p.detach().ne(0).any()):
            continue
        slices.append(TunableSlice(name, None, 1.0, _decays(name, p)))
    return Selection(tuple(slices), "full" + (" (all parameters)" if train_embeddings else " (embeddings frozen)"))


def named_selection(model: nn.Module, names: Iterable[str], description: str = "custom") -> Selection:
    """Whole tensors by name (used for LoRA factors); raises on unknown names."""
    params = dict(model.named_parameters())
    missing = [n for n in names if n not in params]
    if missing:
        raise InputKeyError(f"Unknown parameters {missing[:5]}; the model has e.g. {list(params)[:5]}.")
    return Selection(tuple(TunableSlice(n, None, 1.0, _decays(n, params[n])) for n in names), description)


def _row_hook(index: tuple[int, ...] | None, n_rows: int, scale: float):
    if index is None:
        return lambda grad: grad * scale
    keep = torch.zeros(n_rows, dtype=torch.bool)
    keep[list(index)] = True

    def hook(grad: torch.Tensor) -> torch.Tensor:
        mask = keep.to(grad.device).view(-1, *([1] * (grad.ndim - 1)))
        # where() gives exact zeros (no 0 * inf = nan) in the masked rows.
        return torch.where(mask, grad * scale, torch.zeros((), dtype=grad.dtype, device=grad.device))

    return hook


class AppliedSelection:
    """Handle returned by :func:`apply_selection`; ``remove()`` drops the hooks and restores requires_grad."""

    def __init__(self, model: nn.Module, selection: Selection, handles: list, previous: dict[str, bool]):
        self.model, self.selection, self._handles, self._previous = model, selection, handles, previous

    def parameters(self) -> list[tuple[TunableSlice, nn.Parameter]]:
        params = dict(self.model.named_parameters())
        return [(s, params[s.name]) for s in self.selection.slices]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for name, p in self.model.named_parameters():
            p.requires_grad_(self._previous.get(name, p.requires_grad))

    def __enter__(self) -> "AppliedSelection":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def apply_selection(model: nn.Module, selection: Selection) -> AppliedSelection:
    """Freeze everything outside ``selection`` and register the row-masking / rescaling grad hooks."""
    params = dict(model.named_parameters())
    unknown = [s.name for s in selection.slices if s.name not in params]
    if unknown:
        raise KeyError(f"Selection names unknown parameters: {unknown[:5]}.")
    if len(set(selection.names())) != len(selection.slices):
        raise ValueError("A parameter appears twice in the selection; merge its rows into one TunableSlice.")
    previous = {name: p.requires_grad for name, p in params.items()}
    for p in params.values():
        p.requires_grad_(False)
    handles = []
    for s in selection.slices:
        p = params[s.name]
        if s.index is not None and (min(s.index) < 0 or max(s.index) >= p.shape[0]):
            raise IndexError(f"{s.name}: rows {s.index} out of range for shape {tuple(p.shape)}.")
        p.requires_grad_(True)
        if s.index is not None or s.grad_scale != 1.0:
            handles.append(p.register_hook(_row_hook(s.index, p.shape[0], s.grad_scale)))
    return AppliedSelection(model, selection, handles, previous)
