"""Exact edge patching: the effect of each single edge, the ground truth edge attribution approximates.

For an edge ``s -> r`` (:mod:`circuits.graph`) and a reference prompt with its
counterfactual twin, run the reference prompt with receiver ``r``'s input changed by

    in_r := in_r − o_s(reference) + o_s(counterfactual)

(sender outputs under :mod:`patching.edges.engine`' convention) and everything else free:
components after ``r`` are recomputed from the changed input. The edge's effect is
``m(patched) − m(reference)`` of the END metric, averaged over prompts. It equals
:func:`patching.evaluate_circuit` of the full graph minus that one edge with
counterfactual ablation (nothing upstream of ``r`` changes, so ``s`` outputs its
reference value in that run too).

Speed (all 10,342 edges of gemma-3-270m are feasible on a laptop CPU):

* the reference and counterfactual senders are recorded once per prompt group, and
  each edge's input change ``o_s(cf) − o_s(ref)`` is a precomputed constant;
* a patched forward starts at the receiver's layer from the cached reference residual
  (``start_at_layer``): nothing below the receiver changes; only that layer runs with
  per-head q/k/v inputs (and K/V ungrouped per query head), the layers above run plain;
* many edges share one forward (edges stacked along the batch, each row adding its own
  change at its own receiver), chunked to a memory budget;
* only positions after the shared prefix of reference and counterfactual are run (the
  prefix's senders are identical in both runs, so the change is zero there), with the
  prefix's keys/values read from a cache;
* edges into ``logits`` need no forward at all: the change is added to the final
  residual at END, and only the metric's vocabulary columns are unembedded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from patching import forward, inputs
from patching.edges.patch_fast import end_residual_above, fast_path_problem, head_receiver_layer, mlp_receiver_layer, receiver_kind
from patching.edges.engine import SenderRecorder, edge_mode, plain_blocks, receiver_hooks, run_suffix, sender_outputs, ungroup_kv
from patching.metrics import PatchMetric, get_metric, score_end

EdgesInput = Union[None, Sequence[str], Sequence[tuple[int, int]], Bool[Tensor, "n_forward n_backward"], Graph]


@dataclass
class EdgeEffects:
    """Exact effects of patched edges: ``scores[f, b]`` is edge (f, b)'s mean effect, NaN where not patched."""

    layout: GraphLayout
    edges: list[tuple[int, int]]
    per_prompt: Float[Tensor, "edge prompt"]
    metric: str
    reference_metric: float
    #: wall seconds by stage: "reference runs", "logits", "layer L mlp" / "layer L heads" (fast path), "layer L"
    seconds: dict = field(default_factory=dict)

    @property
    def effects(self) -> Float[Tensor, "edge"]:
        return self.per_prompt.double().mean(1)

    @property
    def scores(self) -> Float[Tensor, "n_forward n_backward"]:
        scores = torch.full((self.layout.n_forward, self.layout.n_backward), float("nan"))
        if self.edges:
            f, b = torch.tensor(self.edges).T
            scores[f, b] = self.effects.float()
        return scores

    @property
    def n_prompts(self) -> int:
        return int(self.per_prompt.shape[1])

    def graph(self) -> Graph:
        """A :class:`circuits.graph.Graph` whose scores are these effects (all edges in the graph)."""
        return Graph(self.layout, scores=self.scores, meta={"method": "exact edge patching", "metric": self.metric})

    def save(self, folder, d_model: Optional[int] = None) -> None:
        """Write ``<folder>/exact_edges.safetensors`` (per-prompt effects, edge indices) and
        ``<folder>/exact_edges_eap.json`` (the mean effects as an EAP-IG graph file), each atomically."""
        from safetensors.torch import save_file

        from circuits.atomic_files import atomic_path
        from circuits.graph_io import save_eap_json

        folder = Path(folder)
        with atomic_path(folder / "exact_edges.safetensors") as tmp:
            save_file({"per_prompt": self.per_prompt.contiguous(), "edges": torch.tensor(self.edges)}, str(tmp),
                      metadata={"metric": self.metric, "reference_metric": repr(self.reference_metric)})
        save_eap_json(self.graph(), folder / "exact_edges_eap.json", d_model=d_model)

    def to_dict(self) -> dict:
        names = [self.layout.edge_name(f, b) for f, b in self.edges]
        return {"method": "exact edge patching", "metric": self.metric, "reference_metric": self.reference_metric,
                "n_prompts": self.n_prompts, "effects": dict(zip(names, self.effects.tolist()))}


