"""A plain, slow reference implementation of edge interventions for the tests (no code shared with patching.edge_*).

Senders' outputs are read from TransformerLens' own ``hook_result`` (scaled by each run's
``ln1_post`` scale on post-norm models), ``hook_mlp_out`` and ``blocks.0.hook_resid_pre``;
each receiver's input is *replaced* by the sum it should have, over full sequences, and the
metric reads the full logits.
"""

from __future__ import annotations

import contextlib

import torch

from circuits.graph import QKV, GraphLayout


@contextlib.contextmanager
def flags(model):
    before = (model.cfg.use_split_qkv_input, model.cfg.ungroup_grouped_query_attention, model.cfg.use_hook_mlp_in,
              model.cfg.use_attn_result)
    model.set_use_split_qkv_input(True)
    model.set_ungroup_grouped_query_attention(True)
    model.set_use_hook_mlp_in(True)
    model.set_use_attn_result(True)
    try:
        yield
    finally:
        model.set_use_split_qkv_input(before[0])
        model.set_ungroup_grouped_query_attention(before[1])
        model.set_use_hook_mlp_in(before[2])
        model.set_use_attn_result(before[3])


def receiver_sites(layout: GraphLayout):
    """(backward index, hook name, head or None) for every receiver."""
    sites = []
    for layer in range(layout.n_layers):
        for x in QKV:
            sites += [(layout.head_backward(layer, h, x), f"blocks.{layer}.hook_{x}_input", h) for h in range(layout.n_heads)]
        sites.append((layout.mlp_backward(layer), f"blocks.{layer}.hook_mlp_in", None))
    sites.append((layout.logits_backward, f"blocks.{layout.n_layers - 1}.hook_resid_post", None))
    return sites


def bias(model, layout, limit):
    """Σ b_O (after ln1_post it would be scaled; post-norm test models have b_O = 0) of layers feeding ``limit``."""
    layers = [l for l in range(layout.n_layers) if layout.head_forward(l, 0) < limit]
    return sum((model.blocks[l].attn.b_O for l in layers), torch.zeros(model.cfg.d_model))


class Recorder:
    """Hooks recording each sender's output of the current run into ``self.out[f]``."""

    def __init__(self, model, layout):
        self.model, self.layout, self.out, self.result = model, layout, {}, {}

    def hooks(self):
        post = self.model.cfg.use_normalization_before_and_after

        def embed(act, *, hook):
            self.out[0] = act.clone()

        def result(act, *, hook):
            layer = int(hook.name.split(".")[1])
            self.result[layer] = act.clone()
            if not post:
                for h in range(self.layout.n_heads):
                    self.out[self.layout.head_forward(layer, h)] = act[:, :, h].clone()

        def scale(act, *, hook):
            layer = int(hook.name.split(".")[1])
            w = self.model.blocks[layer].ln1_post.w
            for h in range(self.layout.n_heads):
                self.out[self.layout.head_forward(layer, h)] = self.result[layer][:, :, h] / act * w

        def mlp(act, *, hook):
            self.out[self.layout.mlp_forward(int(hook.name.split(".")[1]))] = act.clone()

        hooks = [("blocks.0.hook_resid_pre", embed)]
        for l in range(self.layout.n_layers):
            hooks.append((f"blocks.{l}.attn.hook_result", result))
            if post:
                hooks.append((f"blocks.{l}.ln1_post.hook_scale", scale))
            hooks.append((f"blocks.{l}.hook_mlp_out", mlp))
        return hooks


def outputs(model, tokens) -> dict[int, torch.Tensor]:
    layout = GraphLayout.of(model)
    rec = Recorder(model, layout)
    with flags(model), torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=rec.hooks())
    return rec.out


def logit(model, logits, answers):
    return logits[:, -1].gather(-1, answers[:, None])[:, 0]


@torch.no_grad()
def plain_edge_patch(model, f, b, tokens, cf_tokens, answers):
    """Mean effect on the answer logit of patching edge (f, b): one hook adds o_f(cf) − o_f(ref) at the receiver."""
    layout = GraphLayout.of(model)
    ref, cf = outputs(model, tokens), outputs(model, cf_tokens)
    _, name, head = next(s for s in receiver_sites(layout) if s[0] == b)

    def patch(act, *, hook):
        act = act.clone()
        if head is None:
            act += cf[f] - ref[f]
        else:
            act[:, :, head] += cf[f] - ref[f]
        return act

    with flags(model):
        base = logit(model, model(tokens), answers)
        patched = logit(model, model.run_with_hooks(tokens, fwd_hooks=[(name, patch)]), answers)
    return float((patched - base).mean())


@torch.no_grad()
def plain_circuit(model, mask, tokens, ablated: dict[int, torch.Tensor], answers):
    """Metric per prompt with each receiver's input REPLACED by Σ_{in C} current + Σ_{not in C} ablated + biases."""
    layout = GraphLayout.of(model)
    rec = Recorder(model, layout)

    def receiver(b, head):
        limit = layout.forward_limit(b)

        def hook(act, *, hook):
            total = bias(model, layout, limit).expand(*act.shape[:2], -1).clone()
            for f in range(limit):
                total = total + (rec.out[f] if mask[f, b] else ablated[f].expand_as(rec.out[f]))
            act = act.clone()
            if head is None:
                act[:] = total
            else:
                act[:, :, head] = total
            return act

        return hook

    hooks = rec.hooks() + [(name, receiver(b, head)) for b, name, head in receiver_sites(layout)]
    with flags(model):
        return logit(model, model.run_with_hooks(tokens, fwd_hooks=hooks), answers)
