"""Senders' outputs and receivers' inputs of a model's edge graph (:mod:`circuits.graph`), by hooks.

An edge ``s -> r`` carries sender ``s``'s *output* into receiver ``r``'s *input*. For
edge patching and circuit evaluation to be exact, the outputs must add up to the
inputs: every receiver's input must be the sum of the outputs of the senders that
feed it (plus constant biases). This module fixes what a sender's output is so that
this holds on every model it accepts, including gemma-3's norms after attention.

**The convention.** A sender's output is its contribution to the residual stream *as
computed in the run that produced it*:

* ``input``: what enters the first block, ``blocks.0.hook_resid_pre`` (token embedding,
  plus positional embedding where the model has one, with any embedding scale applied);
* head ``a{L}.h{H}``: ``z_H · W_O[H]`` (TransformerLens' ``hook_result[..., H, :]``,
  computed here from ``hook_z``, which is exact and avoids the
  ``[batch, pos, head, d_head, d_model]`` product TL builds for ``hook_result``). On
  models with a norm after attention (``cfg.use_normalization_before_and_after``,
  gemma-2/3) the layer adds ``RMSNorm(Σ_H result_H) = Σ_H result_H · w / scale``, with
  one ``scale = sqrt(mean(x²) + eps)`` per position shared by all heads of the layer
  (``blocks.L.ln1_post.hook_scale``). A head's output is then ``result_H · w / scale``
  with *that run's* scale: the heads' outputs sum exactly to what the layer added.
* MLP ``m{L}``: ``blocks.L.hook_mlp_out`` (TL applies ``ln2_post`` before this hook).

The attention bias ``b_O`` is not a node: it is the same in every run of a model
without post-norms (it cancels in differences), and zero in gemma; post-norm models
with a non-zero ``b_O`` are refused. With these outputs, running the full graph is
the model, the empty graph with counterfactual ablation is the counterfactual run,
and an out-of-circuit edge carries exactly what the counterfactual run's sender put
into the residual stream. Without post-norms this is hannamw/EAP-IG's convention.

**Receivers** (``backward`` nodes of :class:`circuits.graph.GraphLayout`) are read and
written at TransformerLens hook points that exist only with four config flags, which
:func:`edge_mode` sets for the duration of a ``with`` block (and restores, also on
exceptions): ``use_split_qkv_input`` (one copy of the residual per head for q, k, v:
``blocks.L.hook_{q,k,v}_input``), ``ungroup_grouped_query_attention`` (k/v inputs per
*query* head under GQA/MQA), ``use_hook_mlp_in`` (``blocks.L.hook_mlp_in``) and,
optionally, ``use_attn_result`` (``hook_result``, which EAP-IG reads; this module does
not need it). ``logits`` is read at the final residual, ``blocks.{n-1}.hook_resid_post``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer, TransformerLensKeyValueCacheEntry
from transformer_lens import utils as tl_utils

from circuits.errors import InputError
from circuits.graph import QKV, GraphLayout
from circuits.prefix_cache import StackedKVCache, TiledKVCache, prefix_kv_cache
from patching.sweeps import forward

#: The config flags :func:`edge_mode` sets, mapped to TransformerLens' setter for each.
EDGE_FLAGS = {
    "use_split_qkv_input": "set_use_split_qkv_input",
    "ungroup_grouped_query_attention": "set_ungroup_grouped_query_attention",
    "use_hook_mlp_in": "set_use_hook_mlp_in",
    "use_attn_result": "set_use_attn_result",
}


class UnsupportedModelError(InputError):
    """The model's blocks do not decompose into the edge graph's senders and receivers."""


def edge_model_problem(model: HookedTransformer) -> Optional[str]:
    """Why the edge graph cannot represent this model exactly, or None when it can."""
    from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

    cfg = model.cfg
    if cfg.attn_only:
        return "it is attention-only (the graph has an MLP node per layer)"
    if cfg.original_architecture in POST_NORM_ARCHITECTURES:
        return f"{cfg.original_architecture} normalizes the residual after each block, so outputs do not add up"
    if cfg.positional_embedding_type == "shortformer":
        return "shortformer positional embeddings enter q/k, not the residual stream"
    if cfg.use_attn_in:
        return "cfg.use_attn_in is set (turn it off: edge runs split q/k/v inputs instead)"
    if cfg.use_normalization_before_and_after:
        if not str(cfg.normalization_type).startswith("RMS"):
            return f"its norms after attention/MLP are {cfg.normalization_type}, not RMSNorm (only RMS post-norms decompose per head)"
        if any(bool(block.attn.b_O.detach().ne(0).any()) for block in model.blocks):
            return "it has post-attention norms and a non-zero attention bias b_O, which the norm does not split per head"
    return None


def check_edge_model(model: HookedTransformer) -> None:
    """Raise :class:`UnsupportedModelError` when :func:`edge_model_problem` finds one."""
    problem = edge_model_problem(model)
    if problem is not None:
        raise UnsupportedModelError(
            f"Edge circuits need a model whose residual stream is a sum of head, MLP and embedding outputs; "
            f"this one is not: {problem}. Use a pre-norm model (gpt2, llama, gemma, ...)."
        )


@contextlib.contextmanager
def edge_mode(model: HookedTransformer, *, attn_result: bool = False) -> Iterator[HookedTransformer]:
    """Ready ``model`` for edge work inside a ``with`` block; its config is restored on exit.

    Sets ``use_split_qkv_input``, ``ungroup_grouped_query_attention`` and ``use_hook_mlp_in``
    (and ``use_attn_result`` when ``attn_result=True``, as EAP-IG expects), and stores the weights the
    way TransformerLens multiplies them (:func:`patching.sweeps.forward.transposed_weight_storage`: the same
    numbers, without a copy of every weight per forward). Refuses a model
    the edge graph cannot represent (:func:`check_edge_model`). Nested blocks are fine.
    """
    check_edge_model(model)
    wanted = {"use_split_qkv_input": True, "ungroup_grouped_query_attention": True, "use_hook_mlp_in": True}
    if attn_result:
        wanted["use_attn_result"] = True
    before = {flag: getattr(model.cfg, flag) for flag in wanted}
    try:
        for flag, value in wanted.items():
            _set_flag(model, flag, value)
        with forward.transposed_weight_storage(model):
            yield model
    finally:
        for flag, value in before.items():
            _set_flag(model, flag, value)


def _set_flag(model: HookedTransformer, flag: str, value: bool) -> None:
    setter = getattr(model, EDGE_FLAGS[flag], None)
    if setter is not None:
        setter(value)
    else:  # older TransformerLens: the components read the shared cfg object
        setattr(model.cfg, flag, value)


# ---------------------------------------------------------------------------- receivers


def receiver_hooks(model: HookedTransformer) -> list[tuple[str, Optional[int]]]:
    """For every backward index: the hook holding that receiver's input and the head index in it (or None).

    Head receivers live at ``blocks.L.hook_{q,k,v}_input`` (``[batch, pos, head, d_model]``
    under :func:`edge_mode`), MLP receivers at ``blocks.L.hook_mlp_in`` and ``logits`` at
    ``blocks.{n-1}.hook_resid_post`` (both ``[batch, pos, d_model]``).
    """
    layout = GraphLayout.of(model)
    hooks: list[tuple[str, Optional[int]]] = []
    for layer in range(layout.n_layers):
        for x in QKV:
            hooks += [(f"blocks.{layer}.hook_{x}_input", head) for head in range(layout.n_heads)]
        hooks.append((f"blocks.{layer}.hook_mlp_in", None))
    hooks.append((f"blocks.{layout.n_layers - 1}.hook_resid_post", None))
    missing = sorted({name for name, _ in hooks} - set(model.hook_dict))
    if missing:
        raise UnsupportedModelError(f"The model has no hook points {missing[:3]}...: it is not a TransformerLens block model.")
    return hooks


# ---------------------------------------------------------------------------- senders


def head_outputs(
    model: HookedTransformer, layer: int, z: Float[Tensor, "batch pos head_index d_head"],
    scale: Optional[Float[Tensor, "batch pos 1"]] = None,
) -> Float[Tensor, "head_index batch pos d_model"]:
    """Each head's output under the module's convention, from its ``hook_z`` and (post-norm) ``ln1_post`` scale."""
    block = model.blocks[layer]
    W_O = block.attn.W_O
    out = torch.einsum("bphk,hkd->hbpd", z.to(W_O.dtype), W_O)
    if model.cfg.use_normalization_before_and_after:
        if scale is None:
            raise InputError(f"Layer {layer} normalizes after attention: pass its ln1_post scale.")
        out = out / scale[None].to(out.dtype) * block.ln1_post.w
    return out


class SenderRecorder:
    """Hooks that collect every sender's output during a forward, as the forward produces them.

    ``outputs[f]`` is filled once sender ``f`` has run: the input at ``blocks.0.hook_resid_pre``,
    a layer's heads at its ``hook_attn_out`` (from ``hook_z`` and ``ln1_post.hook_scale``
    stored just before), an MLP at its ``hook_mlp_out``. ``on_output(f, tensor)`` (optional)
    is called as each one arrives. Positions ``start:`` are kept.
    """

    def __init__(self, model: HookedTransformer, *, start: int = 0, on_output=None):
        self.model, self.start, self.on_output = model, start, on_output
        self.layout = GraphLayout.of(model)
        self.outputs: list[Optional[Tensor]] = [None] * self.layout.n_forward
        self._z: dict[int, Tensor] = {}
        self._scale: dict[int, Tensor] = {}

    def _put(self, f: int, value: Tensor) -> None:
        self.outputs[f] = value
        if self.on_output is not None:
            self.on_output(f, value)

    def hooks(self) -> list[tuple[str, callable]]:
        L, post = self.layout.n_layers, self.model.cfg.use_normalization_before_and_after
        start = self.start

        def embed(act, *, hook):
            self._put(0, act[:, start:])

        def keep_z(act, *, hook):
            self._z[int(hook.name.split(".")[1])] = act[:, start:]

        def keep_scale(act, *, hook):
            self._scale[int(hook.name.split(".")[1])] = act[:, start:]

        def heads(act, *, hook):
            layer = int(hook.name.split(".")[1])
            outs = head_outputs(self.model, layer, self._z.pop(layer), self._scale.pop(layer, None))
            for head in range(self.layout.n_heads):
                self._put(self.layout.head_forward(layer, head), outs[head])

        def mlp(act, *, hook):
            self._put(self.layout.mlp_forward(int(hook.name.split(".")[1])), act[:, start:])

        hooks = [("blocks.0.hook_resid_pre", embed)]
        for layer in range(L):
            hooks.append((tl_utils.get_act_name("z", layer), keep_z))
            if post:
                hooks.append((f"blocks.{layer}.ln1_post.hook_scale", keep_scale))
            hooks += [(tl_utils.get_act_name("attn_out", layer), heads), (tl_utils.get_act_name("mlp_out", layer), mlp)]
        return hooks

    def stacked(self) -> Float[Tensor, "n_forward batch pos d_model"]:
        if any(o is None for o in self.outputs):
            raise RuntimeError("The forward stopped before every sender ran.")
        return torch.stack(self.outputs)


@torch.no_grad()
def sender_outputs(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    *,
    start: int = 0,
    prefix_kv: Optional[Sequence[TransformerLensKeyValueCacheEntry]] = None,
) -> Float[Tensor, "n_forward batch pos d_model"]:
    """Every sender's output (module convention) on ``tokens``, at positions ``start:``, in forward-index order.

    With ``prefix_kv`` (keys/values of ``tokens[:, :start]`` from :func:`edge_prefix_kv`), only the
    positions from ``start`` on are run.
    """
    check_edge_model(model)
    if prefix_kv is not None:
        cached = prefix_kv[0].past_keys.shape[1]
        if cached != start:
            raise InputError(f"prefix_kv covers {cached} positions but start={start}; they must be equal.")
    recorder = SenderRecorder(model, start=0 if prefix_kv is not None else start)
    run_suffix(model, tokens, start if prefix_kv is not None else 0, prefix_kv, recorder.hooks())
    return recorder.stacked()


# ---------------------------------------------------------------------------- prefix reuse


@contextlib.contextmanager
def plain_blocks(model: HookedTransformer) -> Iterator[HookedTransformer]:
    """Inside :func:`edge_mode`: run blocks without per-head q/k/v inputs and with grouped K/V (cheaper), then restore.

    For forwards, or parts of forwards, that read no head receiver: senders' outputs and the
    layers above a patched receiver are the same either way.
    """
    before = model.cfg.use_split_qkv_input, model.cfg.ungroup_grouped_query_attention
    try:
        _set_flag(model, "use_split_qkv_input", False)
        _set_flag(model, "ungroup_grouped_query_attention", False)
        yield model
    finally:
        _set_flag(model, "use_split_qkv_input", before[0])
        _set_flag(model, "ungroup_grouped_query_attention", before[1])


def ungroup_kv(model: HookedTransformer, entries: Sequence[TransformerLensKeyValueCacheEntry]) -> list[TransformerLensKeyValueCacheEntry]:
    """Grouped keys/values (one per K/V head) repeated per query head, as ungrouped GQA/MQA attention computes them."""
    cfg = model.cfg
    if cfg.n_key_value_heads is None or cfg.n_key_value_heads == cfg.n_heads:
        return list(entries)
    repeats = cfg.n_heads // cfg.n_key_value_heads
    return [TransformerLensKeyValueCacheEntry(e.past_keys.repeat_interleave(repeats, dim=2),
                                              e.past_values.repeat_interleave(repeats, dim=2), frozen=True)
            for e in entries]


@torch.no_grad()
def edge_prefix_kv(model: HookedTransformer, tokens: Int[Tensor, "batch prefix"]) -> list[TransformerLensKeyValueCacheEntry]:
    """:func:`circuits.prefix_cache.prefix_kv_cache`, with keys/values per query head when ``ungroup`` is on.

    TransformerLens allocates its cache per key/value head, so under :func:`edge_mode`
    (ungrouped GQA/MQA) the prefix is run grouped (:func:`plain_blocks`) and its keys/values
    are then repeated per query head (:func:`ungroup_kv`).
    """
    ungrouped = model.cfg.ungroup_grouped_query_attention
    with plain_blocks(model):
        entries = prefix_kv_cache(model, tokens)
    return ungroup_kv(model, entries) if ungrouped else entries


def prefix_caches(model: HookedTransformer, tokens: Int[Tensor, "batch pos"], start: int) -> tuple[Optional[list], Optional[list]]:
    """The keys/values of ``tokens[:, :start]`` per K/V head (for plain blocks) and per query head (for a block
    with per-head inputs under :func:`edge_mode`); ``(None, None)`` when ``start`` is 0."""
    if not start:
        return None, None
    with plain_blocks(model):
        plain = prefix_kv_cache(model, tokens[:, :start])
    return plain, ungroup_kv(model, plain)


def run_suffix(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    start: int,
    kv: Optional[Sequence[TransformerLensKeyValueCacheEntry]],
    fwd_hooks: Sequence[tuple[str, callable]],
    times: int = 1,
) -> Float[Tensor, "rows suffix d_model"]:
    """Final residual (before ``ln_final``) of ``tokens`` tiled ``times`` along the batch, positions ``start:``.

    Row ``i * batch + b`` is prompt ``b`` of tile ``i``. With ``kv`` (the prefix's keys/values,
    ``start`` positions, or a :class:`circuits.prefix_cache.StackedKVCache` of rows already laid out as ``tokens``)
    only the suffix is run; without it, ``start`` must be 0.
    """
    embedded = model(tokens, stop_at_layer=0)
    if kv is None:
        if start:
            raise InputError("Running from a position after 0 needs the prefix's keys/values (kv).")
        cache = None
    elif isinstance(kv, StackedKVCache):  # several prompt sets' prefixes, already tiled
        if times != 1:
            raise InputError("A StackedKVCache is tiled already: run it with times=1.")
        embedded, cache = embedded[:, start:], kv
    else:
        embedded, cache = embedded[:, start:], TiledKVCache(kv, times)
    if times > 1:
        embedded = embedded.repeat(times, 1, 1)
    return model.run_with_hooks(embedded, start_at_layer=0, stop_at_layer=model.cfg.n_layers,
                                fwd_hooks=list(fwd_hooks), past_kv_cache=cache)
