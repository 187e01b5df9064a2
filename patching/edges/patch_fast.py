"""The fast path of :func:`patching.edges.edge_patch`: a patched forward as a plain loop over block pieces.

The hook path runs each chunk of edges through TransformerLens' ``run_with_hooks``
from the receiver's layer on, with per-head q/k/v inputs for every head of that layer
and every position in every layer above. The result depends on much less, and this
module computes only that (same TransformerLens modules, so the numbers are the same
up to float rounding; ``tests/patching/edges/test_patch_fast.py`` checks both paths
against a plain hook implementation):

* **MLP receivers** change only the MLP's input: the layer's attention is not run at all;
  the layer's output is ``resid_mid(ref) + MLP(ln2(resid_mid(ref) + change))``.
* **Head receivers** (q/k/v of one head): the attention runs on the normalized reference
  residual, and only the receiving head's projection (``attn.hook_{q,k,v}``, before any
  q/k norm and rotary) is replaced by the projection of its normalized patched input;
  no per-head copies of the residual are normalized and projected.
* **The last layer** only has to produce the END position, which the metric reads: its
  keys/values (all positions) come from its attention; its norm after attention, the MLP
  and the residual sums run at END only.
* **Layers in between** run as plain blocks (grouped K/V, no per-head inputs), called
  directly rather than through ``HookedTransformer.forward``.
* **Rotary on the prefix's keys once per layer**: TransformerLens caches keys *before*
  rotary and rotates every cached key again at every call (``apply_rotary(k, 0)`` over the
  whole key sequence), i.e. once per patched row per layer. Rotary is elementwise per
  position, so rotating only the new positions and prepending the prefix's keys rotated
  once (untiled, then tiled) gives the same tensor bit for bit (:func:`prefix_rotary_once`).
  ``rotate_prefix_once=False`` (an argument of :func:`patching.edges.edge_patch`) keeps TransformerLens' way,
  to time the two side by side.

Only sequential pre-norm blocks qualify (:func:`fast_path_problem`); :func:`patching.edges.edge_patch`
uses the hook path otherwise.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Optional, Sequence

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer

from circuits.graph import GraphLayout
from circuits.prefix_cache import TiledKVCache
from patching.edges.engine import plain_blocks


def fast_path_problem(model: HookedTransformer) -> Optional[str]:
    """Why the fast path cannot reproduce this model's blocks, or None when it can."""
    cfg = model.cfg
    if cfg.parallel_attn_mlp:
        return "parallel attention/MLP blocks (the MLP reads resid_pre)"
    if cfg.positional_embedding_type == "shortformer":
        return "shortformer positional embeddings"
    if cfg.load_in_4bit:
        return "4-bit weights"
    return None


def _entry(kv, layer: int, times: int):
    return None if kv is None else TiledKVCache(kv, times)[layer]


@contextmanager
def prefix_rotary_once(attn, kv, layer: int, times: int, *, enabled: bool = True):
    """While ``attn`` runs with layer ``layer``'s prefix cache of ``kv`` tiled ``times``, rotary of its keys
    rotates only the new positions and prepends the prefix's keys rotated once (same values, bit for bit).

    TransformerLens' attention calls ``self.apply_rotary(k, 0, mask)`` on the cached prefix keys plus the
    new ones; this shadows that method on the instance for the duration of the call only. ``enabled=False``
    leaves TransformerLens' rotary as it is.
    """
    if kv is None or not enabled or attn.cfg.positional_embedding_type != "rotary":
        yield
        return
    original = attn.apply_rotary
    past = kv[layer].past_keys
    n_prefix = past.shape[1]
    rotated = original(past, 0, None)
    rotated = rotated.expand(times, -1, -1, -1) if past.shape[0] == 1 else rotated.repeat(times, 1, 1, 1)

    def apply_rotary(x, past_kv_pos_offset: int = 0, attention_mask=None):
        if past_kv_pos_offset != 0 or attention_mask is not None or x.shape[1] <= n_prefix:
            return original(x, past_kv_pos_offset, attention_mask)  # the queries' call (offset = prefix length)
        return torch.cat([rotated.to(x.device), original(x[:, n_prefix:], n_prefix, None)], dim=1)

    attn.apply_rotary = apply_rotary
    try:
        yield
    finally:
        del attn.apply_rotary


def _mlp_on(block, resid_mid: Tensor, mlp_in: Tensor) -> Tensor:
    """Block output: the residual ``resid_mid`` plus the MLP (with ``ln2``, and ``ln2_post`` if any) of ``mlp_in``."""
    return resid_mid + block.apply_mlp(block.ln2(mlp_in))


def _attn_added(model: HookedTransformer, block, attn_out: Tensor) -> Tensor:
    return block.ln1_post(attn_out) if model.cfg.use_normalization_before_and_after else attn_out


def mlp_receiver_layer(
    model: HookedTransformer, layer: int, resid_mid: Float[Tensor, "batch pos d_model"],
    change: Float[Tensor, "edge batch pos d_model"], end_only: bool,
) -> Float[Tensor, "rows pos d_model"]:
    """Layer ``layer``'s output, rows ``j * batch + b``, when edge j adds ``change[j]`` to the MLP's input only."""
    k = change.shape[0]
    if end_only:
        resid_mid, change = resid_mid[:, -1:], change[:, :, -1:]
    mlp_in = (resid_mid[None] + change).flatten(0, 1)
    return _mlp_on(model.blocks[layer], resid_mid.repeat(k, 1, 1), mlp_in)


