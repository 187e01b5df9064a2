"""Attribution patching (Nanda 2023; Syed et al. 2023): every node's patching effect from one backward pass.

Activation patching a node n changes the metric M by
``M(a_ref + (a_cf - a_ref)) - M(a_ref)``; to first order that is
``<a_cf - a_ref, dM/da>`` with the gradient taken on the reference run. So one
reference forward (keeping activations), one counterfactual forward and one
backward score every head (through its ``hook_z`` slice, summed over positions
and ``d_head``) and every MLP (``hook_mlp_out``) at once.

The estimate is linear: it is good where the metric is locally linear in the
activation and can be poor through saturated softmaxes and norms. Check it
against exact activation patching or path patching on the same prompts with
:func:`rank_agreement` (Spearman rank correlation).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from scipy.stats import spearmanr
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.nodes import MLP, Head, Node, all_nodes, validate_nodes
from patching.sweeps import forward, inputs
from patching.sweeps.metrics import MetricLike, get_metric, score_end
from patching.sweeps.options import SweepOptions, sweep_options
from patching.sweeps.results import ActivationScores, NodeScores


def attribution_patch(
    model: HookedTransformer,
    reference,
    counterfactual: Tensor | None = None,
    *,
    nodes: Sequence[Node] | None = None,
    answer_ids=None,
    alt_ids=None,
    options: SweepOptions | None = None,
) -> NodeScores:
    """Linear estimate of each node's activation-patching effect (counterfactual value into the reference run).

    Arguments as in :func:`patching.path_patch` (``options``: :class:`patching.SweepOptions`, None for its
    defaults; only ``metric``, ``batch_size`` and ``progress`` apply); ``nodes`` defaults to every head and MLP.
    Returns :class:`NodeScores` with ``method="attribution"`` (estimated effect, mean over prompts).
    """
    opts = sweep_options(options, "attribution_patch")
    metric, batch_size, progress = get_metric(opts.metric), opts.batch_size, opts.shows_progress()
    nodes = validate_nodes(model, all_nodes(model) if nodes is None else nodes)
    if not nodes:
        raise InputError("nodes is empty, so nothing would be scored: pass at least one Head or MLP, or nodes=None "
                         "for every head and MLP.")
    groups = inputs.prompt_groups(model, reference, counterfactual, answer_ids=answer_ids, alt_ids=alt_ids,
                                 batch_size=batch_size)
    names = sorted({n.hook_name for n in nodes})
    heads = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, dtype=torch.float64)
    mlps = torch.zeros(model.cfg.n_layers, dtype=torch.float64)
    base_total, n_prompts = 0.0, 0
    for group in tqdm(groups, desc="attribution patching", disable=not progress, leave=False):
        cf, _ = forward.full_cache(model, group.cf_tokens, names)
        acts: dict[str, Tensor] = {}

        def keep(act, *, hook):
            acts[hook.name] = act

        with torch.enable_grad():
            resid = model.run_with_hooks(group.tokens, fwd_hooks=[(n, keep) for n in names],
                                         stop_at_layer=model.cfg.n_layers)
            values = score_end(model, resid[:, -1], group.answer_ids, group.alt_ids, metric)
            if not values.requires_grad:
                raise InputError(f"Metric {metric.name!r} does not depend on the logits it is given (a constant, or a "
                                 "value detached from them), so it has no gradient to attribute: use a "
                                 "differentiable metric of the END logits such as 'logit' or 'logit_diff'.")
            # prompts are independent, so the gradient of the sum is each prompt's own gradient
            grads = dict(zip(names, torch.autograd.grad(values.sum(), [acts[n] for n in names])))
        for name in names:
            delta = (cf[name] - acts[name].detach()).double() * grads[name].double()
            if delta.ndim == 4:  # [batch, pos, head, d_head] -> per head
                heads[int(name.split(".")[1])] += delta.sum(dim=(0, 1, 3)).cpu()
            else:
                mlps[int(name.split(".")[1])] += delta.sum().cpu()
        base_total += float(values.detach().double().sum())
        n_prompts += len(group)
    head_out = torch.full(heads.shape, float("nan"))
    mlp_out = torch.full(mlps.shape, float("nan"))
    for node in nodes:
        if isinstance(node, Head):
            head_out[node.layer, node.head] = float(heads[node.layer, node.head] / n_prompts)
        else:
            mlp_out[node.layer] = float(mlps[node.layer] / n_prompts)
    return NodeScores(head_out, mlp_out, metric.name, base_total / n_prompts, n_prompts, "attribution")


def _node_values(result: NodeScores | ActivationScores) -> dict[Node, float]:
    if isinstance(result, NodeScores):
        return {n: v for n, v in result.ranked("all")}
    if result.axes == ("layer", "head"):
        return {Head(l, h): float(v) for l, row in enumerate(result.effect.tolist()) for h, v in enumerate(row)
                if math.isfinite(v)}
    if result.axes == ("layer",) and result.component == "mlp_out":
        return {MLP(l): float(v) for l, v in enumerate(result.effect.tolist()) if math.isfinite(v)}
    raise InputError(f"Cannot compare activation patching with axes {result.axes} of {result.component!r}: use "
                     f"component='z' or 'mlp_out' with positions='all' or 'end'.")


def rank_agreement(
    a: NodeScores | ActivationScores | Sequence,
    b: NodeScores | ActivationScores | Sequence,
    kind: str = "all",
) -> dict:
    """Spearman rank correlation of two node scorings over the nodes both scored.

    Each side is a :class:`NodeScores` (path or attribution patching), an :class:`ActivationScores`
    of heads (``z``) or MLPs (``mlp_out``) without a position axis, or a list of those (merged).
    ``kind`` restricts to ``"heads"`` or ``"mlps"``. Returns ``{"spearman", "p_value", "n_nodes"}``.
    """
    def values(x):
        out: dict[Node, float] = {}
        for part in (x if isinstance(x, (list, tuple)) else [x]):
            out.update(_node_values(part))
        if kind == "heads":
            return {n: v for n, v in out.items() if isinstance(n, Head)}
        if kind == "mlps":
            return {n: v for n, v in out.items() if isinstance(n, MLP)}
        return out

    va, vb = values(a), values(b)
    common = sorted(set(va) & set(vb), key=lambda n: (isinstance(n, MLP), n.layer, getattr(n, "head", 0)))
    if len(common) < 3:
        raise InputError(f"Only {len(common)} nodes are scored by both results; rank correlation needs at least 3.")
    rho, p = spearmanr([va[n] for n in common], [vb[n] for n in common])
    return {"spearman": float(rho), "p_value": float(p), "n_nodes": len(common)}
