"""Shared token prefixes run once: their keys/values, computed once and tiled over a batch.

Prompts of one template start with the same few-shot lines; every activation there is the
same in every row, so a forward can run those positions once (:func:`prefix_kv_cache`,
:class:`PrefixCache`) and only the later positions per row, reading the prefix's keys and
values through :class:`TiledKVCache`. Used by the scoring in :mod:`circuits.analyze` and by the
fast paths of :mod:`patching`.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Sequence

import torch
from jaxtyping import Int
from torch import Tensor
from transformer_lens import HookedTransformer, TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry


@torch.no_grad()
def prefix_kv_cache(model: HookedTransformer, tokens: Int[Tensor, "batch prefix"]) -> list[TransformerLensKeyValueCacheEntry]:
    """Every layer's keys and values over a token prefix (one forward of the prefix).

    The blocks start from the embedding (``start_at_layer=0``) rather than from tokens, which
    skips TransformerLens' tokenizer-based attention mask: the prompts are unpadded.
    """
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, tokens.shape[0])
    model(model(tokens, stop_at_layer=0), start_at_layer=0, stop_at_layer=model.cfg.n_layers, past_kv_cache=cache)
    return cache.entries


class PrefixCache:
    """Keys/values of token prefixes, each computed once; a prefix that extends a cached one runs only the rest.

    Layouts of one template share their few-shot prefix and differ after it, so a fast path that
    meets many layouts computes the few-shot lines once (:func:`prefix_kv_cache` semantics). At most
    ``max_entries`` prefixes are kept (least recently used dropped). :func:`model_prefix_cache` gives
    the one cache of a model, emptied whenever a weight changes.
    """

    def __init__(self, model: HookedTransformer, max_entries: int = 64):
        self.model, self.max_entries = model, max_entries
        self.entries: "OrderedDict[tuple[int, ...], list[TransformerLensKeyValueCacheEntry]]" = OrderedDict()

    def __call__(self, tokens: Int[Tensor, "1 prefix"]) -> list[TransformerLensKeyValueCacheEntry]:
        key = tuple(tokens[0].tolist())
        if key in self.entries:
            self.entries.move_to_end(key)
        else:
            while len(self.entries) >= self.max_entries:
                self.entries.popitem(last=False)
            base = max((k for k in self.entries if len(k) < len(key) and key[:len(k)] == k), key=len, default=None)
            if base is None:
                self.entries[key] = prefix_kv_cache(self.model, tokens)
            else:
                model = self.model
                cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, 1)
                for entry, known in zip(cache.entries, self.entries[base]):
                    entry.past_keys, entry.past_values = known.past_keys, known.past_values
                with torch.no_grad():
                    model(model(tokens, stop_at_layer=0)[:, len(base):], start_at_layer=0,
                          stop_at_layer=model.cfg.n_layers, past_kv_cache=cache)
                self.entries[key] = cache.entries
        return self.entries[key]


_MODEL_CACHES: "weakref.WeakKeyDictionary[HookedTransformer, tuple[tuple, PrefixCache]]" = weakref.WeakKeyDictionary()


def model_prefix_cache(model: HookedTransformer) -> PrefixCache:
    """The model's shared :class:`PrefixCache`, new whenever a weight, the device or the dtype changed since last asked.

    While hooks are attached to the model (``with model.hooks(...)``, ``add_hook``), a prefix's keys and values
    depend on them: a fresh cache that lives for the one call is returned instead.
    """
    if any(point.fwd_hooks for point in model.hook_dict.values()):
        return PrefixCache(model)
    state = (model.cfg.device, model.cfg.dtype, tuple((id(p), p._version) for p in model.parameters()))
    known = _MODEL_CACHES.get(model)
    if known is None or known[0] != state:
        known = _MODEL_CACHES[model] = (state, PrefixCache(model))
    return known[1]


class TiledKVCache:
    """A prefix's per-layer keys/values tiled ``times`` along the batch (row ``i * batch + b``), built lazily.

    A prefix of batch 1 (one prompt's, shared by all rows) is broadcast as a view instead of copied.

    TransformerLens reads ``past_kv_cache[layer]`` once per block, so building each layer's
    frozen tiled entry on access keeps one layer's copy alive at a time instead of all of them
    (for a 7B model and a long few-shot prefix the full set would be many GB per chunk).
    """

    def __init__(self, entries: Sequence[TransformerLensKeyValueCacheEntry], times: int):
        self.entries, self.times = list(entries), times

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, layer: int) -> TransformerLensKeyValueCacheEntry:
        e = self.entries[layer]
        if self.times == 1:  # the rows as they are, frozen so the forward does not append to them
            return TransformerLensKeyValueCacheEntry(e.past_keys, e.past_values, frozen=True)
        if e.past_keys.shape[0] == 1:  # one shared prefix: a broadcast view, no copy
            return TransformerLensKeyValueCacheEntry(e.past_keys.expand(self.times, -1, -1, -1),
                                                     e.past_values.expand(self.times, -1, -1, -1), frozen=True)
        return TransformerLensKeyValueCacheEntry(e.past_keys.repeat(self.times, 1, 1, 1),
                                                 e.past_values.repeat(self.times, 1, 1, 1), frozen=True)


class StackedKVCache:
    """Several prefixes' keys/values, each tiled its own number of times, stacked along the batch and built per
    layer on access (as :class:`TiledKVCache`): the rows of one forward that runs several prompt sets, each set
    ``times`` over (row order: the parts in turn, each part's tiles as in :class:`TiledKVCache`)."""

    def __init__(self, parts: Sequence[tuple[Sequence[TransformerLensKeyValueCacheEntry], int]]):
        self.parts = [TiledKVCache(entries, times) for entries, times in parts]

    def __len__(self) -> int:
        return len(self.parts[0])

    def __getitem__(self, layer: int) -> TransformerLensKeyValueCacheEntry:
        tiled = [part[layer] for part in self.parts]
        return TransformerLensKeyValueCacheEntry(torch.cat([e.past_keys for e in tiled]),
                                                 torch.cat([e.past_values for e in tiled]), frozen=True)


MIN_SHARED_PREFIX = 4  # shorter shared prefixes are run per row: the saving would not pay for the extra forward


def batch_common_prefix_length(tokens: Int[Tensor, "batch pos"], limit: int | None = None) -> int:
    """Leading positions (at most ``limit``, at most all but the last) where every row has the same token."""
    limit = tokens.shape[1] - 1 if limit is None else min(limit, tokens.shape[1] - 1)
    differs = (tokens[:, :limit] != tokens[:1, :limit]).any(0)
    return int(differs.nonzero()[0]) if differs.any() else max(limit, 0)


@torch.no_grad()
def run_after_shared_prefix(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    fwd_hooks: Sequence = (),
    *,
    limit: int | None = None,
    prefixes: PrefixCache | None = None,
) -> tuple[Tensor, int]:
    """The residual stream after the last block at the positions after the prefix every row shares, and its length.

    The shared prefix (at most ``limit`` positions; shorter than :data:`MIN_SHARED_PREFIX`, or a single
    row: none) runs once; ``fwd_hooks`` see only the later positions, END last, as in a plain run.
    ``prefixes`` (default: the model's :func:`model_prefix_cache`) keeps keys/values across calls. Values
    equal the plain run's up to float rounding.
    """
    shared = batch_common_prefix_length(tokens, limit) if tokens.shape[0] > 1 else 0
    if shared < MIN_SHARED_PREFIX:
        return model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks), stop_at_layer=model.cfg.n_layers), 0
    kv = (prefixes or model_prefix_cache(model))(tokens[:1, :shared])
    x = model(tokens, stop_at_layer=0)[:, shared:]
    resid = model.run_with_hooks(x, start_at_layer=0, stop_at_layer=model.cfg.n_layers, fwd_hooks=list(fwd_hooks),
                                 past_kv_cache=TiledKVCache(kv, tokens.shape[0]))
    return resid, shared
