"""Attention-based peeking (ABP): decide, per layer and head, which keys each query may read.

Mamidanna, Rai, Yao & Zhou (2025, "All for One", arXiv 2509.09650) restrict
*where information may flow* by masking the attention scores before the
softmax. Each query position keeps a set of allowed key positions; every other
key gets a score of ``-inf`` and so receives zero attention weight. The paper
uses three rules, always keeping the BOS position (the attention sink) and the
query itself:

* **no peek** for every non-last query: it attends only to BOS and itself, so
  no token learns anything from the other tokens in that layer;
* **full peek** for the last token: it may read every earlier token;
* **self peek** for the last token: only BOS and itself.

:func:`peek_mask` builds one layer's ``[query_pos, key_pos]`` mask from these
rules, :func:`allowed_keys_mask` the general "allowed keys per query" form, and
:func:`per_head_mask` combines two masks head by head (a pruned AF1 subgraph
gives full peek to some heads of a layer and self peek to the rest).
:func:`abp_hooks` turns ``{layer: mask}`` into forward hooks on
``blocks.{layer}.attn.hook_attn_scores``.

Why the hook is safe for any attention layout:

* TransformerLens applies the causal mask *and* the sliding window of local
  attention layers (gemma-3, Mistral: ``cfg.attn_types``/``window_size``)
  before ``hook_attn_scores``. The hook only ever lowers scores to ``-inf``;
  it never raises a score, so a key that the window or the causal mask hid
  stays hidden. Allowing a pair in an ABP mask means "do not add a mask", not
  "make visible".
* Under grouped- or multi-query attention the scores are still one map per
  *query* head (``[batch, head, query_pos, key_pos]`` with ``cfg.n_heads``
  heads), so per-head masks act on query heads; heads that share a key/value
  head can get different masks.
"""

from __future__ import annotations

from typing import Callable, Iterable, Literal, Mapping

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens import utils as tl_utils
from transformer_lens.hook_points import HookPoint

PeekRule = Literal["full", "self"]
PEEK_RULES = ("full", "self")

AttnMask = Bool[Tensor, "... query_pos key_pos"]


def _check_rule(name: str, rule: str) -> None:
    if rule not in PEEK_RULES:
        raise ValueError(f"{name}={rule!r} is not a peek rule; use one of {PEEK_RULES}.")


def peek_mask(
    n_pos: int,
    *,
    last: PeekRule = "full",
    others: PeekRule = "self",
    keep_bos: bool = True,
    device: torch.device | str | None = None,
) -> Bool[Tensor, "query_pos key_pos"]:
    """One layer's allowed (query, key) pairs under the paper's peek rules.

    ``last="full"`` lets the last query read every key (full peek), ``"self"``
    only itself and BOS (self peek). ``others`` is the same choice for every
    non-last query: ``"self"`` is the paper's "no peek", ``"full"`` leaves
    them unmasked. BOS (position 0) stays readable when ``keep_bos``.
    Causality is not encoded here: the model's own causal/window mask still applies.
    """
    if n_pos < 1:
        raise ValueError(f"n_pos must be >= 1, got {n_pos}.")
    _check_rule("last", last)
    _check_rule("others", others)
    mask = torch.eye(n_pos, dtype=torch.bool, device=device)
    if keep_bos:
        mask[:, 0] = True
    if others == "full":
        mask[:-1, :] = True
    if last == "full":
        mask[-1, :] = True
    return mask


def allowed_keys_mask(
    n_pos: int,
    allowed: Mapping[int, Iterable[int]],
    *,
    default: PeekRule = "full",
    keep_bos: bool = True,
    keep_self: bool = True,
    device: torch.device | str | None = None,
) -> Bool[Tensor, "query_pos key_pos"]:
    """The general form: ``allowed[q]`` lists the key positions query ``q`` may read.

    Queries not in ``allowed`` follow ``default`` (``"full"``: unmasked, ``"self"``:
    BOS and itself). Negative positions count from the end (``-1`` is the last token).
    BOS and the query itself are added unless ``keep_bos``/``keep_self`` is False
    (a query that may read nothing would get a NaN softmax row, which TransformerLens zeroes).
    """
    _check_rule("default", default)
    mask = peek_mask(n_pos, last=default, others=default, keep_bos=keep_bos, device=device)
    if not keep_self:
        mask.fill_diagonal_(False)
    for query, keys in allowed.items():
        q = _position(query, n_pos, "query")
        row = torch.zeros(n_pos, dtype=torch.bool, device=mask.device)
        for key in keys:
            k = _position(key, n_pos, "key")
            if k > q:
                raise ValueError(f"Key {key} comes after query {query}: causal attention cannot read the future.")
            row[k] = True
        if keep_bos:
            row[0] = True
        if keep_self:
            row[q] = True
        mask[q] = row
    return mask


