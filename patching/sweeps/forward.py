"""Forward passes every patching method shares: cached runs, a shared prefix's keys/values, END-only block pieces.

* **Cached runs**: :func:`end_cache` / :func:`full_cache` keep chosen activations of one run
  (at END only, or everywhere) and the final END residual.
* **Shared prefixes**: reference and counterfactual twins start with the same tokens (the
  few-shot lines); every activation there is the same in both runs, so
  :func:`circuits.prefix_cache.prefix_kv_cache` runs the prefix once and :func:`suffix_cache` /
  :class:`circuits.prefix_cache.TiledKVCache` run only what follows.
* **END-only block pieces**: :func:`attn_out_from_z` and :func:`mlp_out_rows` recompute what an
  attention layer or an MLP adds at one position, for fast paths that only need END.
* **Memory budgets**: :func:`rows_per_chunk` and :func:`chunks` size batched forwards.
* **Weight layout**: :func:`transposed_weight_storage` stores the MLP and output-projection weights the
  way TransformerLens multiplies them, so its per-call ``.T.contiguous()`` copies become no-ops.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer, TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry
from transformer_lens import utils as tl_utils

from circuits.prefix_cache import TiledKVCache, run_after_shared_prefix

@torch.no_grad()
def end_cache(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], names: Sequence[str], *, share_prefix: bool = True
) -> tuple[dict[str, Tensor], Float[Tensor, "batch d_model"]]:
    """Run ``tokens`` once; keep the END position of each named activation and the final END residual.

    Slicing inside the hook keeps memory at one position per activation. With ``share_prefix``, the
    leading positions every row shares (a template's few-shot lines) run once for the batch
    (:func:`prefix_kv_cache`), and only the rest per row; END values equal the plain run's up to
    float rounding.
    """
    store: dict[str, Tensor] = {}

    def keep(act, *, hook):
        store[hook.name] = act[:, -1].clone()

    hooks = [(n, keep) for n in names]
    if share_prefix:
        resid, _ = run_after_shared_prefix(model, tokens, hooks)
    else:
        resid = model.run_with_hooks(tokens, fwd_hooks=hooks, stop_at_layer=model.cfg.n_layers)
    return store, resid[:, -1]


@torch.no_grad()
def full_cache(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], names: Sequence[str]
) -> tuple[dict[str, Tensor], Float[Tensor, "batch d_model"]]:
    """Run ``tokens`` once; keep every named activation at all positions, and the final END residual."""
    store: dict[str, Tensor] = {}

    def keep(act, *, hook):
        store[hook.name] = act.clone()

    resid = model.run_with_hooks(tokens, fwd_hooks=[(n, keep) for n in names], stop_at_layer=model.cfg.n_layers)
    return store, resid[:, -1]


def shared_prefix_length(tokens: Int[Tensor, "batch pos"], cf_tokens: Int[Tensor, "batch pos"]) -> int:
    """Positions before the first one where any reference prompt differs from its counterfactual twin.

    Attention is causal, so every activation at these positions is the same in both runs: a patch
    there changes nothing. At least the END position is left outside the prefix.
    """
    differs = (tokens != cf_tokens).any(0)
    first = int(differs.nonzero()[0]) if differs.any() else tokens.shape[1]
    return min(first, tokens.shape[1] - 1)


@torch.no_grad()
def prefix_run(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch prefix"],
    names: Sequence[str],
    known_kv: Sequence[TransformerLensKeyValueCacheEntry] | None = None,
) -> tuple[dict[str, Tensor], list[TransformerLensKeyValueCacheEntry]]:
    """One forward of a token prefix: the named activations and every layer's keys/values at every position.

    ``known_kv``: the keys/values of the first positions of ``tokens`` (one row shared by all, or one per row),
    already computed: only the positions after them run, and the named activations cover only those.
    """
    store: dict[str, Tensor] = {}

    def keep(act, *, hook):
        store[hook.name] = act.clone()

    cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, tokens.shape[0])
    known = 0
    if known_kv is not None:
        known = known_kv[0].past_keys.shape[1]
        for entry, given in zip(cache.entries, known_kv):
            rows = (tokens.shape[0], -1, -1, -1)
            entry.past_keys, entry.past_values = given.past_keys.expand(rows), given.past_values.expand(rows)
    model.run_with_hooks(model(tokens, stop_at_layer=0)[:, known:], start_at_layer=0, stop_at_layer=model.cfg.n_layers,
                         fwd_hooks=[(n, keep) for n in names], past_kv_cache=cache)
    return store, cache.entries


@torch.no_grad()
def suffix_cache(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    names: Sequence[str],
    prefix_kv: Sequence[TransformerLensKeyValueCacheEntry] | None = None,
) -> tuple[dict[str, Tensor], Float[Tensor, "batch d_model"]]:
    """:func:`full_cache` of the positions after a prefix whose keys/values are ``prefix_kv`` (all if None).

    Valid when ``tokens`` start with the prefix that ``prefix_kv`` was computed from.
    """
    if prefix_kv is None:
        return full_cache(model, tokens, names)
    prefix = prefix_kv[0].past_keys.shape[1]
    store: dict[str, Tensor] = {}

    def keep(act, *, hook):
        store[hook.name] = act.clone()

    embedded = model(tokens, stop_at_layer=0)[:, prefix:]
    resid = model.run_with_hooks(embedded, start_at_layer=0, stop_at_layer=model.cfg.n_layers,
                                 fwd_hooks=[(n, keep) for n in names], past_kv_cache=TiledKVCache(prefix_kv, 1))
    return store, resid[:, -1]


def act_names(kind: str, layers: Sequence[int]) -> list[str]:
    """TransformerLens hook names of ``kind`` (``"z"``, ``"mlp_out"``, ``"resid_pre"``, ...) for ``layers``."""
    return [tl_utils.get_act_name(kind, layer) for layer in layers]


# ---------------------------------------------------------------------------- END-only block pieces


def _norm_rows(norm, x: Float[Tensor, "rows d_model"]) -> Float[Tensor, "rows d_model"]:
    return norm(x[:, None, :])[:, 0, :]


def attn_out_from_z(
    model: HookedTransformer, layer: int, z: Float[Tensor, "rows head_index d_head"]
) -> Float[Tensor, "rows d_model"]:
    """What attention layer ``layer`` adds to the residual, given all its heads' z at one position.

    Same operations as TransformerLens' attention (``F.linear`` over the
    flattened heads, plus ``ln1_post`` for models with norms after attention,
    like gemma-3): the added output is a function of all heads' z at that
    position only, so freezing or swapping z is exact even through the norm.
    """
    block = model.blocks[layer]
    W_O = block.attn.W_O  # [head_index, d_head, d_model]
    w = W_O.reshape(-1, W_O.shape[-1]).T.contiguous()
    out = F.linear(z.reshape(z.shape[0], -1).to(w.dtype), w, block.attn.b_O)
    if model.cfg.use_normalization_before_and_after:
        out = _norm_rows(block.ln1_post, out)
    return out


def mlp_out_rows(model: HookedTransformer, layer: int, resid_mid: Float[Tensor, "rows d_model"]) -> Float[Tensor, "rows d_model"]:
    """What MLP ``layer`` adds to the residual at the given rows (``ln2``, MLP, and ``ln2_post`` if any)."""
    block = model.blocks[layer]
    return block.apply_mlp(block.ln2(resid_mid[:, None, :]))[:, 0, :]


def check_sequential_blocks(model: HookedTransformer) -> str | None:
    """Why the END-only fast path cannot reproduce this architecture's blocks, or None when it can."""
    from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

    cfg = model.cfg
    if cfg.parallel_attn_mlp:
        return "parallel attention/MLP blocks"
    if cfg.original_architecture in POST_NORM_ARCHITECTURES:
        return "post-norm blocks"
    if cfg.use_attn_result or cfg.load_in_4bit:
        return "use_attn_result / 4-bit weights"
    return None


