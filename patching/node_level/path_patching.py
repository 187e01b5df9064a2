"""Path patching (Wang et al. 2023; Zhang et al. 2024 §4.1): which heads and MLPs carry the arithmetic.

Reference prompts X_r ("7 + 5 = ") and counterfactual twins X_c ("7 # 5 = ",
same token length). For a *sender* node s (a head or an MLP):

1. run X_r and X_c once and cache their activations;
2. run X_r with every attention head's output frozen to its X_r value, except
   s, which takes its X_c value; MLPs and norms are recomputed (or frozen too,
   ``freeze_mlps=True``);
3. read the effect at the *receiver*: the logits at END (default), or the
   q/k/v inputs of receiver heads, which are then patched into a fresh run of
   X_r whose logits are scored (the two-step sender -> receiver form).

A head's output is its ``hook_z`` slice. In gemma-3 the attention block's
contribution is ``ln1_post(sum_h z_h W_O[h] + b_O)``, a nonlinear function of
all heads' z together; freezing and swapping through ``hook_z`` is still exact,
because the norm is then recomputed from exactly the frozen/swapped z's.

**Fast path** (receiver = logits, the default): with every head frozen, attention
at later layers adds the same vector as in the reference run, so a sender's
change reaches END only through the END position's residual stream, its MLPs
and norms. Each sender therefore needs only one row per prompt from its layer
up: ``ln1_post(W_O z) -> + resid -> ln2 -> MLP -> ln2_post`` at END, all senders
stacked along the batch dimension, and an unembedding of only the columns the
metric reads. ``method="hooks"`` runs the plain version (one full forward per
sender with explicit freezing hooks); both agree to float rounding.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer
from transformer_lens import utils as tl_utils

from circuits.errors import InputError
from circuits.nodes import MLP, Head, Node, all_nodes, validate_nodes
from patching.sweeps import forward, inputs
from patching.sweeps.metrics import PatchMetric, get_metric, score_end
from patching.sweeps.options import SweepOptions, sweep_options
from patching.sweeps.results import NodeScores

Receivers = Union[str, Sequence[Head]]


@torch.no_grad()
def path_patch(
    model: HookedTransformer,
    reference,
    counterfactual: Optional[Tensor] = None,
    *,
    senders: Optional[Sequence[Node]] = None,
    receivers: Receivers = "logits",
    receiver_input: str = "qkv",
    answer_ids=None,
    alt_ids=None,
    freeze_mlps: bool = False,
    method: str = "fast",
    options: Optional[SweepOptions] = None,
) -> NodeScores:
    """Path-patching effect of each sender on the receiver, averaged over prompts.

    Args:
        model: any HookedTransformer (MHA, GQA or MQA; fp32 or bf16; CPU or CUDA).
        reference: a ``Dataset`` from :func:`circuits.tasks.make_dataset`, a ``TaskBatch``,
            or reference token ids ``[batch, pos]`` (then pass ``counterfactual`` and ``answer_ids``).
        counterfactual: counterfactual token ids, same shape, when ``reference`` is a tensor.
        senders: the nodes to score (default: every head and every MLP; with receiver heads, every node of an
            earlier layer than the last receiver: a sender at or after it cannot reach a receiver and is refused).
        receivers: ``"logits"`` (the answer at END) or a list of receiver ``Head`` s.
        receiver_input: for receiver heads, which inputs take the sender's effect: any of "q", "k", "v".
        answer_ids, alt_ids: the scored token (and the alternative for ``"logit_diff"``); one int or one per prompt.
        freeze_mlps: freeze MLP outputs to their reference values too (only direct paths remain).
        method: ``"fast"`` (END-only recomputation, receiver = logits) or ``"hooks"`` (plain, one forward per sender).
        options: :class:`patching.SweepOptions` (None: its defaults): ``metric`` (a name in
            :data:`patching.sweeps.metrics.METRICS` or a callable ``fn(logits, answer_ids, alt_ids)``), ``batch_size``
            (prompts per forward; default: all prompts of one token length together), ``memory_mb`` (activation
            budget per batched forward of the fast path), ``progress``.
    Returns:
        :class:`NodeScores` with effects (patched minus reference metric); unscored nodes are NaN.
    """
    opts = sweep_options(options, "path_patch")
    metric = get_metric(opts.metric)
    senders, receivers = _checked_nodes(model, senders, receivers, receiver_input, method)
    to_logits = receivers == "logits"
    groups = inputs.prompt_groups(model, reference, counterfactual, answer_ids=answer_ids, alt_ids=alt_ids,
                                 batch_size=opts.batch_size)
    if method == "fast" and (not to_logits or forward.check_sequential_blocks(model) is not None):
        method = "hooks"  # the END-only shortcut holds only for logits receivers and sequential blocks
    bar = tqdm(total=len(groups) * len(senders), desc=f"path patching ({method})", disable=not opts.shows_progress(),
               leave=False)
    per_prompt, base_total = [], 0.0
    for group in groups:
        if method == "fast":
            patched, base = _fast_group(model, group, senders, metric, freeze_mlps, opts.budget())
            bar.update(len(senders))
        else:
            patched, base = _hooks_group(model, group, senders, metric, freeze_mlps,
                                         None if to_logits else (receivers, receiver_input), bar)
        per_prompt.append((patched - base[None]).double().cpu())
        base_total += float(base.double().sum())
    bar.close()
    inputs.warn_if_no_effect(any(bool(d.any()) for d in per_prompt), groups, "path-patching")
    info = {"freeze_mlps": freeze_mlps, "receivers": "logits" if to_logits else [str(r) for r in receivers],
            "computation": method}
    return _node_scores(model, senders, per_prompt, base_total, metric.name, info)


def _checked_nodes(model: HookedTransformer, senders, receivers, receiver_input: str, method: str):
    """``(senders, receivers)`` once both are nodes :func:`path_patch` can score: every node by default (before the
    last receiver head's layer, for head receivers), receivers ``"logits"`` or a list of heads; refused otherwise."""
    by_default = senders is None
    senders = validate_nodes(model, all_nodes(model) if senders is None else senders)
    if not senders:
        raise InputError("No senders to score: pass at least one Head or MLP (or senders=None for every node).")
    if method not in ("fast", "hooks"):
        raise InputError(f"Unknown method {method!r}: use 'fast' or 'hooks'.")
    if isinstance(receivers, str):
        if receivers != "logits":
            raise InputError(f"receivers must be 'logits' or a list of Head receivers, got {receivers!r}.")
        return senders, receivers
    receivers = validate_nodes(model, receivers)
    if by_default and receivers and all(isinstance(r, Head) for r in receivers):
        senders = [n for n in senders if n.layer < max(r.layer for r in receivers)]
    if not receivers or not all(isinstance(r, Head) for r in receivers):
        raise InputError("Receivers must be a non-empty list of Head nodes (their q/k/v inputs are patched).")
    if not set(receiver_input) <= set("qkv") or not receiver_input:
        raise InputError(f"receiver_input must be made of 'q', 'k', 'v', got {receiver_input!r}.")
    last = max(r.layer for r in receivers)
    late = [str(n) for n in senders if n.layer >= last]
    if late:
        raise InputError(
            f"Senders {late} come at or after the last receiver's layer {last} ({', '.join(map(str, receivers))}): "
            "a head or MLP reaches a head's q/k/v input only from an earlier layer, so their effect is 0 by "
            "construction. Pass senders from layers before the receivers, or receivers='logits'.")
    return senders, receivers


def _node_scores(model: HookedTransformer, senders: list[Node], per_prompt: list[Tensor], base_total: float,
                 metric_name: str, info: dict) -> NodeScores:
    """The mean effect of each sender over every prompt (``per_prompt``: each group's ``[sender, prompt]``
    effects) as NodeScores, NaN for the nodes not scored, with each sender's per-prompt effects."""
    total = torch.zeros(len(senders), dtype=torch.float64)
    for group_effects in per_prompt:  # summed group by group, in float64
        total += group_effects.sum(-1)
    n_prompts = sum(group_effects.shape[1] for group_effects in per_prompt)
    effects = (total / n_prompts).float()
    heads = torch.full((model.cfg.n_layers, model.cfg.n_heads), float("nan"))
    mlps = torch.full((model.cfg.n_layers,), float("nan"))
    for node, value in zip(senders, effects):
        if isinstance(node, Head):
            heads[node.layer, node.head] = value
        else:
            mlps[node.layer] = value
    scores = NodeScores(heads, mlps, metric_name, base_total / n_prompts, n_prompts, "path_patching", info)
    scores.prompt_effects = dict(zip(senders, torch.cat(per_prompt, 1).float()))
    return scores


# ---------------------------------------------------------------------------- fast path


@torch.no_grad()
def _fast_group(model, group, senders, metric, freeze_mlps, memory_mb) -> tuple[Tensor, Tensor]:
    """Patched metric [n_senders, batch] and reference metric [batch] for one group, END rows only."""
    L = model.cfg.n_layers
    has_mlp = not model.cfg.attn_only
    layers = range(L)
    ref_names = forward.act_names("resid_pre", layers) + forward.act_names("z", layers) + forward.act_names("attn_out", layers)
    if has_mlp:
        ref_names += forward.act_names("resid_mid", layers)
        ref_names += forward.act_names("mlp_out", layers) if freeze_mlps else []
    cf_names = sorted({s.hook_name for s in senders})
    ref, ref_final = forward.end_cache(model, group.tokens, ref_names)
    cf, _ = forward.end_cache(model, group.cf_tokens, cf_names)
    base = score_end(model, ref_final, group.answer_ids, group.alt_ids, metric)
    get = lambda store, kind, layer: store[tl_utils.get_act_name(kind, layer)]

    B = len(group)
    order = sorted(range(len(senders)), key=lambda i: senders[i].layer)  # rows enter the stream layer by layer
    per_chunk = max(1, forward.rows_per_chunk(model, memory_mb) // B)
    patched = torch.empty(len(senders), B, device=ref_final.device, dtype=base.dtype)
    for sl in forward.chunks(len(order), per_chunk):
        idx = order[sl]
        stream: Optional[Tensor] = None  # [n_entered * B, d_model], residual at the start of the current layer
        entered: list[int] = []
        for layer in range(senders[idx[0]].layer, L):
            new_heads = [i for i in idx if senders[i].layer == layer and isinstance(senders[i], Head)]
            new_mlps = [i for i in idx if senders[i].layer == layer and isinstance(senders[i], MLP)]
            mids = []
            if stream is not None:  # every head is frozen: attention adds exactly its reference output at END
                mids.append(stream + get(ref, "attn_out", layer).repeat(len(entered), 1))
            if new_heads:
                z = get(ref, "z", layer).repeat(len(new_heads), 1, 1, 1).view(len(new_heads), B, *get(ref, "z", layer).shape[1:])
                for k, i in enumerate(new_heads):
                    z[k, :, senders[i].head] = get(cf, "z", layer)[:, senders[i].head]
                attn = forward.attn_out_from_z(model, layer, z.flatten(0, 1))
                mids.append(get(ref, "resid_pre", layer).repeat(len(new_heads), 1) + attn)
            entered_now = entered + new_heads
            if mids:
                mid = torch.cat(mids)
                if not has_mlp:
                    stream = mid
                elif freeze_mlps:
                    stream = mid + get(ref, "mlp_out", layer).repeat(len(entered_now), 1)
                else:
                    stream = mid + forward.mlp_out_rows(model, layer, mid)
            if new_mlps:
                mlp_rows = torch.cat([get(ref, "resid_mid", layer) + get(cf, "mlp_out", layer)] * len(new_mlps))
                stream = mlp_rows if stream is None else torch.cat([stream, mlp_rows])
                entered_now = entered_now + new_mlps
            entered = entered_now
        answers = group.answer_ids.repeat(len(entered))
        alts = None if group.alt_ids is None else group.alt_ids.repeat(len(entered))
        patched[entered] = score_end(model, stream, answers, alts, metric).view(len(entered), B)
    return patched, base


# ---------------------------------------------------------------------------- plain path (hooks)


@torch.no_grad()
def _hooks_group(model, group, senders, metric, freeze_mlps, receiver_spec, bar) -> tuple[Tensor, Tensor]:
    """One forward per sender with explicit freezing hooks (and a second one per sender for head receivers)."""
    L = model.cfg.n_layers
    names = forward.act_names("z", range(L)) + ([] if model.cfg.attn_only else forward.act_names("mlp_out", range(L)))
    ref, ref_final = forward.full_cache(model, group.tokens, names)
    cf, _ = forward.full_cache(model, group.cf_tokens, names)
    base = score_end(model, ref_final, group.answer_ids, group.alt_ids, metric)
    out = torch.empty(len(senders), len(group), device=base.device, dtype=base.dtype)
    for k, sender in enumerate(senders):
        hooks = _freeze_hooks(model, ref, cf, sender, freeze_mlps)
        if receiver_spec is None:
            resid = model.run_with_hooks(group.tokens, fwd_hooks=hooks, stop_at_layer=L)[:, -1]
        else:
            resid = _through_receivers(model, group.tokens, hooks, *receiver_spec)
        out[k] = score_end(model, resid, group.answer_ids, group.alt_ids, metric)
        bar.update(1)
    return out, base


def _freeze_hooks(model, ref, cf, sender: Node, freeze_mlps: bool):
    """Hooks that freeze every head (and optionally MLP) to the reference, except the sender (counterfactual)."""

    def freeze_z(z, *, hook):
        new = ref[hook.name].clone()
        if isinstance(sender, Head) and hook.name == sender.hook_name:
            new[:, :, sender.head] = cf[hook.name][:, :, sender.head]
        return new

    def mlp(out, *, hook):
        if hook.name == sender.hook_name:
            return cf[hook.name]
        return ref[hook.name] if freeze_mlps else out

    hooks = [(tl_utils.get_act_name("z", l), freeze_z) for l in range(model.cfg.n_layers)]
    if not model.cfg.attn_only:
        hooks += [(tl_utils.get_act_name("mlp_out", l), mlp) for l in range(model.cfg.n_layers)]
    return hooks


def _through_receivers(model, tokens, sender_hooks, receivers: Sequence[Head], receiver_input: str) -> Float[Tensor, "batch d_model"]:
    """Step 2: record the receivers' q/k/v under the sender hooks; step 3: patch them into a free reference run."""
    group_size = model.cfg.n_heads // (model.cfg.n_key_value_heads or model.cfg.n_heads)
    recorded: dict[tuple[str, int], Tensor] = {}
    slots = []  # (hook name, index along the head axis); k/v live per KV head under GQA/MQA
    for r in receivers:
        for part in receiver_input:
            index = r.head if part == "q" else r.head // group_size
            slots.append((tl_utils.get_act_name(part, r.layer), index))
    slots = sorted(set(slots))

    def record(act, *, hook):
        for name, index in slots:
            if name == hook.name:
                recorded[(name, index)] = act[:, :, index].clone()

    last = max(r.layer for r in receivers) + 1
    names = sorted({name for name, _ in slots})
    model.run_with_hooks(tokens, fwd_hooks=list(sender_hooks) + [(n, record) for n in names], stop_at_layer=last)

    def patch(act, *, hook):
        act = act.clone()
        for (name, index), value in recorded.items():
            if name == hook.name:
                act[:, :, index] = value
        return act

    return model.run_with_hooks(tokens, fwd_hooks=[(n, patch) for n in names], stop_at_layer=model.cfg.n_layers)[:, -1]
