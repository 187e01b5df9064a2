"""Activation patching: swap one activation from the counterfactual run into the reference run.

For each site (a layer's head output ``z``, MLP output, attention output or
residual stream; at every position at once, at END only, or at each position
separately) run the reference prompts with that activation replaced by its
value on the counterfactual twins and score the END logits. Unlike path
patching, everything downstream is recomputed freely, so the score is the
site's *total* effect.

Results equal TransformerLens' ``patching.get_act_patch_*`` functions called
with ``corrupted_tokens=reference`` and ``clean_cache=counterfactual cache``
(tests check this), but are computed much faster:

* the reference and counterfactual runs are cached once (no unembedding);
* a patched forward starts at the patched layer from the cached residual
  (``start_at_layer``): layers below it cannot change;
* several patches share one batched forward (patches stacked along the batch
  dimension, each with its own position/head mask), chunked to a memory budget;
* logits are computed at END only, and only for the tokens the metric reads;
* positions before the first one where reference and counterfactual differ
  (the few-shot prefix and the start of the queried line) hold the same
  activations in both runs, so a patch cannot change them: the patched
  forward runs only the positions after that point, reading the prefix's
  keys and values from a cache (``reuse_prefix=True``). With few-shot
  prompts this is most of the sequence.
"""

from __future__ import annotations

import numbers
from typing import Literal, Sequence, get_args

import torch
from jaxtyping import Bool
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer
from transformer_lens import utils as tl_utils

from circuits.errors import InputError
from circuits.arguments import check_option
from circuits.prefix_cache import TiledKVCache, prefix_kv_cache

from patching.sweeps import forward, inputs
from patching.sweeps.metrics import MetricLike, get_metric, score_end
from patching.sweeps.options import SweepOptions, sweep_options
from patching.sweeps.results import ActivationScores

Component = Literal["z", "attn_out", "mlp_out", "resid_pre", "resid_mid", "resid_post"]
Positions = Literal["all", "end", "each"]
COMPONENTS: tuple[str, ...] = get_args(Component)
POSITIONS: tuple[str, ...] = get_args(Positions)


@torch.no_grad()
def activation_patch(
    model: HookedTransformer,
    reference,
    counterfactual: Tensor | None = None,
    *,
    component: Component = "z",
    positions: Positions = "all",
    layers: Sequence[int] | None = None,
    answer_ids=None,
    alt_ids=None,
    options: SweepOptions | None = None,
) -> ActivationScores:
    """Activation-patch ``component`` at every layer (and head, for ``"z"``); mean patched metric per site.

    Args:
        model: any HookedTransformer.
        reference, counterfactual, answer_ids, alt_ids: prompts, as in :func:`patching.path_patch`.
        component: one of ``COMPONENTS``: ``"z"`` patches each head's output separately; the others
            patch the whole activation of a layer.
        positions: ``"all"`` (every position at once), ``"end"`` (END only) or ``"each"`` (one position at a time;
            adds a ``pos`` axis and needs prompts of a single token length).
        layers: restrict to these layers (default: all); the result keeps all layers, NaN elsewhere.
        options: :class:`patching.SweepOptions` (None: its defaults): ``metric``,
            ``batch_size``, ``memory_mb`` (activation budget per batched forward), ``reuse_prefix``
            (recompute only the positions from the first one where reference and counterfactual differ,
            with the shared prefix's keys/values cached: same result, faster; ``False`` recomputes every
            position), ``progress``.
    Returns:
        :class:`ActivationScores` with axes ``(layer, head)``, ``(layer, pos, head)``, ``(layer,)`` or ``(layer, pos)``.
    """
    check_option("component", component, Component)
    check_option("positions", positions, Positions)
    if component in ("mlp_out", "resid_mid") and model.cfg.attn_only:
        raise InputError(f"The model is attention-only: it has no {component}.")
    opts = sweep_options(options, "activation_patch")
    metric, batch_size, memory_mb = get_metric(opts.metric), opts.batch_size, opts.budget()
    reuse_prefix, progress = opts.reuse_prefix, opts.shows_progress()
    L, H = model.cfg.n_layers, model.cfg.n_heads
    layers = list(range(L)) if layers is None else sorted(set(layers))
    if not layers:
        raise InputError(f"layers is empty, so nothing would be patched: name at least one layer in 0..{L - 1}, "
                         "or pass layers=None for all.")
    bad = [l for l in layers if isinstance(l, bool) or not isinstance(l, numbers.Integral) or not 0 <= l < L]
    if bad:
        raise InputError(f"Layers {bad} are out of range; the model has layers 0..{L - 1}.")
    groups = inputs.prompt_groups(model, reference, counterfactual, answer_ids=answer_ids, alt_ids=alt_ids,
                                 batch_size=batch_size)
    n_pos = groups[0].tokens.shape[1]
    if positions == "each" and any(g.tokens.shape[1] != n_pos for g in groups):
        raise InputError("positions='each' needs prompts of one token length (restrict the dataset to one template).")

    per_head = component == "z"
    site_shape = {"all": (), "end": (), "each": (n_pos,)}[positions] + ((H,) if per_head else ())
    total = torch.full((L, *site_shape), float("nan"), dtype=torch.float64)
    total[layers] = 0.0
    base_total, n_prompts, any_change = 0.0, 0, False
    n_sites = len(layers) * max(1, int(torch.tensor(site_shape).prod()))
    bar = tqdm(total=len(groups) * n_sites, desc=f"activation patching {component}", disable=not progress, leave=False)
    for group in groups:
        # Both runs share the prefix, so its keys/values are computed once and only later positions are cached.
        prefix = forward.shared_prefix_length(group.tokens, group.cf_tokens) if reuse_prefix else 0
        prefix_kv = prefix_kv_cache(model, group.tokens[:, :prefix]) if prefix else None
        ref, ref_final = forward.suffix_cache(model, group.tokens, forward.act_names("resid_pre", layers), prefix_kv)
        cf, _ = forward.suffix_cache(model, group.cf_tokens, forward.act_names(component, layers), prefix_kv)
        base = score_end(model, ref_final, group.answer_ids, group.alt_ids, metric)
        for layer in layers:
            masks = _site_masks(positions, group.tokens.shape[1], H if per_head else None, group.tokens.device)
            values = _patch_layer(model, group, layer, component, masks, ref, cf, metric, memory_mb, bar,
                                  base, prefix, prefix_kv)
            total[layer] += values.double().sum(-1).cpu().view(site_shape)
            any_change = any_change or bool((values != base).any())
        base_total += float(base.double().sum())
        n_prompts += len(group)
    bar.close()
    inputs.warn_if_no_effect(any_change, groups, "activation-patching")
    axes = ("layer",) + (("pos",) if positions == "each" else ()) + (("head",) if per_head else ())
    return ActivationScores((total / n_prompts).float(), axes, component, metric.name, base_total / n_prompts, n_prompts)