def chunks(n_items: int, per_chunk: int) -> Iterator[slice]:
    """Consecutive slices of at most ``per_chunk`` items."""
    per_chunk = max(1, per_chunk)
    for start in range(0, n_items, per_chunk):
        yield slice(start, min(start + per_chunk, n_items))


def rows_per_chunk(model: HookedTransformer, memory_mb: float, n_pos: int = 1, cached_pos: int = 0) -> int:
    """How many prompt rows of ``n_pos`` positions fit a forward in about ``memory_mb`` of activations.

    ``cached_pos``: positions whose keys/values come from a tiled prefix cache (:class:`TiledKVCache`).
    """
    cfg = model.cfg
    # Rough live-activation bytes per position: residual-width tensors, MLP hidden, attention scores.
    width = 12 * cfg.d_model + 3 * (cfg.d_mlp or 0) + 2 * cfg.n_heads * (n_pos + cached_pos) + 4 * cfg.n_heads * cfg.d_head
    # one layer's tiled prefix keys and values, plus TransformerLens' concatenation with the new ones
    kv_width = 4 * (cfg.n_key_value_heads or cfg.n_heads) * cfg.d_head
    per_row = (n_pos * width + (cached_pos + n_pos) * kv_width) * torch.finfo(cfg.dtype).bits // 8
    return max(1, int(memory_mb * 2**20 // max(per_row, 1)))


@contextlib.contextmanager
def transposed_weight_storage(model: HookedTransformer) -> Iterator[HookedTransformer]:
    """Inside the block, the MLP weights and ``W_O`` are stored transposed (same values, other strides).

    TransformerLens multiplies ``F.linear(x, W.T.contiguous())`` in its MLPs and rearranges ``W_O`` to
    ``[d_model, head * d_head]`` then ``.contiguous()`` at every call: a copy of every weight matrix per
    forward, which dominates forwards of few tokens (gemma-3-270m: ~15 MB per layer). With the storage
    transposed, those calls return the stored tensor itself, so the products are the same, bit for bit,
    without the copies. The usual layout is restored on exit, also on an exception; blocks nest (an inner one
    leaves the weights an outer one stored).
    """
    params = []  # a weight already stored transposed (an enclosing block) is left to that block
    for block in model.blocks:
        mlp = getattr(block, "mlp", None)
        for name in ("W_gate", "W_in", "W_out"):
            p = getattr(mlp, name, None)
            if isinstance(p, torch.nn.Parameter) and p.ndim == 2 and not p.data.T.is_contiguous():
                params.append((p, p.data.T.contiguous().T))
        W_O = getattr(block.attn, "W_O", None)
        if isinstance(W_O, torch.nn.Parameter) and W_O.ndim == 3 and not W_O.data.permute(2, 0, 1).is_contiguous():
            params.append((W_O, W_O.data.permute(2, 0, 1).contiguous().permute(1, 2, 0)))
    try:
        for p, stored in params:
            p.data = stored
        yield model
    finally:
        for p, _ in params:
            p.data = p.data.contiguous()


@contextlib.contextmanager
def frozen_weights(model: HookedTransformer) -> Iterator[HookedTransformer]:
    """The model's parameters take no gradient inside the block (a featurizer trains, the model does not)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p in trainable:
            p.requires_grad_(True)