def head_receiver_layer(
    model: HookedTransformer, layer: int, resid_pre: Float[Tensor, "batch pos d_model"],
    receivers: Sequence[tuple[str, int]], change: Float[Tensor, "edge batch pos d_model"],
    kv_split, end_only: bool, *, rotate_prefix_once: bool = True,
) -> Float[Tensor, "rows pos d_model"]:
    """Layer ``layer``'s output when edge j adds ``change[j]`` to the ``receivers[j] = (kind, head)`` input only.

    The attention runs on the reference normalized residual with K/V per query head
    (``ungroup_grouped_query_attention``; ``kv_split`` holds the prefix's keys/values per
    query head); at ``attn.hook_{q,k,v}``, right after the projection (before any q/k norm
    and rotary), each patched row's receiving head gets the projection of its own
    normalized patched input instead. That is what per-head inputs compute, without
    normalizing and projecting a copy of the residual for every head. ``rotate_prefix_once``: see
    :func:`prefix_rotary_once`.
    """
    block, cfg = model.blocks[layer], model.cfg
    attn = block.attn
    k, B, P, d = change.shape
    x = resid_pre.repeat(k, 1, 1)
    normed = block.ln1(x)
    patched = block.ln1((resid_pre[None] + change).flatten(0, 1)).view(k, B, P, d)
    weights = {"q": (attn.W_Q, attn.b_Q), "k": (attn.W_K, attn.b_K), "v": (attn.W_V, attn.b_V)}
    hooks = []
    for kind, (W, b) in weights.items():
        js = [j for j, (x_kind, _) in enumerate(receivers) if x_kind == kind]
        if not js:
            continue
        rows = torch.tensor(js, device=x.device)
        heads = torch.tensor([receivers[j][1] for j in js], device=x.device)
        projected = torch.einsum("nbpd,ndh->nbph", patched[rows], W[heads].to(patched.dtype)) + b[heads][:, None, None]
        hooks.append((f"blocks.{layer}.attn.hook_{kind}", _replace_heads(rows, heads, projected, k)))
    split_before = cfg.use_split_qkv_input
    model.set_use_split_qkv_input(False)
    try:
        with model.hooks(fwd_hooks=hooks), prefix_rotary_once(attn, kv_split, layer, k, enabled=rotate_prefix_once):
            out = attn(query_input=normed, key_input=normed, value_input=normed,
                       past_kv_cache_entry=_entry(kv_split, layer, k))
    finally:
        model.set_use_split_qkv_input(split_before)
    if end_only:
        out, x = out[:, -1:], x[:, -1:]
    resid_mid = x + _attn_added(model, block, out)
    return _mlp_on(block, resid_mid, resid_mid)


def _replace_heads(rows: Tensor, heads: Tensor, projected: Tensor, k: int):
    """Hook: row block ``rows[i]`` (one edge's prompts) of head ``heads[i]`` becomes ``projected[i]``."""

    def replace(act, *, hook):
        act = act.reshape(k, -1, *act.shape[1:]).clone()
        act[rows, :, :, heads] = projected.to(act.dtype)
        return act.flatten(0, 1)

    return replace


def end_residual_above(
    model: HookedTransformer, layer: int, resid: Float[Tensor, "rows pos d_model"], kv_plain, *,
    rotate_prefix_once: bool = True,
) -> Float[Tensor, "rows d_model"]:
    """Final residual at END after running layers ``layer + 1 ..`` on ``resid`` (layer ``layer``'s output);
    ``rotate_prefix_once``: see :func:`prefix_rotary_once`."""
    n_layers = model.cfg.n_layers
    if layer == n_layers - 1:
        return resid[:, -1]
    times = resid.shape[0] // (kv_plain[0].past_keys.shape[0] if kv_plain is not None else 1)
    with plain_blocks(model):
        for above in range(layer + 1, n_layers - 1):
            with prefix_rotary_once(model.blocks[above].attn, kv_plain, above, times, enabled=rotate_prefix_once):
                resid = model.blocks[above](resid, past_kv_cache_entry=_entry(kv_plain, above, times))
        block = model.blocks[n_layers - 1]
        normed = block.ln1(resid)
        with prefix_rotary_once(block.attn, kv_plain, n_layers - 1, times, enabled=rotate_prefix_once):
            attn = block.attn(query_input=normed, key_input=normed, value_input=normed,
                              past_kv_cache_entry=_entry(kv_plain, n_layers - 1, times))
        resid_mid = resid[:, -1:] + _attn_added(model, block, attn[:, -1:])
        return _mlp_on(block, resid_mid, resid_mid)[:, 0]


def receiver_kind(layout: GraphLayout, backward: int) -> tuple[int, Optional[str], Optional[int]]:
    """(layer, "q"/"k"/"v" or None for the MLP, head or None) of a non-logits receiver."""
    per_layer = 3 * layout.n_heads + 1
    layer, offset = divmod(backward, per_layer)
    if offset == 3 * layout.n_heads:
        return layer, None, None
    kind, head = divmod(offset, layout.n_heads)
    return layer, "qkv"[kind], head
