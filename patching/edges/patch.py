"""Exact edge patching: the effect of each single edge, the ground truth edge attribution approximates.

For an edge ``s -> r`` (:mod:`circuits.graph`) and a reference prompt with its
counterfactual twin, run the reference prompt with receiver ``r``'s input changed by

    in_r := in_r − o_s(reference) + o_s(counterfactual)

(sender outputs under :mod:`patching.edges.engine`' convention) and everything else free:
components after ``r`` are recomputed from the changed input. The edge's effect is
``m(patched) − m(reference)`` of the END metric, averaged over prompts. It equals
:func:`patching.edges.evaluate_circuit` of the full graph minus that one edge with
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
from circuits.graph_io import check_graph_fits
from circuits.prefix_cache import TiledKVCache
from patching.sweeps import forward, inputs
from patching.sweeps.options import SweepOptions, sweep_options
from patching.edges.patch_fast import end_residual_above, fast_path_problem, head_receiver_layer, mlp_receiver_layer, receiver_kind
from patching.edges.engine import (
    SenderRecorder, edge_mode, plain_blocks, prefix_caches, receiver_hooks, run_suffix, sender_outputs,
)
from patching.edges.mixing import check_norm, record_outputs, rms_norm
from patching.sweeps.metrics import PatchMetric, get_metric, score_end

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

    def save(self, folder, d_model: Optional[int] = None, *, overwrite: bool = False) -> None:
        """Write ``<folder>/exact_edges.safetensors`` (per-prompt effects, edge indices) and
        ``<folder>/exact_edges_eap.json`` (the mean effects as an EAP-IG graph file), each atomically;
        existing files are replaced only with ``overwrite=True``."""
        from safetensors.torch import save_file

        from circuits.atomic_files import atomic_path, refuse_existing
        from circuits.graph_io import save_eap_json

        folder = Path(folder)
        for name in ("exact_edges.safetensors", "exact_edges_eap.json"):
            refuse_existing(folder / name, overwrite)
        with atomic_path(folder / "exact_edges.safetensors") as tmp:
            save_file({"per_prompt": self.per_prompt.contiguous(), "edges": torch.tensor(self.edges)}, str(tmp),
                      metadata={"metric": self.metric, "reference_metric": repr(self.reference_metric)})
        save_eap_json(self.graph(), folder / "exact_edges_eap.json", d_model=d_model, overwrite=overwrite)

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
    answer_ids=None,
    alt_ids=None,
    fast: bool = True,
    rotate_prefix_once: bool = True,
    norm: str = "frozen",
    options: Optional[SweepOptions] = None,
) -> EdgeEffects:
    """Exact effect of each edge (see the module docstring).

    Args:
        model: a HookedTransformer the edge graph can represent (:func:`patching.edges.engine.check_edge_model`).
        edges: None (every edge), EAP-IG edge names (``"a3.h1->a7.h0<q>"``), ``(forward, backward)``
            index pairs, a bool mask ``[n_forward, n_backward]`` or a Graph (its ``in_graph`` edges).
        reference, counterfactual, answer_ids, alt_ids: prompts, as in :func:`patching.path_patch`.
        fast: patched forwards as plain loops over block pieces (:mod:`patching.edges.patch_fast`) where the
            architecture allows; False runs them through hooks (slower, same numbers; for comparisons).
        rotate_prefix_once: on the fast path, rotary rotates the prefix's cached keys once per layer
            (:func:`patching.edges.patch_fast.prefix_rotary_once`); False rotates them at every call, as
            TransformerLens does (slower, same numbers; for timing the two).
        norm: on models with norms after attention, ``"frozen"`` patches a head's output at its own run's
            scale; ``"recompute"`` re-normalises the receiver's view of the sender's layer with the sender's
            pre-norm result swapped (hannamw/EAP-IG's and MIB's convention, :mod:`patching.edges.mixing`).
        options: :class:`patching.SweepOptions` (metric, batch_size, memory_mb, reuse_prefix,
            progress); None for its defaults.
    Returns:
        :class:`EdgeEffects`, edges in the order given.
    """
    opts = sweep_options(options, "edge_patch")
    check_norm(norm)
    metric = get_metric(opts.metric)
    layout = GraphLayout.of(model)
    if isinstance(edges, Graph):  # another model's graph: refused naming what differs, not a tensor size mismatch
        check_graph_fits(edges, model, "edges (a Graph)")
    pairs = resolve_edges(layout, edges)
    if not pairs:
        raise InputError("No edges to patch.")
    groups = inputs.prompt_groups(model, reference, counterfactual, answer_ids=answer_ids, alt_ids=alt_ids,
                                  batch_size=opts.batch_size)
    per_group, base_total, n_prompts, seconds = [], 0.0, 0, {}
    bar = tqdm(total=len(groups) * len(pairs), desc="edge patching", disable=not opts.shows_progress(), leave=False)
    with edge_mode(model):
        fast = fast and fast_path_problem(model) is None
        for group in groups:
            clock = _Clock(seconds)
            runs = _ReferenceRuns.record(model, layout, group, metric, reuse_prefix=opts.reuse_prefix, fast=fast,
                                         norm=norm, rotate_prefix_once=rotate_prefix_once)
            clock.lap("reference runs")
            patched = runs.patch(pairs, opts.budget(), bar, clock)
            per_group.append((patched - runs.base[None]).double().cpu())
            base_total += float(runs.base.double().sum())
            n_prompts += len(group)
    bar.close()
    inputs.warn_if_no_effect(any(bool(d.any()) for d in per_group), groups, "edge-patching")
    return EdgeEffects(layout, pairs, torch.cat(per_group, dim=1), metric.name, base_total / n_prompts, seconds)


class _Clock:
    """Adds the wall time since the last lap to ``seconds[stage]``."""

    def __init__(self, seconds: dict):
        self.seconds, self.last = seconds, time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self.last
        self.last = now


@dataclass
class _ReferenceRuns:
    """One group's reference run (residuals, final residual, metric), its senders' changes, the prefix caches.

    ``delta[f]`` is sender f's output on the counterfactual minus its output on the reference, at the
    positions after the shared prefix (``start:``); ``resid_pre[L]`` / ``resid_mid[L]`` the reference
    residual entering layer L / its MLP (the latter on the fast path only); ``kv_plain`` the prefix's
    keys/values per K/V head and ``kv_split`` per query head (None without a shared prefix).
    """

    model: HookedTransformer
    layout: GraphLayout
    group: inputs.PromptGroup
    metric: PatchMetric
    fast: bool
    start: int
    kv_plain: Optional[list]
    kv_split: Optional[list]
    delta: Tensor
    final: Tensor
    base: Tensor
    resid_pre: dict[int, Tensor]
    resid_mid: dict[int, Tensor]
    receivers: Optional[list]  # receiver_hooks(model), for the hook path
    rotate_prefix_once: bool = True  # the fast path's rotary of the prefix's keys (edge_patch)

    @classmethod
    def record(cls, model, layout, group, metric, *, reuse_prefix: bool, fast: bool,
               norm: str = "frozen", rotate_prefix_once: bool = True) -> "_ReferenceRuns":
        start = forward.shared_prefix_length(group.tokens, group.cf_tokens) if reuse_prefix else 0
        # Only the receiver's own block needs per-head q/k/v inputs (and ungrouped K/V): every other
        # block runs plain, with the prefix's grouped keys/values.
        kv_plain, kv_split = prefix_caches(model, group.tokens, start)
        recorder = SenderRecorder(model)
        resid: dict[str, dict[int, Tensor]] = {"resid_pre": {}, "resid_mid": {}}

        def keep(act, *, hook):
            resid[hook.name.split(".")[-1].removeprefix("hook_")][int(hook.name.split(".")[1])] = act

        kinds = ("resid_pre", "resid_mid") if fast else ("resid_pre",)
        names = [name for kind in kinds for name in forward.act_names(kind, range(layout.n_layers))]
        with plain_blocks(model):
            final = run_suffix(model, group.tokens, start, kv_plain, recorder.hooks() + [(n, keep) for n in names])
            delta = sender_outputs(model, group.cf_tokens, start=start, prefix_kv=kv_plain) - recorder.stacked()
        if norm == "recompute" and model.cfg.use_normalization_before_and_after:
            delta = _recomputed_head_changes(model, layout, group, start, kv_plain, delta)
        base = score_end(model, final[:, -1], group.answer_ids, group.alt_ids, metric)
        return cls(model, layout, group, metric, fast, start, kv_plain, kv_split, delta, final, base,
                   resid["resid_pre"], resid["resid_mid"], None if fast else receiver_hooks(model),
                   rotate_prefix_once=rotate_prefix_once)

    def score(self, end: Tensor, k: int) -> Tensor:
        """The metric of ``k`` stacked copies of the group (rows ``j * batch + b``), as ``[k, batch]``."""
        g = self.group
        alts = None if g.alt_ids is None else g.alt_ids.repeat(k)
        return score_end(self.model, end, g.answer_ids.repeat(k), alts, self.metric).view(k, len(g))

    def patch(self, pairs, memory_mb: float, bar, clock: _Clock) -> Tensor:
        """Patched metric ``[n_edges, batch]`` of every edge: logits edges first, then layer by layer in chunks."""
        out = torch.empty(len(pairs), len(self.group), dtype=self.base.dtype, device=self.base.device)
        plan = _plan(self.layout, pairs, self.fast)
        logit_edges = plan.pop(None, [])
        if logit_edges:  # the change lands on the final residual; only END is scored
            senders = torch.tensor([pairs[i][0] for i in logit_edges], device=self.delta.device)
            resid = (self.final[:, -1][None] + self.delta[senders, :, -1]).flatten(0, 1)
            out[logit_edges] = self.score(resid, len(logit_edges))
            bar.update(len(logit_edges))
            clock.lap("logits")
        per_chunk = self._edges_per_chunk(memory_mb)
        for (layer, mlp_only), indices in sorted(plan.items()):
            for sl in forward.chunks(len(indices), per_chunk):
                chunk = indices[sl]
                out[chunk] = self.score(self._end_residual(layer, mlp_only, [pairs[i] for i in chunk]), len(chunk))
                bar.update(len(chunk))
            clock.lap(f"layer {layer}" + ("" if not self.fast else " mlp" if mlp_only else " heads"))
        return out

    def _edges_per_chunk(self, memory_mb: float) -> int:
        cfg = self.model.cfg
        B, n_pos = self.group.tokens.shape
        split_factor = (12 + 6 * cfg.n_heads) / 12  # per-head q/k/v inputs: ~6·n_heads extra residual copies per position
        rows = forward.rows_per_chunk(self.model, memory_mb / split_factor, n_pos - self.start, cached_pos=self.start)
        return max(1, rows // B)

    def _end_residual(self, layer: int, mlp_only: bool, chunk_pairs) -> Tensor:
        """Final END residual ``[edges * batch, d_model]`` of a chunk of edges into receivers of one layer."""
        model, layout = self.model, self.layout
        change = self.delta[torch.tensor([f for f, _ in chunk_pairs], device=self.delta.device)]
        if self.fast:
            last = layer == layout.n_layers - 1
            if mlp_only:
                out = mlp_receiver_layer(model, layer, self.resid_mid[layer], change, end_only=last)
            else:
                receivers = [receiver_kind(layout, b)[1:] for _, b in chunk_pairs]
                out = head_receiver_layer(model, layer, self.resid_pre[layer], receivers, change, self.kv_split,
                                          end_only=last, rotate_prefix_once=self.rotate_prefix_once)
            return end_residual_above(model, layer, out, self.kv_plain, rotate_prefix_once=self.rotate_prefix_once)
        k, B = len(chunk_pairs), len(self.group)
        fwd_hooks = _receiver_patch_hooks(chunk_pairs, self.receivers, self.delta, k, B)
        end = model.run_with_hooks(self.resid_pre[layer].repeat(k, 1, 1), start_at_layer=layer,
                                   stop_at_layer=layer + 1, fwd_hooks=fwd_hooks, past_kv_cache=_tiled(self.kv_split, k))
        if layer + 1 < model.cfg.n_layers:
            with plain_blocks(model):
                end = model(end, start_at_layer=layer + 1, stop_at_layer=model.cfg.n_layers,
                            past_kv_cache=_tiled(self.kv_plain, k))
        return end[:, -1]


@torch.no_grad()
def _recomputed_head_changes(model, layout: GraphLayout, group, start: int, kv_plain, delta: Tensor) -> Tensor:
    """``delta`` with each head sender's change replaced by the recompute convention's: its layer re-normalised
    with that head's pre-norm result swapped, ``N(S_ref − R_ref + R_cf) − N(S_ref)``."""
    with plain_blocks(model):
        _, raw_ref = record_outputs(model, group.tokens, start=start, prefix_kv=kv_plain, raw=True)
        _, raw_cf = record_outputs(model, group.cf_tokens, start=start, prefix_kv=kv_plain, raw=True)
    delta = delta.clone()
    for layer in range(layout.n_layers):
        norm = model.blocks[layer].ln1_post
        total = raw_ref[layer].sum(0)
        swapped = total[None] - raw_ref[layer] + raw_cf[layer]  # [H, B, P, d]
        first = layout.head_forward(layer, 0)
        delta[first:first + layout.n_heads] = rms_norm(norm, swapped) - rms_norm(norm, total)[None]
    return delta


def _plan(layout: GraphLayout, pairs, fast: bool) -> dict[Optional[tuple[int, bool]], list[int]]:
    """Edge indices by chunk key: None for logits receivers, else (receiver layer, MLP receiver on the fast path).

    Chunks never mix receiver layers (the patched forward starts there) nor, on the fast path, MLP and
    head receivers (they run different block pieces).
    """
    plan: dict[Optional[tuple[int, bool]], list[int]] = {}
    for i, (f, b) in enumerate(pairs):
        if b == layout.logits_backward:
            key = None
        else:
            layer, kind, _ = receiver_kind(layout, b)
            key = (layer, fast and kind is None)
        plan.setdefault(key, []).append(i)
    return plan


def _tiled(entries, times: int):
    return None if entries is None else TiledKVCache(entries, times)


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