def resolve_edges(layout: GraphLayout, edges: EdgesInput) -> list[tuple[int, int]]:
    """(forward, backward) index pairs of ``edges``: None (all), names, index pairs, a bool mask or a Graph."""
    if edges is None:
        edges = layout.real_edge_mask
    if isinstance(edges, Graph):
        edges = edges.in_graph & layout.real_edge_mask
    if isinstance(edges, Tensor):
        if tuple(edges.shape) != (layout.n_forward, layout.n_backward):
            raise InputError(f"An edge mask must have shape {(layout.n_forward, layout.n_backward)}, got {tuple(edges.shape)}.")
        return [tuple(p) for p in (edges.bool().cpu() & layout.real_edge_mask).nonzero().tolist()]
    pairs = []
    for edge in edges:
        if isinstance(edge, str):
            pairs.append(layout.edge_index(edge))
        else:
            f, b = (int(i) for i in edge)
            if not (0 <= f < layout.n_forward and 0 <= b < layout.n_backward and layout.real_edge_mask[f, b]):
                raise InputError(f"({f}, {b}) is not an edge of this graph (see GraphLayout.real_edge_mask).")
            pairs.append((f, b))
    return pairs


@torch.no_grad()
def edge_patch(
    model: HookedTransformer,
    edges: EdgesInput,
    reference,
    counterfactual: Optional[Tensor] = None,
    *,
    metric: Union[str, PatchMetric, Callable] = "logit",
    answer_ids=None,
    alt_ids=None,
    batch_size: Optional[int] = None,
    memory_mb: float = 1024.0,
    reuse_prefix: bool = True,
    fast: bool = True,
    progress: bool = True,
) -> EdgeEffects:
    """Exact effect of each edge (see the module docstring).

    Args:
        model: a HookedTransformer the edge graph can represent (:func:`patching.edges.engine.check_edge_model`).
        edges: None (every edge), EAP-IG edge names (``"a3.h1->a7.h0<q>"``), ``(forward, backward)``
            index pairs, a bool mask ``[n_forward, n_backward]`` or a Graph (its ``in_graph`` edges).
        reference, counterfactual, answer_ids, alt_ids, batch_size: prompts, as in :func:`patching.path_patch`.
        metric: a name in :data:`patching.metrics.METRICS` or a callable ``fn(logits, answer_ids, alt_ids)``.
        memory_mb: activation budget per batched forward.
        reuse_prefix: run only the positions after the shared prefix of reference and counterfactual.
        fast: patched forwards as plain loops over block pieces (:mod:`patching.edges.patch_fast`) where the
            architecture allows; False runs them through hooks (slower, same numbers; for comparisons).
    Returns:
        :class:`EdgeEffects`, edges in the order given.
    """
    metric = get_metric(metric)
    layout = GraphLayout.of(model)
    pairs = resolve_edges(layout, edges)
    if not pairs:
        raise InputError("No edges to patch.")
    groups = inputs.prompt_groups(model, reference, counterfactual, answer_ids=answer_ids, alt_ids=alt_ids,
                                 batch_size=batch_size)
    per_group, base_total, n_prompts, seconds = [], 0.0, 0, {}
    bar = tqdm(total=len(groups) * len(pairs), desc="edge patching", disable=not progress, leave=False)
    with edge_mode(model):
        hooks = receiver_hooks(model)
        for group in groups:
            patched, base = _patch_group(model, layout, hooks, pairs, group, metric, memory_mb, reuse_prefix, fast, bar,
                                        seconds)
            per_group.append((patched - base[None]).double().cpu())
            base_total += float(base.double().sum())
            n_prompts += len(group)
    bar.close()
    return EdgeEffects(layout, pairs, torch.cat(per_group, dim=1), metric.name, base_total / n_prompts, seconds)


