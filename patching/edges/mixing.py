"""Runs with edges ablated by a weight: the one set of hooks behind circuit evaluation and learned circuits.

Every receiver ``r`` (a head's q/k/v input, an MLP's input, the logits) reads

    in_r = Σ_s (1 − a_sr) · o_s(this run) + a_sr · ã_s   (+ constant biases)

where ``o_s`` is sender ``s``'s output under :mod:`patching.edges.engine`'s convention, ``ã_s`` its
ablated output (counterfactual run, a mean, or zero) and ``a_sr`` in [0, 1] how much of edge
``s -> r`` is ablated: 0 keeps it, 1 removes it, values between mix (a learned mask). The model
computes ``Σ_s o_s`` itself; a hook at each receiver adds ``Σ_s a_sr (ã_s − o_s)``, with the senders'
outputs of *this* run recorded as the forward produces them (an in-circuit edge carries what its
sender outputs here, changed if the sender's own inputs were ablated upstream). Several circuits
run in one forward: ``a`` is ``[C, n_forward, n_backward]`` and the rows are ``c * B + b``. The senders'
``ã − o`` are written once, in forward order, into one buffer, and each receiver hook point is one
product with the rows below its limit (a layer's q, k and v inputs share one product), so no sender
is copied per receiver; with gradients that product is :class:`_MixBelow`, whose backward hands each
sender group its share, so gradients reach ``a`` (and through ``o_s``, everything upstream) when ``a``
requires them.

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

import contextlib
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


#: profiler ranges of the hooks' own work (what ``python -m experiments.bench_learn --profile-steps N`` separates
#: from the model's); their backward is the autograd node ``_MixBelowBackward``
SENDERS_RANGE, RECEIVERS_RANGE = "edge mixing: senders", "edge mixing: receivers"


def _profiled(label: str):
    """A profiler range named ``label`` while torch's profiler records, else nothing (no cost in plain runs)."""
    return torch.profiler.record_function(label) if torch.autograd._profiler_enabled() else contextlib.nullcontext()


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


def _mix(w: Tensor, x: Tensor, onehot: Optional[Tensor]) -> Tensor:
    """Σ_s w[c, s, r] · x[c, s, b, p, :] -> [C, B, P, R, d] (per span with position-aware weights).

    Circuit-major ``x`` makes the product one matrix product per circuit on ``x`` as it lies in memory
    (an einsum over sender-major rows copied them into that layout first).
    """
    if onehot is None:
        C, _, B, P, d = x.shape
        out = torch.matmul(w.transpose(1, 2).to(x.dtype), x.flatten(2))  # [C, R, B * P * d]
        return out.view(C, -1, B, P, d).permute(0, 2, 3, 1, 4)
    return torch.einsum("csrk,csbpd,bpk->cbprd", w.to(x.dtype), x, onehot.to(x.dtype))


