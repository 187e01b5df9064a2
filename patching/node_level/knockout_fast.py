"""The knockout fast path: shared prefix once, shared suffix starts once, many sets per forward, pruned top-1.

:func:`patching.node_level.knockout_curves.knockout_correct` asks, for many knockout sets and prompts, whether
the answer token is still the top-1 prediction at END. Three savings make that cheap, each
exact (the same hits as the plain hook implementation, up to float rounding at exact ties):

1. **Prefix once.** Positions before the first one where the evaluated prompts and the pool
   differ hold the clean activation in every ablated run (their mean *is* the clean value),
   so their keys/values are computed once per layout; a set starts from the clean residual
   stream at its first ablated layer; many sets are stacked along the batch.
2. **Shared suffix starts once** (:func:`choose_split`). Rows that share the first ``s``
   suffix tokens (e.g. the first operand of "A + B = ") have the same activations there under
   the same knockout set (attention is causal). Those positions run once per distinct start,
   their keys/values are gathered to every row, and only the remaining positions run per row.
3. **Screened top-1** (:class:`Top1Anchor`). Unembedding END against gemma's 262k-token
   vocabulary costs as much as ~1.7 positions of the model. The argmax is found by a bfloat16
   product with a certified error bound and exact float32 logits for the few tokens the bound
   cannot exclude (:func:`circuits.end_logits.end_argmax`); near-ties take the full float32 row. Only where
   the CPU multiplies bfloat16 natively: elsewhere the emulated product costs more than it saves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer, TransformerLensKeyValueCacheEntry

from circuits.answer_scoring import answer_is_top1
from circuits.prefix_cache import TiledKVCache


# ---------------------------------------------------------------------------- top-1 at END


class Top1Anchor:
    """Clean END hits of ``B`` prompts, and top-1 hits of their ablated runs by the screened argmax.

    ``hits(resid_end)`` takes ``[k * B, d_model]`` final END residuals (set-major: row ``j * B + b``
    is prompt ``b``) and returns whether each answer is the full-vocabulary argmax, as
    ``unembed_end(...).argmax(-1) == answer`` would (:func:`circuits.answer_scoring.answer_is_top1`; ``screen``:
    as :func:`circuits.end_logits.end_argmax`'s, None screening where the CPU multiplies bfloat16 natively).
    ``stats`` counts the rows scored and those that needed the full float32 unembedding.
    """

    def __init__(self, model: HookedTransformer, clean_end: Float[Tensor, "batch d_model"], answers: Int[Tensor, "batch"],
                 *, screen: Optional[bool] = None):
        self.model, self.answers, self.screen = model, answers, screen
        self.clean_hits = answer_is_top1(model, clean_end, answers, screen=screen)
        self.stats = {"rows": 0, "full": 0}

    @torch.no_grad()
    def hits(self, resid_end: Float[Tensor, "rows d_model"]) -> Bool[Tensor, "rows"]:
        k = resid_end.shape[0] // self.answers.shape[0]
        return answer_is_top1(self.model, resid_end, self.answers.repeat(k), screen=self.screen, stats=self.stats)


# ---------------------------------------------------------------------------- shared suffix starts


@dataclass
class Split:
    """Run suffix positions ``[0, s)`` once per distinct start (``starts`` rows), the rest per row."""

    s: int
    starts: Int[Tensor, "n_starts"]  # a representative row per distinct start
    inverse: Int[Tensor, "batch"]  # each row's start


def choose_split(suffix: Int[Tensor, "batch pos"], min_saving: float = 0.15) -> Optional[Split]:
    """The split point that minimises positions run (distinct starts x s + rows x rest), if it saves enough."""
    B, S = suffix.shape
    best, best_cost = None, B * S * (1 - min_saving)
    for s in range(1, S):
        unique, inverse = torch.unique(suffix[:, :s], dim=0, return_inverse=True)
        cost = len(unique) * s + B * (S - s)
        if cost < best_cost:
            first = torch.full((len(unique),), B, dtype=torch.long, device=suffix.device)
            first.scatter_reduce_(0, inverse, torch.arange(B, device=suffix.device), reduce="amin")
            best, best_cost = Split(s, first, inverse), cost
    return best


class _CapturingKVCache:
    """Per-layer caches that start from a (tiled) prefix and keep the keys/values appended by one forward."""

    def __init__(self, model: HookedTransformer, prefix_kv, rows: int):
        self.model, self.prefix_kv, self.rows, self.entries = model, prefix_kv, rows, {}

    def __len__(self) -> int:
        return self.model.cfg.n_layers

    def __getitem__(self, layer: int) -> TransformerLensKeyValueCacheEntry:
        if layer not in self.entries:
            if self.prefix_kv is None:
                entry = TransformerLensKeyValueCacheEntry.init_cache_entry(self.model.cfg, self.model.cfg.device, self.rows)
            else:
                e = self.prefix_kv[layer]
                entry = TransformerLensKeyValueCacheEntry(e.past_keys.expand(self.rows, -1, -1, -1),
                                                          e.past_values.expand(self.rows, -1, -1, -1))
            self.entries[layer] = entry  # not frozen: the forward appends the new positions to it
        return self.entries[layer]


class _GatheredKVCache:
    """Frozen per-layer caches whose row ``i`` is row ``index[i]`` of a :class:`_CapturingKVCache`, built on access."""

    def __init__(self, source: _CapturingKVCache, index: Tensor):
        self.source, self.index = source, index

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, layer: int) -> TransformerLensKeyValueCacheEntry:
        e = self.source.entries[layer]
        return TransformerLensKeyValueCacheEntry(e.past_keys[self.index], e.past_values[self.index], frozen=True)


# ---------------------------------------------------------------------------- ablated runs


def ablation_hooks(selections: dict[str, Tensor], ids: Tensor, mean: dict[str, Tensor], positions: slice, device):
    """Hooks that set, in each of the stacked sets ``ids``, its chosen nodes to their mean at ``positions``."""
    k = len(ids)
    hooks = []
    for name, sel in selections.items():
        chosen = sel[ids].to(device)
        if not chosen.any():
            continue
        # broadcast over (rows, pos[, d_head]) for heads, (rows, pos, d_model) for an MLP
        mask = chosen.view(k, 1, 1, -1, 1) if chosen.ndim == 2 else chosen.view(k, 1, 1, 1)

        def ablate(act, *, hook, mask=mask, value=mean[name][positions], k=k):
            act = act.view(k, -1, *act.shape[1:])
            return torch.where(mask, value.to(act.dtype), act).flatten(0, 1)

        hooks.append((name, ablate))
    return hooks


def ablated_end(
    model: HookedTransformer,
    resid: Float[Tensor, "batch suffix d_model"],
    layer: int,
    prefix_kv: Optional[Sequence[TransformerLensKeyValueCacheEntry]],
    hooks_at,
    k: int,
    split: Optional[Split],
) -> Float[Tensor, "set_batch d_model"]:
    """Final END residuals of ``k`` stacked knockout sets, from the clean residual ``resid`` before ``layer``.

    ``hooks_at(positions)`` gives the ablation hooks for a slice of the suffix positions.
    """
    L, (B, S) = model.cfg.n_layers, resid.shape[:2]
    if split is None:
        kv = None if prefix_kv is None else TiledKVCache(prefix_kv, k * B)
        out = model.run_with_hooks(resid.repeat(k, 1, 1), start_at_layer=layer, stop_at_layer=L,
                                   fwd_hooks=hooks_at(slice(0, S)), past_kv_cache=kv)
        return out[:, -1]
    n_starts = len(split.starts)
    captured = _CapturingKVCache(model, prefix_kv, k * n_starts)
    model.run_with_hooks(resid[split.starts, : split.s].repeat(k, 1, 1), start_at_layer=layer, stop_at_layer=L,
                         fwd_hooks=hooks_at(slice(0, split.s)), past_kv_cache=captured)
    index = (torch.arange(k, device=resid.device)[:, None] * n_starts + split.inverse[None]).flatten()
    out = model.run_with_hooks(resid[:, split.s:].repeat(k, 1, 1), start_at_layer=layer, stop_at_layer=L,
                               fwd_hooks=hooks_at(slice(split.s, S)), past_kv_cache=_GatheredKVCache(captured, index))
    return out[:, -1]
