"""Mean-ablation knockout (Wang et al. 2023; Zhang et al. 2024 §4.1, Figures 3 and 4).

To knock a node out, replace its output (a head's ``hook_z`` slice, an MLP's
``hook_mlp_out``) with its *mean over counterfactual data* at the same position:
the task information is removed, the "typical" activation is kept. Means are
position-wise, so they are taken per prompt layout: per template and token length
(rows of one template and length have their operands, operator and END at the
same positions).

**Means come from a pool disjoint from the evaluated prompts.** Averaging over the
evaluated prompts themselves leaks each prompt's own information back into its
"ablated" activation (a layout with one prompt would be replaced by its own twin),
which shrinks every knockout effect. By default the means are taken over
:data:`DEFAULT_POOL` prompts of the evaluated layouts generated separately by
:func:`circuits.pools.pool_dataset` (same few-shot prefix, none of the evaluated
problems); a layout with fewer than ``min_pool`` pool prompts is refused.

**Fast path.** Positions before the first one where the evaluated prompts and the
pool's prompts differ (the few-shot prefix) hold the same activation in every one
of them, so their mean *is* the clean activation: knocking a node out changes
nothing there. :func:`knockout_correct` computes that prefix's keys/values once
per layout, runs only the later positions, many knockout sets per batched forward
(sets stacked along the batch), runs suffix starts shared by several prompts once,
and decides top-1 at END by a certified bfloat16 screen of the vocabulary instead of the
full float32 unembedding where the CPU multiplies bfloat16 natively (:mod:`patching.node_level.knockout_fast`,
:func:`circuits.end_logits.end_argmax`). ``method="hooks"`` runs the plain
implementation (one full forward per set and batch) for comparison.

:func:`knockout_curve` validates a ranking: knock out the top-k heads by
path-patching effect ("effect-rank") for growing k, against k random heads over
several seeds ("random-rank"). :func:`knockout_transfer` knocks the key heads out
on other data formats (:func:`circuits.tasks.transfer_datasets`).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch
from datasets import Dataset
from jaxtyping import Bool
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from circuits.arguments import check_positive_int
from circuits.errors import InputError, ToolkitError
from circuits.answer_scoring import top1_correct
from circuits.nodes import Head, Node, all_heads, validate_nodes
from circuits.stats import bootstrap_two_way, paired_difference, proportion
from circuits.pools import pool_dataset
from circuits.seeds import derived_seed
from circuits.tasks import TaskBatch, iter_batches
from circuits.prefix_cache import TiledKVCache, model_prefix_cache
from patching.sweeps import forward
from patching.node_level import knockout_fast as _fast
from patching.sweeps.inputs import check_finite_weights, check_fits_context
from patching.sweeps.options import SweepOptions, sweep_options
from patching.sweeps.results import KnockoutCurve, NodeScores

DEFAULT_POOL = 512  # pool prompts the means are averaged over (shared among the evaluated layouts)
MIN_POOL_PER_LAYOUT = 8  # fewer pool prompts than this in a layout: its "mean" is too close to single prompts
METHODS = ("prefix", "hooks")
KNOCKOUT_OPTIONS = ("batch_size", "memory_mb", "progress")  # the SweepOptions knockout uses: it scores top-1 itself

Layout = tuple[str, int]


class PoolError(ToolkitError, ValueError):
    """The ablation means do not cover the evaluated prompts properly (missing, too few, or overlapping)."""


@dataclass
class LayoutMeans:
    """Position-wise mean activations per (template, token length) layout, and what they were averaged over.

    ``means[layout][hook_name]`` is shaped like one row of the activation (``[pos, head, d_head]``
    or ``[pos, d_model]``); ``counts[layout]`` is the number of pool prompts; ``shared[layout]``
    the token prefix common to all of them; ``prompts`` the pool's reference prompts (to refuse
    evaluating on them).
    """

    means: dict[Layout, dict[str, Tensor]]
    counts: dict[Layout, int]
    shared: dict[Layout, Tensor]
    prompts: frozenset = frozenset()
    source: str = "counterfactual"

    def __getitem__(self, layout: Layout) -> dict[str, Tensor]:
        return self.means[layout]

    def __contains__(self, layout: Layout) -> bool:
        return layout in self.means

    @property
    def n_prompts(self) -> int:
        return sum(self.counts.values())


def _templates(dataset: Dataset) -> list[str]:
    return dataset["template_id"] if "template_id" in dataset.column_names else [""] * len(dataset)


def _layouts(dataset: Dataset) -> dict[Layout, list[int]]:
    """Row indices per (template, token length)."""
    groups: dict[Layout, list[int]] = {}
    for i, (template, end) in enumerate(zip(_templates(dataset), dataset["end_pos"])):
        groups.setdefault((template, end + 1), []).append(i)
    return groups


def _common_prefix(tokens: Tensor) -> int:
    """Leading positions where every row has the same token (END excluded)."""
    differs = (tokens != tokens[:1]).any(0)
    first = int(differs.nonzero()[0]) if differs.any() else tokens.shape[1]
    return min(first, tokens.shape[1] - 1)


def check_model_and_prompts(model: HookedTransformer, dataset: Dataset) -> None:
    """Refuse NaN/Inf weights (every knockout would read 0 % correct) and prompts beyond the model's context."""
    check_finite_weights(model)
    check_fits_context(model, max((len(t) for column in ("tokens", "cf_tokens") if column in dataset.column_names
                                   for t in dataset[column]), default=0))