class _MixBelow(torch.autograd.Function):
    """:func:`_mix` of the senders below a receiver's limit, read from the buffer without gradients, with
    the gradient of each sender group's ``ã − o`` (``pieces [n, C, B, P, d]``, the buffer's rows in order)
    and of ``w``.

    The product reads the buffer instead of a concatenation of the pieces (which, for every hook point,
    copied every sender below it: quadratic in depth). ``stacked`` is kept by reference, not saved:
    rows below a limit are written once, before any receiver reads them, and never again in a forward.
    """

    @staticmethod
    def forward(ctx, w: Tensor, stacked: Tensor, onehot: Optional[Tensor], *pieces: Tensor) -> Tensor:
        ctx.stacked, ctx.onehot, ctx.sizes = stacked, onehot, [p.shape[0] for p in pieces]
        ctx.save_for_backward(w)
        return _mix(w, stacked, onehot)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (w,) = ctx.saved_tensors
        x, onehot = ctx.stacked, ctx.onehot  # x [C, s, B, P, d]
        w_x = w.to(x.dtype)
        grad_w = None
        if onehot is None:
            C, s, B, P, d = x.shape
            g = grad.permute(0, 3, 1, 2, 4).reshape(C, -1, B * P * d)  # [C, R, n]
            if ctx.needs_input_grad[0]:
                grad_w = torch.matmul(x.flatten(2), g.transpose(1, 2)).to(w.dtype)  # [C, s, R]
            grad_x = torch.matmul(w_x, g).view(C, s, B, P, d)
        else:
            if ctx.needs_input_grad[0]:
                grad_w = torch.einsum("cbprd,csbpd,bpk->csrk", grad, x, onehot.to(x.dtype)).to(w.dtype)
            grad_x = torch.einsum("csrk,cbprd,bpk->csbpd", w_x, grad, onehot.to(x.dtype))
        return (grad_w, None, None, *grad_x.transpose(0, 1).split(ctx.sizes))


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
        # the groups whose changes add linearly (all under "frozen"; all but the heads under "recompute") and
        # each one's first row in the buffer of their ã − o (detached: _MixBelow gives the groups their gradients)
        self.linear = [g for g, (_, _, layer) in enumerate(self.groups) if not (layer is not None and self.recompute)]
        self.row: dict[int, int] = {}
        self.n_rows = 0
        for g in self.linear:
            self.row[g], self.n_rows = self.n_rows, self.n_rows + self.groups[g][1]
        self.layer_sum: dict[int, Tensor] = {}  # recompute: each attention layer's pre-norm sum of head results
        self.layer_normed: dict[int, Tensor] = {}  # recompute: that sum normalised (the layer's output) [C, B, P, d]
        self._z: dict[int, Tensor] = {}
        self._scale: dict[int, Tensor] = {}
        self._buffer: Optional[Tensor] = None
        self._qkv: dict[int, Optional[Tensor]] = {}  # a layer's q, k and v corrections, made by the first of its hooks

    # ---- senders

    def _shaped(self, t: Tensor) -> Tensor:
        return t.view(self.C, self.B, *t.shape[1:])

    def _ablated_of(self, first: int, size: int) -> Optional[Tensor]:
        return None if self.ablated.outputs is None else self.ablated.outputs[first:first + size]

    def _store(self, g: int, diff: Tensor) -> None:
        """Group ``g``'s ``ã − o`` ``[n, C, B, P, d]``, also written (detached) into the buffer of the linear senders."""
        self.diffs[g] = diff
        if self._buffer is None:  # circuit-major [C, rows, B, P, d] (see _mix)
            self._buffer = diff.new_empty(diff.shape[1], self.n_rows, *diff.shape[2:])
        row = self.row[g]
        self._buffer[:, row:row + diff.shape[0]] = diff.detach().transpose(0, 1)

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
            with _profiled(SENDERS_RANGE):
                self._store_outputs(0, self._shaped(act)[None])

        def keep_z(act, *, hook):
            self._z[int(hook.name.split(".")[1])] = act

        def keep_scale(act, *, hook):
            self._scale[int(hook.name.split(".")[1])] = act

        def heads(act, *, hook):
            with _profiled(SENDERS_RANGE):
                record_heads(act, int(hook.name.split(".")[1]))

        def record_heads(act, layer: int):
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
            with _profiled(SENDERS_RANGE):
                self._store_outputs(2 + 2 * int(hook.name.split(".")[1]), self._shaped(act)[None])

        hooks = [("blocks.0.hook_resid_pre", embed)]
        for layer in range(L):
            hooks.append((tl_utils.get_act_name("z", layer), keep_z))
            if self.post_norm:
                hooks.append((f"blocks.{layer}.ln1_post.hook_scale", keep_scale))
            hooks += [(tl_utils.get_act_name("attn_out", layer), heads), (tl_utils.get_act_name("mlp_out", layer), mlp)]
        return hooks

    # ---- receivers

    def _linear_mix(self, limit: int, w_all: Tensor) -> Optional[Tensor]:
        """Σ over the linear senders below ``limit`` (one product with the buffer's rows; None: none ablated)."""
        below = [g for g in self.linear if self.groups[g][0] < limit]
        if not self.recompute:
            w = w_all  # every sender below the limit, in forward order: the buffer's rows are its rows
        else:
            index = torch.tensor([f for g in below for f in range(self.groups[g][0], sum(self.groups[g][:2]))],
                                 device=w_all.device)
            w = w_all[:, index]
        stacked = self._buffer[:, :sum(self.groups[g][1] for g in below)]
        if self.grad:
            return _MixBelow.apply(w, stacked, self.onehot, *[self.diffs[g] for g in below])
        return _mix(w, stacked, self.onehot) if bool(w.any()) else None

    def correction(self, receivers: Sequence[int]) -> Optional[Tensor]:
        """What receivers ``receivers`` (one limit) get added: ``[C, B, P, R, d]`` (None: nothing ablated)."""
        limit = self.layout.forward_limit(receivers[0])
        w_all = self.ablate[:, :limit][:, :, receivers]  # [C, limit, R] (or [..., S])
        total = self._linear_mix(limit, w_all)
        if self.recompute:
            for g, (first, size, layer) in enumerate(self.groups):
                if layer is None or first >= limit:
                    continue
                w = w_all[:, first:first + size]
                if not self.grad and not bool(w.any()):
                    continue
                mixed = self.layer_sum[layer][:, :, :, None] + _mix(w, self.diffs[g].transpose(0, 1), self.onehot)
                part = rms_norm(self.model.blocks[layer].ln1_post, mixed) - self.layer_normed[layer][:, :, :, None]
                total = part if total is None else total + part
        return total

    def _qkv_correction(self, layer: int, x: str, last: bool) -> Optional[Tensor]:
        """Input ``x``'s share of layer ``layer``'s q, k and v corrections, all computed by the first hook to ask."""
        if layer not in self._qkv:
            H = self.layout.n_heads
            self._qkv[layer] = self.correction([self.layout.head_backward(layer, h, y) for y in QKV for h in range(H)])
        total = self._qkv.pop(layer) if last else self._qkv[layer]
        if total is None:
            return None
        i, H = QKV.index(x), self.layout.n_heads
        return total[:, :, :, i * H:(i + 1) * H]

    def receiver_hooks(self) -> list[tuple[str, callable]]:
        layout = self.layout

        def ablated_any(receivers: list[int]) -> bool:
            return self.grad or bool(self.ablate[:, :, receivers].any())

        def make(correction, per_head: bool):
            def hook(act, *, hook):
                with _profiled(RECEIVERS_RANGE):
                    delta = correction()
                    if delta is None:
                        return act
                    shaped = act.view(self.C, self.B, *act.shape[1:])
                    if not per_head:
                        delta = delta[:, :, :, 0]
                    return (shaped + delta).view(act.shape)

            return hook

        hooks = []
        for layer in range(layout.n_layers):
            inputs = [x for x in QKV if ablated_any([layout.head_backward(layer, h, x) for h in range(layout.n_heads)])]
            for x in inputs:
                correction = lambda layer=layer, x=x, last=x == inputs[-1]: self._qkv_correction(layer, x, last)
                hooks.append((f"blocks.{layer}.hook_{x}_input", make(correction, True)))
            receivers = [layout.mlp_backward(layer)]
            if ablated_any(receivers):
                hooks.append((f"blocks.{layer}.hook_mlp_in", make(lambda r=receivers: self.correction(r), False)))
        receivers = [layout.logits_backward]
        if ablated_any(receivers):
            hooks.append((f"blocks.{layout.n_layers - 1}.hook_resid_post",
                          make(lambda: self.correction(receivers), False)))
        return hooks

    def hooks(self) -> list[tuple[str, callable]]:
        """Sender hooks first (a receiver reads the groups recorded before it in the same forward)."""
        return self.sender_hooks() + self.receiver_hooks()