def _site_masks(positions: str, n_pos: int, n_heads: int | None, device) -> Bool[Tensor, "site pos ..."]:
    """One boolean mask per patch site over (pos[, head]), in the result's (pos, head) order."""
    if positions == "each":
        pos_masks = torch.eye(n_pos, dtype=torch.bool, device=device)
    else:
        pos_masks = torch.ones(1, n_pos, dtype=torch.bool, device=device)
        if positions == "end":
            pos_masks[:, :-1] = False
    if n_heads is None:
        return pos_masks
    head_masks = torch.eye(n_heads, dtype=torch.bool, device=device)
    # [n_pos_sites, n_heads_sites, pos, head] -> sites in (pos, head) order
    return (pos_masks[:, None, :, None] & head_masks[None, :, None, :]).flatten(0, 1)


@torch.no_grad()
def _patch_layer(model, group, layer, component, masks, ref, cf, metric, memory_mb, bar, base, prefix, prefix_kv) -> Tensor:
    """Patched metric [n_sites, batch] of all sites of one layer, in batched chunks.

    Only positions ``prefix:`` are run (``ref`` and ``cf`` hold those positions; the prefix's
    keys/values come from ``prefix_kv``); a site that patches nothing after the prefix patches
    identical values, so it scores ``base``.
    """
    B, n_pos = group.tokens.shape
    name = tl_utils.get_act_name(component, layer)
    start = ref[tl_utils.get_act_name("resid_pre", layer)]
    cf_act = cf[name]
    masks = masks[:, prefix:]
    active = masks.flatten(1).any(1).nonzero()[:, 0]
    out = base.to(torch.float32)[None].repeat(masks.shape[0], 1)
    bar.update(masks.shape[0] - len(active))
    per_chunk = max(1, forward.rows_per_chunk(model, memory_mb, n_pos - prefix, cached_pos=prefix) // B)
    for sl in forward.chunks(len(active), per_chunk):
        sites = active[sl]
        m = masks[sites]
        k = m.shape[0]
        # broadcast a site mask over the batch and the trailing feature axis
        shaped = m.view(k, 1, *m.shape[1:], 1)

        def swap(act, *, hook):
            act = act.view(k, B, *act.shape[1:])
            return torch.where(shaped, cf_act[None], act).flatten(0, 1)

        kv = None if prefix_kv is None else TiledKVCache(prefix_kv, k)
        resid = model.run_with_hooks(start.repeat(k, 1, 1), start_at_layer=layer, stop_at_layer=model.cfg.n_layers,
                                     fwd_hooks=[(name, swap)], past_kv_cache=kv)
        answers = group.answer_ids.repeat(k)
        alts = None if group.alt_ids is None else group.alt_ids.repeat(k)
        out[sites] = score_end(model, resid[:, -1], answers, alts, metric).view(k, B).float()
        bar.update(k)
    return out