@torch.no_grad()
def mean_activations(
    model: HookedTransformer,
    dataset: Dataset,
    nodes: Sequence[Node],
    *,
    source: str = "counterfactual",
    batch_size: int = 32,
) -> LayoutMeans:
    """Position-wise mean of each node's hook activation over ``dataset``, per (template, token length) layout.

    ``source="counterfactual"`` averages over the counterfactual twins (the paper's choice);
    ``"reference"`` over the reference prompts. The positions every row of a layout shares are
    run once (one prompt), the rest per row. Pass a pool disjoint from the evaluated prompts
    (:func:`pool_means` builds one).
    """
    check_model_and_prompts(model, dataset)
    if source not in ("counterfactual", "reference"):
        raise InputError(f"source must be 'counterfactual' or 'reference', got {source!r}.")
    nodes = validate_nodes(model, nodes)
    names = sorted({n.hook_name for n in nodes})
    column = "cf_tokens" if source == "counterfactual" else "tokens"
    out = LayoutMeans({}, {}, {}, frozenset(dataset["prompt"]), source)
    if not names:
        return out
    device = model.cfg.device
    layouts = _layouts(dataset)
    all_tokens = dataset[column]
    by_template: dict[str, list[Layout]] = {}
    for layout in layouts:
        by_template.setdefault(layout[0], []).append(layout)
    for template, group in by_template.items():
        # the positions every row of the template shares (its few-shot prefix) run once for all its layouts
        rows_of = [i for layout in group for i in layouts[layout]]
        shortest = min(len(all_tokens[i]) for i in rows_of)
        stacked = torch.tensor([all_tokens[i][:shortest] for i in rows_of], device=device)
        prefix = _common_prefix(stacked)
        head, prefix_kv = forward.prefix_run(model, stacked[:1, :prefix], names) if prefix else ({}, None)
        for layout in group:
            rows = layouts[layout]
            tokens = torch.tensor([all_tokens[i] for i in rows], device=device)
            sums = {n: 0.0 for n in names}
            for sl in forward.chunks(len(rows), batch_size):
                acts, _ = _suffix_run(model, model(tokens[sl], stop_at_layer=0)[:, prefix:], prefix_kv, names)
                for n in names:
                    sums[n] = sums[n] + acts[n].double().sum(0)
            means = {}
            for n in names:
                tail = sums[n] / len(rows)
                full = tail if not prefix else torch.cat([head[n][0].double(), tail], 0)
                means[n] = full.to(model.cfg.dtype)
            out.means[layout], out.counts[layout] = means, len(rows)
            out.shared[layout] = tokens[0, :_common_prefix(tokens)].cpu()
    return out


def pool_means(
    model: HookedTransformer,
    dataset: Dataset,
    nodes: Sequence[Node],
    *,
    n_pool: int = DEFAULT_POOL,
    seed: int = 0,
    batch_size: int = 32,
) -> LayoutMeans:
    """:func:`mean_activations` over a fresh pool of ``n_pool`` prompts in ``dataset``'s layouts, none of them evaluated."""
    pool = pool_dataset(model, dataset, n_pool, seed=seed)
    return mean_activations(model, pool, nodes, batch_size=batch_size)


