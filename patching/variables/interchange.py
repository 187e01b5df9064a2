"""Interchange interventions: does a location of the model hold a variable of the task's causal model?

A **location** is a hook point at one token position: the residual stream (``resid_pre``,
``resid_mid``, ``resid_post``), an MLP's output (``mlp_out``) or one head's output (``hook_z`` and a
head). An interchange intervention runs the *base* prompt with the activation at the location
replaced by its value on the *source* prompt, in full or only in a subspace (a *featurizer*,
:mod:`patching.variables.featurizers`: ``h' = h_base + ((h_src - h_base) Q * m) Q^T``). If the location holds
variable V of a causal model (:mod:`patching.variables.causal_models`), the intervened run answers what the
causal model predicts with V taken from the source.

**Interchange intervention accuracy** (IIA) is the share of pairs whose intervened answer equals the
predicted (counterfactual) answer, with its Wilson 95% interval (:func:`circuits.stats.proportion`).
An answer is "equal" when its first token (``scoring="first"``) or every token, teacher-forced
(``"whole"``), is the top-1 prediction; the base prompt is run followed by the predicted answer's
tokens but its last, which attention, being causal, reads only after the prompt.

How a batch of pairs runs (:func:`prepare`, then one intervened forward per location):

* the positions every base and source prompt share (the few-shot lines) run once, for one row
  (:func:`circuits.prefix_cache.model_prefix_cache`);
* the base run's keys and values, its ``resid_pre`` at every intervened layer and the source run's
  activations at every location are cached once per batch, so an intervened forward starts at the
  location's layer and at its position: the positions before it read the base's own keys and values
  (attention is causal, so the intervention cannot change them);
* the same forward with gradients trains a featurizer (:func:`intervened_loss`); the model's weights
  are held fixed (:func:`patching.sweeps.forward.frozen_weights`).

A location ``through_answer`` spans its position and every answer position after it: the source prompt is
then fed the base's answer tokens too, so that a variable read out over several answer tokens (the two
digits of a sum of 10 or more, on a tokenizer that splits digits) can be swapped where it is read.

:func:`circuit_nodes` turns a :class:`circuits.graph.Graph` into its heads and MLPs, and
:func:`node_locations` each node at a position into a location, so the same interventions run on a
circuit's nodes.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer, TransformerLensKeyValueCacheEntry
from transformer_lens import utils as tl_utils

from circuits.answer_scoring import answer_is_top1
from patching.variables.causal_models import InterchangePair
from circuits.end_logits import unembed_end
from circuits.errors import InputError, InputTypeError, TaskDataError
from circuits.graph import Graph
from circuits.nodes import MLP, Head, Node, validate_nodes
from circuits.prefix_cache import MIN_SHARED_PREFIX, TiledKVCache, batch_common_prefix_length, model_prefix_cache
from circuits.stats import Estimate, proportion
from patching.sweeps import forward
from patching.sweeps.forward import frozen_weights
from patching.sweeps.inputs import check_fits_context, check_token_ids

#: A swap rule on rows of one location's activation: ``featurizer(base_rows, source_rows) -> new base rows``
#: (None wherever a swap is taken: :func:`full_swap`, the whole vector).
Swap = Callable[[Tensor, Tensor], Tensor]
_BLOCK_HOOK = re.compile(r"^blocks\.(\d+)\.")
HOOK_KINDS = ("resid_pre", "resid_mid", "resid_post", "mlp_out", "attn_out", "z")


def full_swap(base: Tensor, source: Tensor) -> Tensor:
    """The whole activation from the source (the full-vector interchange)."""
    return source


@dataclass(frozen=True)
class Location:
    """A hook point at one token position (counted from the prompt's start), and a head for ``hook_z``.

    ``through_answer``: the position *and every later one*, the teacher-forced answer positions included
    (the source run is then fed the same answer tokens as the base run, so both runs align there). A variable
    read out over several answer tokens, such as a two-token sum, is reached only by such a location.
    """

    hook: str
    position: int
    head: int | None = None
    through_answer: bool = False

    @property
    def layer(self) -> int:
        match = _BLOCK_HOOK.match(self.hook)
        if match is None:
            raise InputError(f"Location hook {self.hook!r} is not inside a block ('blocks.<layer>.…'): interchange "
                             "interventions start the intervened run at the hook's layer.")
        return int(match.group(1))

    def __str__(self) -> str:
        where = self.hook.replace("blocks.", "L").replace(".hook_", ".")
        span = "+answer" if self.through_answer else ""
        return f"{where}{'' if self.head is None else f'.H{self.head}'}@{self.position}{span}"


def location(kind: str, layer: int, position: int, head: int | None = None, *,
             through_answer: bool = False) -> Location:
    """The location of ``kind`` (one of :data:`HOOK_KINDS`) at ``layer`` and ``position``; ``head`` for ``"z"``;
    ``through_answer``: that position and the answer positions after it (:class:`Location`)."""
    if kind not in HOOK_KINDS:
        raise InputError(f"Unknown hook kind {kind!r}: use one of {', '.join(HOOK_KINDS)}.")
    return Location(tl_utils.get_act_name(kind, layer), position, head, through_answer)


def node_locations(nodes: Sequence[Node], position: int, *, through_answer: bool = False) -> list[Location]:
    """Each head (its ``hook_z`` slice) or MLP (``hook_mlp_out``) at ``position`` (and the answer positions after
    it with ``through_answer``)."""
    return [Location(n.hook_name, position, n.head if isinstance(n, Head) else None, through_answer) for n in nodes]


def circuit_nodes(graph: Graph) -> list[Node]:
    """The heads and MLPs that send at least one edge of the circuit (``graph.in_graph``), layer-major."""
    layout = graph.layout
    sends = (graph.in_graph & layout.real_edge_mask).any(1)
    nodes: list[Node] = []
    for index, name in enumerate(layout.forward_names):
        if not bool(sends[index]) or name == "input":
            continue
        if name.startswith("m"):
            nodes.append(MLP(int(name[1:])))
        else:
            layer, head = name[1:].split(".h")
            nodes.append(Head(int(layer), int(head)))
    return sorted(nodes, key=lambda n: (n.layer, isinstance(n, MLP), getattr(n, "head", 0)))


def check_location(model: HookedTransformer, where: Location, prompt_length: int) -> Location:
    """Raise :class:`InputError` unless ``where`` names a hook of ``model``, a prompt position and, for z, a head."""
    if not isinstance(where, Location):
        raise InputTypeError(f"Expected a patching.variables.interchange.Location, got {type(where).__name__}: build one with "
                             "patching.variables.interchange.location('resid_post', layer, position).")
    if where.hook not in model.hook_dict:
        near = [name for name in model.hook_dict if name.endswith(where.hook.rsplit(".", 1)[-1])][:3]
        raise InputError(f"Unknown hook {where.hook!r}: the model has no such hook point (e.g. {', '.join(near) or 'blocks.0.hook_resid_post'}); "
                         "name it with patching.variables.interchange.location(kind, layer, position).")
    where.layer  # noqa: B018  (raises for hooks outside the blocks)
    if not 0 <= where.position < prompt_length:
        raise InputError(f"Position {where.position} of {where} is out of range: the prompts have {prompt_length} tokens "
                         f"(positions 0..{prompt_length - 1}).")
    is_z = where.hook.endswith("attn.hook_z")
    if is_z and (where.head is None or not 0 <= where.head < model.cfg.n_heads):
        raise InputError(f"{where}: a hook_z location needs a head in 0..{model.cfg.n_heads - 1}, got {where.head!r}.")
    if not is_z and where.head is not None:
        raise InputError(f"{where}: only hook_z locations take a head; {where.hook!r} holds the whole layer's vector.")
    return where


def location_width(model: HookedTransformer, where: Location) -> int:
    """The size of the vector swapped at ``where``: ``d_head`` for a head's z, ``d_model`` otherwise."""
    return model.cfg.d_head if where.head is not None else model.cfg.d_model


# ---------------------------------------------------------------------------- pairs as tensors


@dataclass
class PairBatch:
    """Pairs whose prompts have one token length, as tensors on the model's device.

    ``base``: the base prompt followed by the predicted answer's tokens but the last (``"whole"``
    scoring), right-padded; ``source``: the source prompt; ``targets``: the predicted answer's tokens
    (-1 past its end); ``prompt_length``: the prompts' token count.
    """

    base: Int[Tensor, "pair pos"]
    source: Int[Tensor, "pair prompt"]
    targets: Int[Tensor, "pair answer"]
    prompt_length: int

    def __len__(self) -> int:
        return self.base.shape[0]


def pair_batches(model: HookedTransformer, dataset, pairs: Sequence[InterchangePair], *, scoring: str = "whole",
                 batch_size: int = 32) -> list[PairBatch]:
    """``pairs`` of rows of ``dataset`` (:mod:`circuits.tasks`) as :class:`PairBatch` es of at most ``batch_size``."""
    if scoring not in ("first", "whole"):
        raise InputError(f"scoring must be 'first' or 'whole', got {scoring!r}.")
    if not pairs:
        raise TaskDataError("No pairs to intervene on: build them with patching.variables.causal_models.variable_pairs.")
    tokens = dataset["tokens"]
    by_length: dict[int, list[InterchangePair]] = {}
    for pair in pairs:
        length = len(tokens[pair.base])
        if len(tokens[pair.source]) != length:
            raise InputError(f"Pair (base {pair.base}, source {pair.source}) has prompts of {length} and "
                             f"{len(tokens[pair.source])} tokens; interchange positions need prompts of one length.")
        by_length.setdefault(length, []).append(pair)
    device = model.cfg.device
    batches = []
    for length, group in sorted(by_length.items()):
        for start in range(0, len(group), batch_size):
            chunk = group[start:start + batch_size]
            answers = [list(p.answer_ids if scoring == "whole" else p.answer_ids[:1]) for p in chunk]
            width = max(map(len, answers))
            fed = [tokens[p.base] + a[:-1] + [0] * (width - len(a)) for p, a in zip(chunk, answers)]
            targets = [a + [-1] * (width - len(a)) for a in answers]
            batch = PairBatch(torch.tensor(fed, device=device), torch.tensor([tokens[p.source] for p in chunk], device=device),
                              torch.tensor(targets, device=device), length)
            check_token_ids(model, batch.base, "base tokens")
            check_fits_context(model, batch.base.shape[1])
            batches.append(batch)
    return batches


# ---------------------------------------------------------------------------- the engine


@dataclass
class Prepared:
    """One batch's cached runs for a set of locations: the base run's keys/values, its ``resid_pre`` per layer from
    ``prefix`` (the earliest location's position) on, and the source's rows at each location."""

    batch: PairBatch
    prefix: int
    base_kv: list  # per layer, the base run's keys/values at every position [pair, pos, head, d_head]
    starts: dict[int, Float[Tensor, "pair suffix d_model"]]
    sources: dict[Location, Float[Tensor, "pair width"]]


@torch.no_grad()
def prepare(model: HookedTransformer, batch: PairBatch, locations: Sequence[Location]) -> Prepared:
    """Run the batch's base and source prompts once and keep what the interventions at ``locations`` start from.

    The positions every base and source prompt share (the few-shot lines) run once for one row; each base prompt
    then runs once with its keys and values kept, so that an intervened run at position p computes positions p on
    only, reading the base's own keys and values before p (attention is causal: they are what the base run has there).
    """
    if not locations:
        raise InputError("No locations to intervene at: pass at least one patching.variables.interchange.Location.")
    for where in locations:
        check_location(model, where, batch.prompt_length)
    first = min(w.position for w in locations)
    prompts = torch.cat([batch.base[:, :batch.prompt_length], batch.source])
    shared = batch_common_prefix_length(prompts, limit=first)
    shared_kv = model_prefix_cache(model)(prompts[:1, :shared]) if shared >= MIN_SHARED_PREFIX else None
    layers = sorted({w.layer for w in locations})
    base_acts, base_kv = forward.prefix_run(model, batch.base, forward.act_names("resid_pre", layers), shared_kv)
    source = batch.source
    if any(w.through_answer for w in locations):  # the source fed the base's answer tokens, so positions align
        source = torch.cat([batch.source, batch.base[:, batch.prompt_length:]], 1)
    source_acts, _ = forward.prefix_run(model, source, sorted({w.hook for w in locations}), shared_kv)
    known = 0 if shared_kv is None else shared
    sources = {}
    for where in locations:
        offset = where.position - known
        rows = source_acts[where.hook][:, offset:] if where.through_answer else source_acts[where.hook][:, offset]
        sources[where] = rows if where.head is None else rows[..., where.head, :]
    starts = {layer: base_acts[tl_utils.get_act_name("resid_pre", layer)][:, first - known:] for layer in layers}
    return Prepared(batch, first, base_kv, starts, sources)


def intervened_answer_residuals(model: HookedTransformer, prepared: Prepared, where: Location | Sequence[Location],
                                swap: Swap | None = None) -> tuple[Tensor, Tensor]:
    """The final residual at every scored answer position of the intervened base runs, and the targets there.

    ``where``: one location, or several of one hook (one layer), stacked along the batch in one forward (site
    ``j`` takes rows ``j * pairs .. (j + 1) * pairs - 1``, as in :mod:`patching.node_level.activation_patching`). Returns
    ``(resid [cells, d_model], targets [cells])`` over the (site, pair, answer token) cells with a target, in that
    order. Gradients flow into ``swap``'s parameters when enabled.
    """
    swap = swap or full_swap
    sites = [where] if isinstance(where, Location) else list(where)
    if len({w.hook for w in sites}) != 1:
        raise InputError(f"Stacked sites must share one hook, got {sorted({w.hook for w in sites})}.")
    batch, n_sites = prepared.batch, len(sites)
    start = min(site.position for site in sites)  # positions before it run as the base does: cached
    if start < prepared.prefix:
        raise InputError(f"Position {start} is before the earliest one this batch was prepared for "
                         f"({prepared.prefix}): pass every location to patching.variables.interchange.prepare.")

    def intervene(act, *, hook):
        act = act.clone().view(n_sites, len(batch), *act.shape[1:])
        for j, site in enumerate(sites):
            offset = site.position - start
            at = slice(offset, None) if site.through_answer else offset
            rows = act[j, :, at] if site.head is None else act[j, :, at, site.head]
            new = swap(rows, prepared.sources[site].to(act.dtype)).to(act.dtype)
            if site.head is None:
                act[j, :, at] = new
            else:
                act[j, :, at, site.head] = new
        return act.flatten(0, 1)

    kv = None
    if start:
        kv = TiledKVCache([TransformerLensKeyValueCacheEntry(e.past_keys[:, :start], e.past_values[:, :start])
                           for e in prepared.base_kv], n_sites)
    layer = sites[0].layer
    resid_start = prepared.starts[layer][:, start - prepared.prefix:]
    resid = model.run_with_hooks(resid_start.repeat(n_sites, 1, 1) if n_sites > 1 else resid_start, start_at_layer=layer,
                                 stop_at_layer=model.cfg.n_layers, fwd_hooks=[(sites[0].hook, intervene)], past_kv_cache=kv)
    scored = batch.targets >= 0
    pair_index, answer_index = scored.nonzero(as_tuple=True)
    site_rows = (torch.arange(n_sites, device=pair_index.device)[:, None] * len(batch) + pair_index).flatten()
    positions = (batch.prompt_length - 1 - start + answer_index).repeat(n_sites)
    return resid[site_rows, positions], batch.targets[scored].repeat(n_sites)


@torch.no_grad()
def intervened_hits(model: HookedTransformer, prepared: Prepared, where: Location | Sequence[Location],
                    swap: Swap | None = None) -> Bool[Tensor, "site pair"]:
    """Per site (one row for a single location) and pair: is every scored answer token top-1 in the intervened run?"""
    n_sites = 1 if isinstance(where, Location) else len(where)
    resid, targets = intervened_answer_residuals(model, prepared, where, swap)
    # the batch's answers are the likely winners: a row one of them outscores is a miss without the full vocabulary
    token_hits = answer_is_top1(model, resid, targets, rivals=prepared.batch.targets[prepared.batch.targets >= 0])
    scored = prepared.batch.targets >= 0
    per_cell = torch.ones(n_sites, *scored.shape, dtype=torch.bool, device=scored.device)
    per_cell[:, scored] = token_hits.to(per_cell.device).view(n_sites, -1)
    return per_cell.all(2).cpu()


def intervened_loss(model: HookedTransformer, prepared: Prepared, where: Location, swap: Swap) -> Tensor:
    """Mean cross-entropy of the predicted answer's tokens in the intervened runs (what DAS minimises)."""
    resid, targets = intervened_answer_residuals(model, prepared, where, swap)
    logits = unembed_end(model, resid)
    return F.cross_entropy(logits.float(), targets)


def interchange_accuracy(model: HookedTransformer, batches: Sequence[PairBatch], where: Location,
                         swap: Swap | None = None) -> tuple[Estimate, Tensor]:
    """IIA of the intervention at ``where`` over ``batches`` with its Wilson interval, and the per-pair hits."""
    with forward.transposed_weight_storage(model):  # few-token forwards: no per-call weight copies
        hits = torch.cat([intervened_hits(model, prepare(model, batch, [where]), where, swap)[0] for batch in batches])
    return proportion(hits), hits


def iia_by_answer_length(model: HookedTransformer, batches: Sequence[PairBatch], where: Location,
                         swap: Swap | None = None, *, hits: Tensor | None = None) -> dict[int, Estimate]:
    """IIA at ``where`` per token count of the predicted answer: ``{1: Estimate, 2: Estimate, ...}``.

    With ``"whole"`` scoring, a two-token answer's second token is predicted at the first answer token's
    position, after the intervened one: an intervention at the prompt's last position alone can change it
    only through what later positions read there by attention. Splitting IIA by the answer's length shows
    whether a location holds a variable for the answers that are read out where it intervenes.

    ``hits``: the per-pair hits of this intervention on ``batches`` when already computed (the second value of
    :func:`interchange_accuracy`, or a fitted featurizer's ``test_hits``), to split them without running again.
    """
    n_pairs = sum(len(batch) for batch in batches)
    if hits is None:
        _, hits = interchange_accuracy(model, batches, where, swap)
    elif hits.shape != (n_pairs,):
        raise InputError(f"hits has shape {tuple(hits.shape)}; these batches hold {n_pairs} pairs: pass the hits "
                         f"computed on the same batches, in order.")
    lengths = torch.cat([(batch.targets >= 0).sum(1).cpu() for batch in batches])  # in the hits' order
    return {int(n): proportion(hits[lengths == n]) for n in lengths.unique().tolist()}


def iia_sweep(model: HookedTransformer, batches: Sequence[PairBatch], locations: Sequence[Location],
              swap: Swap | None = None, *, memory_mb: float = 1024, prune: bool = False, progress: bool = False,
              desc: str = "interchange") -> dict[Location, Estimate]:
    """IIA at every location in ``locations``.

    Each batch's base and source runs are cached once for all locations, and the locations of one hook and
    position run stacked in forwards of about ``memory_mb`` of activations
    (:func:`patching.sweeps.forward.rows_per_chunk`), each from that position on.

    ``prune``: after each batch, a location whose interval lies wholly below the best one's lower bound is not
    run on the later batches (its estimate is over the pairs it ran, with their n): it cannot be within the best
    one's interval, where :func:`rank_locations` chooses, unless a 95 % interval missed. Most of a residual-stream
    sweep is far from its best, so a sweep of many locations costs little more than its first batch.
    """
    hits: dict[Location, list[Tensor]] = {w: [] for w in locations}
    active = list(hits)
    bar = tqdm(total=len(batches) * len(hits), desc=desc, disable=not progress, leave=False)
    with forward.transposed_weight_storage(model):  # few-token forwards: no per-call weight copies
        for index, batch in enumerate(batches):
            prepared = prepare(model, batch, active)
            groups: dict[tuple[str, int], list[Location]] = {}  # one hook and position a forward: it starts there
            for where in active:
                groups.setdefault((where.hook, where.position), []).append(where)
            for (_, position), group in groups.items():
                n_pos = batch.base.shape[1] - position
                per_forward = max(1, forward.rows_per_chunk(model, memory_mb, n_pos, cached_pos=position) // len(batch))
                for sl in forward.chunks(len(group), per_forward):
                    sites = group[sl]
                    for site, row in zip(sites, intervened_hits(model, prepared, sites, swap)):
                        hits[site].append(row)
            bar.update(len(hits))
            if prune and index + 1 < len(batches):
                active = within_best_interval({w: proportion(torch.cat(hits[w])) for w in active})
    bar.close()
    return {w: proportion(torch.cat(hits[w])) for w in locations}


def rank_locations(estimates: Mapping[Location, Estimate]) -> list[tuple[float, Location]]:
    """``(IIA, location)`` pairs, the choice first: of the locations whose interval reaches the best one's (whose
    upper bound is at least the best's lower bound), the earliest (layer, then position, the single position
    before the answer span); then the rest, best first.

    Picking the highest of many noisy estimates is biased toward noise (the winner's curse): on 16 validation pairs
    a later layer can beat the layer that carries a variable by chance. Within the best's interval the data cannot
    tell the locations apart, and the earliest is where the variable is first computed.
    """
    tied = within_best_interval(estimates)
    rest = sorted((w for w in estimates if w not in set(tied)),
                  key=lambda w: (estimates[w].value, -w.layer, -w.position), reverse=True)
    return [(estimates[w].value, w) for w in tied + rest]


def within_best_interval(estimates: Mapping[Location, Estimate]) -> list[Location]:
    """The locations whose IIA interval reaches the best estimate's lower bound, earliest first (layer, position,
    the single position before the answer span): those the data cannot tell from the best."""
    if not estimates:
        raise InputError("No locations to rank: pass the IIA of at least one location.")
    top = max(estimates.values(), key=lambda e: e.value)
    return sorted((w for w, e in estimates.items() if e.high >= top.low),
                  key=lambda w: (w.layer, w.position, w.through_answer))


@torch.no_grad()
def source_activations(model: HookedTransformer, batches: Sequence[PairBatch], where: Location) -> Float[Tensor, "n width"]:
    """The activation at ``where`` on every base and source prompt of ``batches`` (e.g. to fit PCA directions); for a
    location ``through_answer``, at its first position (the prompt's)."""
    rows = []
    for batch in batches:
        check_location(model, where, batch.prompt_length)
        for tokens in (batch.base[:, :batch.prompt_length], batch.source):
            acts, _ = forward.full_cache(model, tokens, [where.hook])
            act = acts[where.hook][:, where.position]
            rows.append(act if where.head is None else act[:, where.head])
    return torch.cat(rows)


def node_table(model: HookedTransformer, batches_by_variable: Mapping[str, Sequence[PairBatch]], nodes: Sequence[Node],
               positions: Mapping[str, int], best: Mapping[str, float], *, through_answer: bool = False,
               prune: bool = False, progress: bool = False) -> list[dict]:
    """Which circuit nodes carry which variable: full-vector IIA of every node at every named position.

    ``positions``: ``{label: position}`` (each with the answer positions after it, ``through_answer``); ``best``: per
    variable, the best IIA reached anywhere (e.g. over the residual stream), so each row says what share of it the
    node reaches. One row per (variable, node, position). ``prune``: as in :func:`iia_sweep` (a node far below
    the best node stops after a batch; its row's ``iia`` then has the smaller n).
    """
    nodes = validate_nodes(model, nodes)
    if not nodes:
        raise InputError("The circuit has no heads or MLPs to intervene on: pass a non-empty node list or a Graph "
                         "with edges in the circuit.")
    rows = []
    for variable, batches in batches_by_variable.items():
        locations = {(str(n), label): node_locations([n], pos, through_answer=through_answer)[0]
                     for n in nodes for label, pos in positions.items()}
        estimates = iia_sweep(model, batches, list(locations.values()), prune=prune, progress=progress,
                              desc=f"circuit nodes: {variable}")
        for (node, label), where in locations.items():
            est = estimates[where]
            reference = best.get(variable, float("nan"))
            rows.append({"variable": variable, "node": node, "position": label, "iia": est.to_dict(),
                         "share_of_best": est.value / reference if reference and reference > 0 else float("nan")})
    return rows
