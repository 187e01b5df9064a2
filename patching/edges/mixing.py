"""Runs with edges ablated by a weight: the one set of hooks behind circuit evaluation and learned circuits.

Every receiver ``r`` (a head's q/k/v input, an MLP's input, the logits) reads

    in_r = Σ_s (1 − a_sr) · o_s(this run) + a_sr · ã_s   (+ constant biases)

where ``o_s`` is sender ``s``'s output under :mod:`patching.edges.engine`'s convention, ``ã_s`` its
ablated output (counterfactual run, a mean, or zero) and ``a_sr`` in [0, 1] how much of edge
``s -> r`` is ablated: 0 keeps it, 1 removes it, values between mix (a learned mask). The model
computes ``Σ_s o_s`` itself; a hook at each receiver adds ``Σ_s a_sr (ã_s − o_s)``, with the senders'
outputs of *this* run recorded as the forward produces them (an in-circuit edge carries what its
sender outputs here, changed if the sender's own inputs were ablated upstream). Several circuits
run in one forward: ``a`` is ``[C, n_forward, n_backward]`` and the rows are ``c * B + b``. The sums
are taken one sender group at a time (the input, a layer's heads, a layer's MLP), so the cost
grows with the number of receivers and groups, not with a copy of every sender per receiver, and
gradients reach ``a`` (and through ``o_s``, everything upstream) when ``a`` requires them.

**Position-aware edges.** With ``spans`` (one span index per prompt position, :mod:`patching.edges.positions`),
``a`` is ``[C, n_forward, n_backward, n_spans]`` and the edge ``(s, span) -> (r, span)`` is ablated at the
positions of that span: the position where receiver ``r`` reads its input. All spans at the same weight
is the position-free edge.

**Norm conventions** on models that normalise after attention (gemma-2/3, ``ln1_post``):

* ``"frozen"`` (default): a head's output is its share of the normalised layer output at its own
  run's scale, so ``o`` and ``ã`` mix linearly, exactly as above. The full and empty circuits are the
  model and the counterfactual run.
* ``"recompute"`` (hannamw/EAP-IG's ``evaluate_graph``, hence MIB's numbers): for each earlier
  attention layer ``i`` the receiver sees that layer re-normalised from the mixture of its heads'
  pre-norm results, ``N_i(Σ_h (1 − a_hr) R_h(this run) + a_hr R_h(ablated))``, in place of
  ``N_i(Σ_h R_h(this run))``. Both conventions agree when a layer's heads are all kept or all
  ablated, and differ between. On models without post-attention norms they are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens import utils as tl_utils

from circuits.errors import InputError
from circuits.graph import QKV, GraphLayout

NORMS = ("frozen", "recompute")


def check_norm(norm: str) -> str:
    """``norm`` if it is one of :data:`NORMS`, else an :class:`circuits.errors.InputError` naming both."""
    if norm not in NORMS:
        raise InputError(f"Unknown norm convention {norm!r}: use 'frozen' (each head at its own run's scale) or "
                         f"'recompute' (each receiver re-normalises its mixture, as EAP-IG's evaluate_graph).")
    return norm


@dataclass
class Ablated:
    """What an ablated edge carries, broadcastable against ``[C, B, P, d_model]`` per sender.

    ``outputs``: ``ã_s`` of every sender ``[n_forward, ...]`` (None: zero ablation); ``raw_heads``: for the
    ``"recompute"`` convention, each layer's heads' pre-norm results ``[n_layers][n_heads, ...]``.
    """

    outputs: Optional[Tensor]
    raw_heads: Optional[list[Tensor]] = None

    @classmethod
    def zero(cls, model: HookedTransformer) -> "Ablated":
        layout = GraphLayout.of(model)
        zeros = [torch.zeros(layout.n_heads, 1, 1, 1, model.cfg.d_model, dtype=model.cfg.dtype,
                             device=model.cfg.device) for _ in range(layout.n_layers)]
        return cls(None, zeros)


def rms_norm(norm, x: Tensor) -> Tensor:
    """TransformerLens' ``RMSNorm`` of ``x`` (same operations and dtypes) without firing its hook points."""
    dtype = x.dtype
    if dtype not in (torch.float32, torch.float64):
        x = x.to(torch.float32)
    scale = (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
    return (x / scale).to(dtype) * norm.w


def raw_head_results(model: HookedTransformer, layer: int, z: Tensor) -> Float[Tensor, "head batch pos d_model"]:
    """Each head's pre-norm result ``z_H · W_O[H]`` (TransformerLens' ``hook_result``)."""
    W_O = model.blocks[layer].attn.W_O
    return torch.einsum("bphk,hkd->hbpd", z.to(W_O.dtype), W_O)


def record_outputs(model: HookedTransformer, tokens: Tensor, *, start: int = 0, prefix_kv=None,
                   raw: bool = False) -> tuple[Tensor, Optional[list[Tensor]]]:
    """Every sender's output ``[n_forward, B, P, d]`` on ``tokens`` (positions ``start:``) and, with ``raw``,
    each layer's heads' pre-norm results ``[n_layers][n_heads, B, P, d]``."""
    from patching.edges.engine import SenderRecorder, run_suffix

    recorder = SenderRecorder(model)
    results: dict[int, Tensor] = {}
    hooks = recorder.hooks()
    if raw:
        def keep(act, *, hook):
            layer = int(hook.name.split(".")[1])
            results[layer] = raw_head_results(model, layer, act)

        hooks += [(tl_utils.get_act_name("z", layer), keep) for layer in range(model.cfg.n_layers)]
    run_suffix(model, tokens, start, prefix_kv, hooks)
    return recorder.stacked(), ([results[l] for l in sorted(results)] if raw else None)


def record_ablated(model: HookedTransformer, tokens: Tensor, *, start: int = 0, prefix_kv=None,
                   norm: str = "frozen") -> Ablated:
    """The counterfactual :class:`Ablated` of ``tokens`` (the twins' run), positions ``start:``, broadcast over
    circuits (``outputs [n_forward, 1, B, P, d]``; ``raw_heads`` under ``norm="recompute"``)."""
    outputs, raw = record_outputs(model, tokens, start=start, prefix_kv=prefix_kv, raw=check_norm(norm) == "recompute")
    return Ablated(outputs[:, None], None if raw is None else [r[:, None] for r in raw])


class MixingHooks:
    """The hooks of one forward of ``C`` circuits on ``B`` prompts (see the module docstring).

    ``ablate``: ``[C, n_forward, n_backward]`` (or ``[..., n_spans]`` with ``spans [B, P]``), 1 = ablated;
    ``ablated``: :class:`Ablated`. The forward must run the same ``P`` positions the ablated outputs and
    spans describe (e.g. the suffix after a shared prefix, :func:`patching.edges.engine.run_suffix`).
    """

    def __init__(self, model: HookedTransformer, ablate: Tensor, ablated: Ablated, C: int, B: int, *,
                 norm: str = "frozen", spans: Optional[Int[Tensor, "batch pos"]] = None):
        self.model, self.layout = model, GraphLayout.of(model)
        self.ablate, self.ablated, self.C, self.B = ablate, ablated, C, B
        self.post_norm = bool(model.cfg.use_normalization_before_and_after)
        self.recompute = check_norm(norm) == "recompute" and self.post_norm
        if self.recompute and ablated.raw_heads is None:
            raise InputError("norm='recompute' needs the ablated heads' pre-norm results (Ablated.raw_heads).")
        self.grad = bool(ablate.requires_grad)
        self.onehot = None
        if spans is not None:
            n_spans = ablate.shape[-1]
            self.onehot = torch.nn.functional.one_hot(spans.long(), n_spans).to(ablate.dtype)  # [B, P, S]
        # sender groups in forward order: (first forward index, size, layer of a heads group or None)
        H = self.layout.n_heads
        self.groups: list[tuple[int, int, Optional[int]]] = [(0, 1, None)]
        for layer in range(self.layout.n_layers):
            self.groups += [(self.layout.head_forward(layer, 0), H, layer), (self.layout.mlp_forward(layer), 1, None)]
        self.diffs: list[Optional[Tensor]] = [None] * len(self.groups)  # per group [n, C, B, P, d]: ã − o
        self.layer_sum: dict[int, Tensor] = {}  # recompute: each attention layer's pre-norm sum of head results
        self.layer_normed: dict[int, Tensor] = {}  # recompute: that sum normalised (the layer's output) [C, B, P, d]
        self._z: dict[int, Tensor] = {}
        self._scale: dict[int, Tensor] = {}
        self._buffer: Optional[Tensor] = None  # without gradients: ã − o of every sender, rows in forward order
        self._stacks: dict[int, tuple[Tensor, Tensor]] = {}

    # ---- senders

    def _shaped(self, t: Tensor) -> Tensor:
        return t.view(self.C, self.B, *t.shape[1:])

    def _ablated_of(self, first: int, size: int) -> Optional[Tensor]:
        return None if self.ablated.outputs is None else self.ablated.outputs[first:first + size]

    def _store(self, g: int, diff: Tensor) -> None:
        """Group ``g``'s ``ã − o`` ``[n, C, B, P, d]``; without gradients written into one buffer of every sender."""
        self.diffs[g] = diff
        if self.grad:
            return
        first, size, _ = self.groups[g]
        if self._buffer is None:
            self._buffer = diff.new_zeros(self.layout.n_forward, *diff.shape[1:])
        self._buffer[first:first + size] = diff

    def _store_outputs(self, g: int, outputs: Tensor) -> None:
        first, size, _ = self.groups[g]
        ablated = self._ablated_of(first, size)
        self._store(g, -outputs if ablated is None else ablated - outputs)

    def preset_senders(self, limit: int, outputs: Float[Tensor, "senders batch pos d_model"]) -> None:
        """Take the senders below ``limit`` (a layer's first head) as having output ``outputs`` in every circuit,
        for a forward that starts at that layer: those senders do not run in it, and with no receiver below
        ``limit`` ablated they output what the reference run does. Without gradients, ``"frozen"`` only."""
        if self.grad or self.recompute:
            raise InputError("Presetting senders needs a forward without gradients under the 'frozen' norm.")
        for g, (first, size, _) in enumerate(self.groups):
            if first < limit:
                self._store_outputs(g, outputs[first:first + size, None].expand(size, self.C, *outputs.shape[1:]))

    def sender_hooks(self) -> list[tuple[str, callable]]:
        model, L = self.model, self.layout.n_layers

        def embed(act, *, hook):
            self._store_outputs(0, self._shaped(act)[None])

        def keep_z(act, *, hook):
            self._z[int(hook.name.split(".")[1])] = act

        def keep_scale(act, *, hook):
            self._scale[int(hook.name.split(".")[1])] = act

        def heads(act, *, hook):
            layer = int(hook.name.split(".")[1])
            raw = raw_head_results(model, layer, self._z.pop(layer))  # [H, C*B, P, d]
            g = 1 + 2 * layer
            if self.recompute:
                raw = raw.view(raw.shape[0], self.C, self.B, *raw.shape[2:])
                self.layer_sum[layer] = raw.sum(0)
                # subtracted from the mixture's norm (not the model's own output) so that a kept layer adds exactly 0
                self.layer_normed[layer] = rms_norm(model.blocks[layer].ln1_post, self.layer_sum[layer])
                self.diffs[g] = self.ablated.raw_heads[layer] - raw  # mixed per layer, never in the linear sum
                self._scale.pop(layer, None)
                return
            if self.post_norm:
                raw = raw / self._scale.pop(layer)[None].to(raw.dtype) * model.blocks[layer].ln1_post.w
            self._store_outputs(g, raw.view(raw.shape[0], self.C, self.B, *raw.shape[2:]))

        def mlp(act, *, hook):
            self._store_outputs(2 + 2 * int(hook.name.split(".")[1]), self._shaped(act)[None])

        hooks = [("blocks.0.hook_resid_pre", embed)]
        for layer in range(L):
            hooks.append((tl_utils.get_act_name("z", layer), keep_z))
            if self.post_norm:
                hooks.append((f"blocks.{layer}.ln1_post.hook_scale", keep_scale))
            hooks += [(tl_utils.get_act_name("attn_out", layer), heads), (tl_utils.get_act_name("mlp_out", layer), mlp)]
        return hooks

    # ---- receivers

    def _mix(self, w: Tensor, diff: Tensor) -> Tensor:
        """Σ_s w[c, s, r] · diff[s, c, b, p, :] -> [C, B, P, R, d] (per span with position-aware weights)."""
        if self.onehot is None:
            return torch.einsum("csr,scbpd->cbprd", w.to(diff.dtype), diff)
        return torch.einsum("csrk,scbpd,bpk->cbprd", w.to(diff.dtype), diff, self.onehot.to(diff.dtype))

    def _linear(self, limit: int) -> tuple[Tensor, Tensor]:
        """The senders below ``limit`` whose changes add linearly: (their forward indices, their ``ã − o`` stacked).

        Every sender under ``"frozen"``; all but the heads under ``"recompute"``. Without gradients this is
        a view of the buffer; with them the stack is built once per limit (the q, k and v inputs of a layer
        share it) instead of once per receiver.
        """
        if limit in self._stacks:
            return self._stacks[limit]
        groups = [(g, first, size) for g, (first, size, layer) in enumerate(self.groups)
                  if first < limit and not (layer is not None and self.recompute)]
        index = torch.tensor([f for _, first, size in groups for f in range(first, first + size)],
                             device=self.ablate.device)
        if not self.grad and not self.recompute:
            stacked = self._buffer[:limit]
        else:
            stacked = torch.cat([self.diffs[g] for g, _, _ in groups])
        self._stacks = {limit: (index, stacked)}  # the latest only: each layer's receivers use one limit or two
        return index, stacked

    def correction(self, receivers: Sequence[int]) -> Optional[Tensor]:
        """What receivers ``receivers`` (one hook point) get added: ``[C, B, P, R, d]`` (None: nothing ablated)."""
        limit = self.layout.forward_limit(receivers[0])
        w_all = self.ablate[:, :limit][:, :, receivers]  # [C, limit, R] (or [..., S])
        index, stacked = self._linear(limit)
        w = w_all if len(index) == limit else w_all[:, index]
        total = self._mix(w, stacked) if self.grad or bool(w.any()) else None
        if self.recompute:
            for g, (first, size, layer) in enumerate(self.groups):
                if layer is None or first >= limit:
                    continue
                w = w_all[:, first:first + size]
                if not self.grad and not bool(w.any()):
                    continue
                mixed = self.layer_sum[layer][:, :, :, None] + self._mix(w, self.diffs[g])  # [C, B, P, R, d]
                part = rms_norm(self.model.blocks[layer].ln1_post, mixed) - self.layer_normed[layer][:, :, :, None]
                total = part if total is None else total + part
        return total

    def receiver_hooks(self) -> list[tuple[str, callable]]:
        layout = self.layout

        def make(receivers: list[int], per_head: bool):
            if not self.grad and not bool(self.ablate[:, :, receivers].any()):
                return None

            def hook(act, *, hook):
                delta = self.correction(receivers)
                if delta is None:
                    return act
                shaped = act.view(self.C, self.B, *act.shape[1:])
                if not per_head:
                    delta = delta[:, :, :, 0]
                return (shaped + delta).view(act.shape)

            return hook

        hooks = []
        for layer in range(layout.n_layers):
            for x in QKV:
                fn = make([layout.head_backward(layer, h, x) for h in range(layout.n_heads)], True)
                if fn is not None:
                    hooks.append((f"blocks.{layer}.hook_{x}_input", fn))
            fn = make([layout.mlp_backward(layer)], False)
            if fn is not None:
                hooks.append((f"blocks.{layer}.hook_mlp_in", fn))
        fn = make([layout.logits_backward], False)
        if fn is not None:
            hooks.append((f"blocks.{layout.n_layers - 1}.hook_resid_post", fn))
        return hooks

    def hooks(self) -> list[tuple[str, callable]]:
        """Sender hooks first (a receiver reads the groups recorded before it in the same forward)."""
        return self.sender_hooks() + self.receiver_hooks()