def check_means(dataset: Dataset, means: LayoutMeans, min_pool: int = MIN_POOL_PER_LAYOUT) -> None:
    """Refuse means that miss a layout of ``dataset``, average over fewer than ``min_pool`` prompts, or include evaluated prompts."""
    layouts = _layouts(dataset)
    missing = sorted(k for k in layouts if k not in means)
    if missing:
        raise PoolError(f"No mean activations for layouts {missing} (template, n_pos); compute the means on "
                        f"data with the same templates and lengths.")
    thin = {k: means.counts.get(k, 0) for k in layouts if means.counts.get(k, 0) < min_pool}
    if thin:
        raise PoolError(f"Layouts {thin} (template, n_pos): pool prompts) have fewer than min_pool={min_pool} pool "
                        f"prompts: a mean over so few prompts still carries their information. Use a larger pool "
                        f"(n_pool), drop those prompts, or lower min_pool knowingly.")
    shared = means.prompts & set(dataset["prompt"])
    if shared:
        raise PoolError(f"{len(shared)} evaluated prompts are also in the means' pool (e.g. {sorted(shared)[0]!r}): "
                        f"their own activations would leak into the ablation. Build the pool with pool_means().")


def covered_rows(dataset: Dataset, means: LayoutMeans, min_pool: int = MIN_POOL_PER_LAYOUT) -> list[int]:
    """Rows of ``dataset`` whose layout has at least ``min_pool`` pool prompts in ``means``."""
    return [i for k, rows in _layouts(dataset).items() if means.counts.get(k, 0) >= min_pool for i in rows]


def knockout_hooks(model: HookedTransformer, batch: TaskBatch, templates: Sequence[str], nodes: Sequence[Node], means: LayoutMeans):
    """Forward hooks that replace each node's output with its layout's mean, row by row (the plain implementation)."""
    n_pos = batch.tokens.shape[1]
    keys = [(templates[i], n_pos) for i in batch.indices]
    missing = sorted({k for k in keys if k not in means})
    if missing:
        raise PoolError(f"No mean activations for layouts {missing} (template, n_pos); compute the means on "
                        f"data with the same templates and lengths.")
    by_name: dict[str, list] = {}
    for node in nodes:
        by_name.setdefault(node.hook_name, []).append(node)
    hooks = []
    for name, group in by_name.items():
        stacked = torch.stack([means[k][name] for k in keys]).to(batch.tokens.device)
        heads = [n.head for n in group if isinstance(n, Head)]

        def ablate(act, *, hook, stacked=stacked, heads=heads):
            if not heads:  # an MLP: its whole output
                return stacked.to(act.dtype)
            act = act.clone()
            act[:, :, heads] = stacked[:, :, heads].to(act.dtype)
            return act

        hooks.append((name, ablate))
    return hooks


def _selections(model, sets: Sequence[Sequence[Node]]) -> dict[str, Bool[Tensor, "set ..."]]:
    """Per hook name, which sets ablate it: ``[n_sets, n_heads]`` for ``hook_z``, ``[n_sets]`` for an MLP."""
    sel: dict[str, Tensor] = {}
    for s, nodes in enumerate(sets):
        for node in nodes:
            if isinstance(node, Head):
                sel.setdefault(node.hook_name, torch.zeros(len(sets), model.cfg.n_heads, dtype=torch.bool))[s, node.head] = True
            else:
                sel.setdefault(node.hook_name, torch.zeros(len(sets), dtype=torch.bool))[s] = True
    return sel


