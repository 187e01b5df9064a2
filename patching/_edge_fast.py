"""The fast path of :func:`patching.edge_patch`: a patched forward as a plain loop over block pieces.

The hook path runs each chunk of edges through TransformerLens' ``run_with_hooks``
from the receiver's layer on, with per-head q/k/v inputs for every head of that layer
and every position in every layer above. The result depends on much less, and this
module computes only that (same TransformerLens modules, so the numbers are the same
up to float rounding; ``tests/patching/test_edge_patching.py`` checks both paths
against a plain hook implementation):

* **MLP receivers** change only the MLP's input: the layer's attention is not run at all;
  the layer's output is ``resid_mid(ref) + MLP(ln2(resid_mid(ref) + change))``.
* **Head receivers** (q/k/v of one head) need per-head inputs only for the kind that is
  patched in the chunk (q, k or v); the other kinds use the normalized reference
  residual, broadcast over heads without a copy.
* **The last layer** only has to produce the END position, which the metric reads: its
  keys/values (all positions) come from its attention; its norm after attention, the MLP
  and the residual sums run at END only.
* **Layers in between** run as plain blocks (grouped K/V, no per-head inputs), called
  directly rather than through ``HookedTransformer.forward``.

Only sequential pre-norm blocks qualify (:func:`fast_path_problem`); :func:`patching.edge_patch`
uses the hook path otherwise.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer

from circuits.graph import GraphLayout
from patching import _runs
from patching.edge_runs import plain_blocks


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
    return None if kv is None else _runs.TiledKVCache(kv, times)[layer]


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
    kv_split, end_only: bool,
) -> Float[Tensor, "rows pos d_model"]:
    """Layer ``layer``'s output when edge j adds ``change[j]`` to the ``receivers[j] = (kind, head)`` input only.

    Runs under :func:`patching.edge_runs.edge_mode` (per-head q/k/v inputs, K/V per query head);
    ``kv_split`` holds the prefix's keys/values per query head.
    """
    block, cfg = model.blocks[layer], model.cfg
    k, B, P, d = change.shape
    H = cfg.n_heads
    x = resid_pre.repeat(k, 1, 1)
    normed = block.ln1(x)[:, :, None].expand(k * B, P, H, d)  # the reference input of every head
    inputs = {}
    for kind in ("q", "k", "v"):
        js = [j for j, (x_kind, _) in enumerate(receivers) if x_kind == kind]
        if not js:
            inputs[kind] = normed
            continue
        patched = x[:, :, None].repeat(1, 1, H, 1).view(k, B, P, H, d)
        heads = torch.tensor([receivers[j][1] for j in js], device=x.device)
        rows = torch.tensor(js, device=x.device)
        patched[rows, :, :, heads] += change[rows]
        inputs[kind] = block.ln1(patched.view(k * B, P, H, d))
    attn = block.attn(query_input=inputs["q"], key_input=inputs["k"], value_input=inputs["v"],
                      past_kv_cache_entry=_entry(kv_split, layer, k))
    if end_only:
        attn, x = attn[:, -1:], x[:, -1:]
    resid_mid = x + _attn_added(model, block, attn)
    return _mlp_on(block, resid_mid, resid_mid)


def end_residual_above(
    model: HookedTransformer, layer: int, resid: Float[Tensor, "rows pos d_model"], kv_plain,
) -> Float[Tensor, "rows d_model"]:
    """Final residual at END after running layers ``layer + 1 ..`` on ``resid`` (layer ``layer``'s output)."""
    n_layers = model.cfg.n_layers
    if layer == n_layers - 1:
        return resid[:, -1]
    times = resid.shape[0] // (kv_plain[0].past_keys.shape[0] if kv_plain is not None else 1)
    with plain_blocks(model):
        for above in range(layer + 1, n_layers - 1):
            resid = model.blocks[above](resid, past_kv_cache_entry=_entry(kv_plain, above, times))
        block = model.blocks[n_layers - 1]
        normed = block.ln1(resid)
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