def _patch_group(model, layout, hooks, pairs, group, metric, memory_mb, reuse_prefix, fast, bar,
                 seconds) -> tuple[Tensor, Tensor]:
    """Patched metric [n_edges, batch] and reference metric [batch] on one group of equal-length prompts.

    Adds the wall time of each stage to ``seconds``.
    """
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[stage] = seconds.get(stage, 0.0) + now - clock
        clock = now

    B, n_pos = group.tokens.shape
    start = forward.shared_prefix_length(group.tokens, group.cf_tokens) if reuse_prefix else 0
    # Only the receiver's own block needs per-head q/k/v inputs (and ungrouped K/V): every other
    # block runs plain, with the prefix's grouped keys/values.
    if start:
        with plain_blocks(model):
            kv_plain = forward.prefix_kv_cache(model, group.tokens[:, :start])
        kv_split = ungroup_kv(model, kv_plain)
    else:
        kv_plain = kv_split = None
    P = n_pos - start

    # The reference run: every sender's output and every layer's residual input, positions start:.
    recorder = SenderRecorder(model)
    ref_resid: dict[str, dict[int, Tensor]] = {"resid_pre": {}, "resid_mid": {}}

    def keep(act, *, hook):
        ref_resid[hook.name.split(".")[-1].removeprefix("hook_")][int(hook.name.split(".")[1])] = act

    names = forward.act_names("resid_pre", range(layout.n_layers))
    fast = fast and fast_path_problem(model) is None
    if fast:
        names += forward.act_names("resid_mid", range(layout.n_layers))
    with plain_blocks(model):
        final = run_suffix(model, group.tokens, start, kv_plain, recorder.hooks() + [(n, keep) for n in names])
        delta = sender_outputs(model, group.cf_tokens, start=start, prefix_kv=kv_plain) - recorder.stacked()  # [f, B, P, d]
    base = score_end(model, final[:, -1], group.answer_ids, group.alt_ids, metric)
    lap("reference runs")

    out = torch.empty(len(pairs), B, dtype=base.dtype, device=base.device)
    # chunks never mix receiver layers (the forward starts there) nor, on the fast path, MLP and head receivers
    by_layer: dict[Optional[tuple[int, bool]], list[int]] = {}
    for i, (f, b) in enumerate(pairs):
        if b == layout.logits_backward:
            key = None
        else:
            layer, kind, _ = receiver_kind(layout, b)
            key = (layer, fast and kind is None)
        by_layer.setdefault(key, []).append(i)

    # Edges into the logits: the change lands on the final residual; only END is scored.
    logit_edges = by_layer.pop(None, [])
    if logit_edges:
        f_idx = torch.tensor([pairs[i][0] for i in logit_edges], device=delta.device)
        resid = (final[:, -1][None] + delta[f_idx, :, -1]).flatten(0, 1)
        out[logit_edges] = score_end(model, resid, group.answer_ids.repeat(len(logit_edges)),
                                     None if group.alt_ids is None else group.alt_ids.repeat(len(logit_edges)),
                                     metric).view(len(logit_edges), B)
        bar.update(len(logit_edges))
        lap("logits")

    cfg = model.cfg
    split_factor = (12 + 6 * cfg.n_heads) / 12  # per-head q/k/v inputs: ~6·n_heads extra residual copies per position
    per_chunk = max(1, forward.rows_per_chunk(model, memory_mb / split_factor, P, cached_pos=start) // B)
    for (layer, mlp_only), indices in sorted(by_layer.items()):
        for sl in forward.chunks(len(indices), per_chunk):
            chunk = indices[sl]
            k = len(chunk)
            if fast:
                end = _fast_end_residual(model, layout, layer, mlp_only, [pairs[i] for i in chunk], delta, ref_resid,
                                         kv_plain, kv_split)
            else:
                fwd_hooks = _receiver_patch_hooks([pairs[i] for i in chunk], hooks, delta, k, B)
                end = model.run_with_hooks(ref_resid["resid_pre"][layer].repeat(k, 1, 1), start_at_layer=layer,
                                           stop_at_layer=layer + 1, fwd_hooks=fwd_hooks, past_kv_cache=_tiled(kv_split, k))
                if layer + 1 < cfg.n_layers:
                    with plain_blocks(model):
                        end = model(end, start_at_layer=layer + 1, stop_at_layer=cfg.n_layers,
                                    past_kv_cache=_tiled(kv_plain, k))
                end = end[:, -1]
            answers = group.answer_ids.repeat(k)
            alts = None if group.alt_ids is None else group.alt_ids.repeat(k)
            out[chunk] = score_end(model, end, answers, alts, metric).view(k, B)
            bar.update(k)
        lap(f"layer {layer}" + ("" if not fast else " mlp" if mlp_only else " heads"))
    return out, base


def _fast_end_residual(model, layout, layer, mlp_only, chunk_pairs, delta, resid, kv_plain, kv_split) -> Tensor:
    """Final END residual [edges * batch, d_model] of a chunk of edges into one layer (:mod:`patching.edges.patch_fast`)."""
    change = delta[torch.tensor([f for f, _ in chunk_pairs], device=delta.device)]
    last = layer == layout.n_layers - 1
    if mlp_only:
        out = mlp_receiver_layer(model, layer, resid["resid_mid"][layer], change, end_only=last)
    else:
        receivers = [receiver_kind(layout, b)[1:] for _, b in chunk_pairs]
        out = head_receiver_layer(model, layer, resid["resid_pre"][layer], receivers, change, kv_split, end_only=last)
    return end_residual_above(model, layer, out, kv_plain)


def _tiled(entries, times: int):
    return None if entries is None else forward.TiledKVCache(entries, times)


def _receiver_patch_hooks(chunk_pairs, hooks, delta, k: int, B: int):
    """One hook per receiver hook point in the chunk; row block j (prompts of edge j) gets ``delta[f_j]`` at its head."""
    by_hook: dict[str, list[tuple[int, Optional[int], int]]] = {}
    for j, (f, b) in enumerate(chunk_pairs):
        name, head = hooks[b]
        by_hook.setdefault(name, []).append((j, head, f))

    def make(entries):
        rows = torch.tensor([j for j, _, _ in entries], device=delta.device)
        senders = torch.tensor([f for _, _, f in entries], device=delta.device)
        heads = None if entries[0][1] is None else torch.tensor([h for _, h, _ in entries], device=delta.device)

        def patch(act, *, hook):
            act = act.clone().view(k, B, *act.shape[1:])  # hook_{q,k,v}_input may be a broadcast view
            if heads is None:
                act[rows] += delta[senders]
            else:
                act[rows, :, :, heads] += delta[senders]
            return act.flatten(0, 1)

        return patch

    return [(name, make(entries)) for name, entries in by_hook.items()]