@torch.no_grad()
def knockout_correct(
    model: HookedTransformer,
    dataset: Dataset,
    sets: Sequence[Sequence[Node]],
    *,
    means: Optional[LayoutMeans] = None,
    n_pool: int = DEFAULT_POOL,
    min_pool: int = MIN_POOL_PER_LAYOUT,
    seed: int = 0,
    method: str = "prefix",
    screen_argmax: Optional[bool] = None,
    share_starts: bool = True,
    stats: Optional[dict] = None,
    options: Optional[SweepOptions] = None,
) -> Bool[Tensor, "set prompt"]:
    """Per knockout set and prompt: is the first answer token top-1 with the set's nodes mean-ablated?

    An empty set scores the unablated model. ``means`` defaults to :func:`pool_means` over every
    node of the sets (``n_pool`` prompts, ``seed``); it is checked by :func:`check_means`.
    ``method="prefix"`` is the fast path (module docstring; ``screen_argmax`` and ``share_starts``
    switch its savings 3 and 2 of :mod:`patching.node_level.knockout_fast`), ``"hooks"`` the plain
    implementation (full forwards, float32 unembedding). ``stats``, a dict, receives how many
    ablated rows the fast path scored and how many of them needed the full float32 unembedding.
    ``options`` (:class:`patching.SweepOptions`): ``batch_size`` (default 32 prompts), ``memory_mb`` (the fast
    path's budget for stacked sets, default 1024) and ``progress`` (default none) apply.
    """
    opts = sweep_options(options, "knockout_correct", KNOCKOUT_OPTIONS)
    batch_size, memory_mb, progress = opts.batch(32), opts.budget(), opts.shows_progress(False)
    if method not in METHODS:
        raise InputError(f"Unknown knockout method {method!r}: use one of {METHODS}.")
    check_positive_int(batch_size, "batch_size")
    if len(dataset) == 0:
        raise InputError("knockout got an empty dataset: pass at least one prompt.")
    check_model_and_prompts(model, dataset)
    sets = [validate_nodes(model, nodes) for nodes in sets]
    union = sorted({n for nodes in sets for n in nodes}, key=str)
    if means is None:
        means = pool_means(model, dataset, union, n_pool=n_pool, seed=seed, batch_size=batch_size) if union \
            else LayoutMeans({}, {}, {})
    if union:
        check_means(dataset, means, min_pool)
    correct = torch.zeros(len(sets), len(dataset), dtype=torch.bool)
    if method == "hooks":
        templates = _templates(dataset)
        for s, nodes in enumerate(tqdm(sets, desc="knockout (hooks)", disable=not progress, leave=False)):
            for batch in iter_batches(dataset, batch_size, device=model.cfg.device):
                hooks = knockout_hooks(model, batch, templates, nodes, means) if nodes else []
                correct[s, batch.indices] = top1_correct(model, batch.tokens, batch.answer_ids, fwd_hooks=hooks,
                                                         screen=False).cpu()
        return correct
    selections = _selections(model, sets)
    layouts = _layouts(dataset)
    fast = {"screen": screen_argmax, "split": share_starts, "stats": stats if stats is not None else {},
            "prefixes": model_prefix_cache(model)}  # layouts of one template share their few-shot prefix
    bar = tqdm(total=len(layouts), desc="knockout", disable=not progress, leave=False)
    for layout, rows in layouts.items():
        # sets are stacked along the batch within memory_mb, and more rows per chunk widen the shared
        # starts (one run per distinct start serves more rows): up to 4 x batch_size rows at once
        for sl in forward.chunks(len(rows), 4 * batch_size):
            chunk_rows = rows[sl]
            correct[:, chunk_rows] = _layout_correct(model, dataset.select(chunk_rows), layout, selections, len(sets),
                                                     means, memory_mb, fast)
        bar.update(1)
    bar.close()
    return correct


def _first_layers(sets_sel: dict[str, Tensor], n_sets: int, n_layers: int) -> list[int]:
    """Per set: the first layer whose output it ablates (``n_layers`` for an empty set)."""
    first = [n_layers] * n_sets
    for name, sel in sets_sel.items():
        layer = int(name.split(".")[1])
        for s in sel.flatten(1).any(1).nonzero()[:, 0].tolist() if sel.ndim == 2 else sel.nonzero()[:, 0].tolist():
            first[s] = min(first[s], layer)
    return first