def _position(index: int, n_pos: int, what: str) -> int:
    if not -n_pos <= index < n_pos:
        raise ValueError(f"{what} position {index} is out of range for a prompt of {n_pos} tokens.")
    return index % n_pos


def per_head_mask(
    n_heads: int,
    heads: Iterable[int],
    mask_if_in: Bool[Tensor, "query_pos key_pos"],
    mask_if_out: Bool[Tensor, "query_pos key_pos"],
) -> Bool[Tensor, "head query_pos key_pos"]:
    """A ``[head, query_pos, key_pos]`` mask: ``mask_if_in`` for the listed heads, ``mask_if_out`` for the rest."""
    if mask_if_in.shape != mask_if_out.shape:
        raise ValueError(f"The two masks differ in shape: {tuple(mask_if_in.shape)} vs {tuple(mask_if_out.shape)}.")
    selected = torch.zeros(n_heads, dtype=torch.bool, device=mask_if_in.device)
    for head in heads:
        if not 0 <= head < n_heads:
            raise ValueError(f"Head {head} is out of range; the layer has heads 0..{n_heads - 1}.")
        selected[head] = True
    return torch.where(selected[:, None, None], mask_if_in[None], mask_if_out[None])


def mask_scores(
    scores: Float[Tensor, "batch head query_pos key_pos"], allowed: AttnMask
) -> Float[Tensor, "batch head query_pos key_pos"]:
    """Set the scores of disallowed (query, key) pairs to ``-inf``; allowed pairs keep their value.

    ``allowed`` broadcasts against the scores: ``[query_pos, key_pos]`` (all heads),
    ``[head, query_pos, key_pos]`` or ``[batch, head, query_pos, key_pos]``.
    """
    if allowed.dtype != torch.bool:
        raise TypeError(f"An ABP mask must be boolean, got dtype {allowed.dtype}.")
    if tuple(allowed.shape[-2:]) != tuple(scores.shape[-2:]):
        raise ValueError(
            f"ABP mask covers {tuple(allowed.shape[-2:])} (query_pos, key_pos) but the attention scores are "
            f"{tuple(scores.shape[-2:])}: build the mask for the prompt length being run."
        )
    if allowed.ndim >= 3 and allowed.shape[-3] not in (1, scores.shape[1]):
        raise ValueError(
            f"ABP mask has {allowed.shape[-3]} heads but the layer has {scores.shape[1]} query heads."
        )
    return scores.masked_fill(~allowed.to(scores.device), float("-inf"))


def abp_hook(allowed: AttnMask) -> Callable[..., Tensor]:
    """A ``hook_attn_scores`` hook that applies :func:`mask_scores` with ``allowed``."""

    def hook(scores: Float[Tensor, "batch head query_pos key_pos"], *, hook: HookPoint) -> Tensor:
        return mask_scores(scores, allowed)

    return hook


def abp_hooks(
    model: HookedTransformer, masks: Mapping[int, AttnMask]
) -> list[tuple[str, Callable[..., Tensor]]]:
    """Forward hooks applying ``masks[layer]`` to the attention scores of each listed layer.

    Use them with ``model.hooks(fwd_hooks=...)`` or ``model.run_with_hooks``.
    """
    hooks = []
    for layer, allowed in sorted(masks.items()):
        if not 0 <= layer < model.cfg.n_layers:
            raise ValueError(f"Layer {layer} is out of range; the model has layers 0..{model.cfg.n_layers - 1}.")
        if allowed.ndim >= 3 and allowed.shape[-3] not in (1, model.cfg.n_heads):
            raise ValueError(
                f"Layer {layer}: mask has {allowed.shape[-3]} heads, the model has {model.cfg.n_heads} query heads."
            )
        name = tl_utils.get_act_name("attn_scores", layer)
        if name not in model.hook_dict:
            raise ValueError(f"Hook point {name!r} not found on the model.")
        hooks.append((name, abp_hook(allowed)))
    return hooks


def layer_peek_masks(
    model: HookedTransformer,
    n_pos: int,
    *,
    layers: Iterable[int],
    last: PeekRule,
    others: PeekRule = "self",
    full_heads: Mapping[int, Iterable[int]] | None = None,
    device: torch.device | str | None = None,
) -> dict[int, Bool[Tensor, "head query_pos key_pos"] | Bool[Tensor, "query_pos key_pos"]]:
    """``{layer: mask}`` with the same peek rule on every listed layer.

    With ``full_heads`` (``{layer: heads}``), only those heads of a listed layer get
    the ``last`` rule for the last token; the layer's other heads get self peek.
    """
    device = device if device is not None else model.cfg.device
    base = peek_mask(n_pos, last=last, others=others, device=device)
    masks: dict[int, Tensor] = {}
    for layer in layers:
        if full_heads is not None and layer in full_heads:
            closed = peek_mask(n_pos, last="self", others=others, device=device)
            masks[layer] = per_head_mask(model.cfg.n_heads, full_heads[layer], base, closed)
        else:
            masks[layer] = base
    return masks