def _layout_correct(model, data: Dataset, layout, selections, n_sets, means, memory_mb, fast: dict) -> Tensor:
    """Top-1 hits [n_sets, rows] of one layout's rows: shared prefix once, many sets per forward (:mod:`patching.node_level.knockout_fast`).

    Layers below a set's first ablated layer compute what the clean run computes, so each set starts
    from the clean residual stream there (cached once); sets are batched by their starting layer.
    """
    device, L = model.cfg.device, model.cfg.n_layers
    tokens = torch.tensor(data["tokens"], device=device)
    answers = torch.tensor([ids[0] for ids in data["answer_token_ids"]], device=device)
    B, n_pos = tokens.shape
    prefix = _common_prefix(tokens)
    if selections:  # ablated positions must see the clean prefix: stop where the pool's tokens differ
        shared = means.shared[layout].to(device)
        agree = (tokens[:, : shared.shape[0]] == shared[None, : n_pos]).all(0)
        prefix = min(prefix, int((~agree).nonzero()[0]) if (~agree).any() else shared.shape[0])
    prefix_kv = fast["prefixes"](tokens[:1, :prefix]) if prefix else None
    x = model(tokens, stop_at_layer=0)[:, prefix:]
    starts = _first_layers(selections, n_sets, L)
    clean, clean_final = _suffix_run(model, x, prefix_kv, forward.act_names("resid_pre", sorted(set(starts) - {L})))
    anchor = _fast.Top1Anchor(model, clean_final, answers, screen=fast["screen"])
    split = _fast.choose_split(tokens[:, prefix:]) if fast["split"] else None
    out = torch.zeros(n_sets, B, dtype=torch.bool)
    out[[s for s in range(n_sets) if starts[s] == L]] = anchor.clean_hits.cpu()
    mean = {name: means[layout][name][prefix:].to(device) for name in selections}
    per_chunk = max(1, forward.rows_per_chunk(model, memory_mb, n_pos - prefix, cached_pos=prefix) // B)
    for layer, members in _start_bins(starts, L, B, per_chunk).items():
        group = torch.tensor(members)
        resid = clean[forward.act_names("resid_pre", [layer])[0]]
        for sl in forward.chunks(len(group), per_chunk):
            ids = group[sl]
            hooks_at = lambda positions, ids=ids: _fast.ablation_hooks(selections, ids, mean, positions, device)
            end = _fast.ablated_end(model, resid, layer, prefix_kv, hooks_at, len(ids), split)
            out[ids] = anchor.hits(end).view(len(ids), B).cpu()
    for key, value in anchor.stats.items():
        fast["stats"][key] = fast["stats"].get(key, 0) + value
    return out


#: the fixed cost of one batched forward through one layer, in rows of the same forward: a gemma-3-270m
#: layer on the CPU costs about 6.5 ms + 0.41 ms per row of 6 positions (12, 48 and 225 rows timed)
FORWARD_OVERHEAD_ROWS = 16


def _start_bins(starts: list[int], n_layers: int, rows: int, max_sets: int) -> dict[int, list[int]]:
    """Sets grouped into forwards: each group starts at its earliest set's first ablated layer.

    A set that starts later than its group runs the layers in between unablated, which is what the
    clean run computes there, so the hits are the same; grouping trades those extra layers for fewer,
    larger forwards. Consecutive start layers are merged where the estimated cost
    ``layers x (FORWARD_OVERHEAD_ROWS + rows in the forward)`` falls (exact dynamic programming over
    the sorted start layers; a group holds at most ``max_sets`` sets, the memory budget's chunk).
    """
    layers = sorted(set(starts) - {n_layers})
    counts = [sum(1 for s in starts if s == layer) for layer in layers]
    best = [0.0] + [float("inf")] * len(layers)  # best[j]: cost of the first j start layers
    cut = [0] * (len(layers) + 1)
    for j in range(1, len(layers) + 1):
        n_sets = 0
        for i in range(j, 0, -1):  # group = start layers i-1 .. j-1, run from layers[i-1]
            n_sets += counts[i - 1]
            forwards = -(-n_sets // max_sets)
            cost = best[i - 1] + (n_layers - layers[i - 1]) * (forwards * FORWARD_OVERHEAD_ROWS + n_sets * rows)
            if cost < best[j]:
                best[j], cut[j] = cost, i - 1
    bins: dict[int, list[int]] = {}
    j = len(layers)
    while j > 0:
        i = cut[j]
        chosen = set(layers[i:j])
        bins[layers[i]] = [s for s, first in enumerate(starts) if first in chosen]
        j = i
    return dict(sorted(bins.items()))


def _suffix_run(model, x, prefix_kv, names) -> tuple[dict[str, Tensor], Tensor]:
    """The clean run of the suffix embeddings ``x``: the named activations and the final END residual."""
    store: dict[str, Tensor] = {}

    def keep(act, *, hook):
        store[hook.name] = act.clone()

    kv = None if prefix_kv is None else TiledKVCache(prefix_kv, x.shape[0])
    resid = model.run_with_hooks(x, start_at_layer=0, stop_at_layer=model.cfg.n_layers, fwd_hooks=[(n, keep) for n in names],
                                 past_kv_cache=kv)
    return store, resid[:, -1]


def knockout(
    model: HookedTransformer,
    dataset: Dataset,
    nodes: Sequence[Node],
    *,
    means: Optional[LayoutMeans] = None,
    n_pool: int = DEFAULT_POOL,
    min_pool: int = MIN_POOL_PER_LAYOUT,
    seed: int = 0,
    method: str = "prefix",
    options: Optional[SweepOptions] = None,
) -> float:
    """Top-1 accuracy (first answer token) with ``nodes`` mean-ablated; no nodes gives the plain accuracy.

    ``means`` defaults to a fresh pool (:func:`pool_means`); see :func:`knockout_correct` (also for ``options``).
    """
    opts = sweep_options(options, "knockout", KNOCKOUT_OPTIONS)
    hits = knockout_correct(model, dataset, [nodes], means=means, n_pool=n_pool, min_pool=min_pool, seed=seed,
                            method=method, options=opts)
    return float(hits.float().mean())


def _ranking(model, ranking: Union[NodeScores, Sequence[Head]], by: str) -> list[Head]:
    if isinstance(ranking, NodeScores):
        return [n for n, _ in ranking.ranked("heads", by=by)]
    return validate_nodes(model, ranking)


def resolve_ks(ks: Sequence[Union[int, float]], n_heads: int, n_ranked: int) -> list[int]:
    """Numbers of heads: an int is a count, a float in (0, 1) a fraction of all ``n_heads`` (at least 1)."""
    counts = []
    for k in ks:
        if isinstance(k, float) and 0 < k < 1:
            counts.append(max(1, round(k * n_heads)))
        elif float(k) == int(k):
            counts.append(int(k))
        else:
            raise InputError(f"k={k!r} is neither a head count nor a fraction of heads in (0, 1).")
    counts = sorted(set(counts))
    if not counts or counts[0] < 1 or counts[-1] > n_ranked:
        raise InputError(f"ks must lie in 1..{n_ranked} (the number of ranked heads), got {counts}.")
    return counts


def knockout_curve(
    model: HookedTransformer,
    dataset: Dataset,
    ranking: Union[NodeScores, Sequence[Head]],
    *,
    ks: Sequence[Union[int, float]] = (1, 2, 4, 8),
    n_seeds: int = 10,
    seed: int = 0,
    by: str = "neg",
    means: Optional[LayoutMeans] = None,
    n_pool: int = DEFAULT_POOL,
    min_pool: int = MIN_POOL_PER_LAYOUT,
    method: str = "prefix",
    options: Optional[SweepOptions] = None,
) -> KnockoutCurve:
    """Accuracy after knocking out the top-k heads of ``ranking`` vs k random heads (``n_seeds`` draws per k).

    ``ranking`` is a path-patching :class:`NodeScores` (heads ordered by ``by``; ``"neg"``: the
    largest drop of the answer logit first) or an explicit list of heads, most important first.
    ``ks`` may mix counts and fractions of all heads. Intervals: effect-rank and the base accuracy
    are Wilson intervals over prompts; random-rank is a bootstrap over prompts and seeds.
    ``options``: as in :func:`knockout_correct`, with a progress bar by default.
    """
    opts = sweep_options(options, "knockout_curve", KNOCKOUT_OPTIONS)
    opts, batch_size = dataclasses.replace(opts, progress=opts.shows_progress(True)), opts.batch(32)
    if n_seeds < 1:
        raise InputError(f"n_seeds must be >= 1, got {n_seeds}.")
    heads = _ranking(model, ranking, by)
    every_head = all_heads(model)
    ks = resolve_ks(ks, len(every_head), len(heads))
    if means is None:
        means = pool_means(model, dataset, every_head, n_pool=n_pool, seed=seed, batch_size=batch_size)
    sets: list[list[Head]] = [[]]
    for k in ks:
        sets.append(heads[:k])
        sets += [random.Random(derived_seed(seed, "random heads", s)).sample(every_head, k) for s in range(n_seeds)]
    hits = knockout_correct(model, dataset, sets, means=means, min_pool=min_pool, method=method, options=opts).double()
    base = proportion(hits[0])
    effect, random_rank = [], []
    for i in range(len(ks)):
        first = 1 + i * (1 + n_seeds)
        effect.append(proportion(hits[first]))
        random_rank.append(bootstrap_two_way(hits[first + 1: first + 1 + n_seeds].T, seed=seed))
    per_seed = [hits[1 + i * (1 + n_seeds) + 1: 1 + (i + 1) * (1 + n_seeds)].mean(1) for i in range(len(ks))]
    return KnockoutCurve(
        ks, [e.value for e in effect], [r.value for r in random_rank],
        [float(t.std()) if n_seeds > 1 else 0.0 for t in per_seed], base.value, [str(h) for h in heads[: ks[-1]]],
        n_seeds, n_prompts=len(dataset), n_pool=means.n_prompts,
        base_ci=[base.low, base.high], effect_ci=[[e.low, e.high] for e in effect],
        random_ci=[[r.low, r.high] for r in random_rank],
        effect_drop=[paired_difference(hits[0], hits[1 + i * (1 + n_seeds)], seed=seed).to_dict() for i in range(len(ks))],
        random_sets=[[[str(h) for h in sets[1 + i * (1 + n_seeds) + 1 + j]] for j in range(n_seeds)] for i in range(len(ks))],
        random_per_seed=[t.tolist() for t in per_seed],
    )


def knockout_transfer(
    model: HookedTransformer,
    datasets: dict[str, Dataset],
    heads: Sequence[Head],
    *,
    means: Optional[dict[str, LayoutMeans]] = None,
    n_pool: int = DEFAULT_POOL,
    min_pool: int = MIN_POOL_PER_LAYOUT,
    drop_uncovered: bool = False,
    seed: int = 0,
    method: str = "prefix",
    options: Optional[SweepOptions] = None,
) -> dict[str, dict]:
    """Per data format: accuracy of the full model and with ``heads`` mean-ablated (means from a pool of that format).

    Pass :func:`circuits.tasks.transfer_datasets` output (Zhang et al. Figure 4); ``means`` maps
    a format to its :class:`LayoutMeans` (default: a fresh pool per format). ``drop_uncovered``
    evaluates only the prompts whose layout has ``min_pool`` pool prompts (the count dropped is
    reported) instead of refusing. Accuracies carry Wilson intervals, the drop a paired bootstrap.
    ``options``: as in :func:`knockout_correct`; the bar (by default) counts formats.
    """
    opts = sweep_options(options, "knockout_transfer", KNOCKOUT_OPTIONS)
    batch_size, progress = opts.batch(32), opts.shows_progress(True)
    per_format = dataclasses.replace(opts, progress=False)
    out = {}
    for name, ds in tqdm(datasets.items(), desc="knockout transfer", disable=not progress, leave=False):
        m = (means or {}).get(name) or pool_means(model, ds, heads, n_pool=n_pool, seed=seed, batch_size=batch_size)
        n_all = len(ds)
        if drop_uncovered:
            ds = ds.select(covered_rows(ds, m, min_pool))
            if len(ds) == 0:
                out[name] = {"n_prompts": 0, "n_dropped": n_all, "skipped": "no layout has enough pool prompts"}
                continue
        hits = knockout_correct(model, ds, [[], heads], means=m, min_pool=min_pool, method=method,
                                options=per_format).double()
        base, ablated = proportion(hits[0]), proportion(hits[1])
        out[name] = {"n_prompts": len(ds), "n_dropped": n_all - len(ds), "n_pool": m.n_prompts,
                     "base": base.value, "knockout": ablated.value,
                     "base_estimate": base.to_dict(), "knockout_estimate": ablated.to_dict(),
                     "drop": paired_difference(hits[0], hits[1], seed=seed).to_dict()}
    return out
