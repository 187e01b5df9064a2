"""How each circuit method scores the selection half: one function per kind, on one :class:`ComparisonRun`.

The methods themselves are records of :data:`patching.edges.catalogue.CATALOGUE` (torch-free: name, kind, needs,
source, settings); each names its scoring function here (or in a module of its own, e.g.
:mod:`patching.edges.consensus`) as ``"module:function"``. A scoring function ``score(run, name) -> MethodScores``
reads the model, the selection half, the search's settings and the scores computed so far from ``run``.
:func:`score_method` is the one path every caller scores through: the default search
(:func:`patching.edges.faithful_circuit.score_selection`), the comparison
(:func:`patching.edges.compare.compare_methods`), stability and the prompt families.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from datasets import Dataset
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import mib_selector, select_fraction
from circuits.pools import pool_dataset
from circuits.seeds import derived_seed
from patching.edges.acdc import ACDCConfig, acdc
from patching.edges.attribute import edge_attribution
from patching.edges.catalogue import WARM_START, CircuitMethod, catalogued
from patching.edges.combine import bootstrap_scores, ensemble, ilp_selector
from patching.edges.learn import LearnConfig, learn_circuit
from patching.edges.patch import edge_patch
from patching.edges.positions import SPANS


@dataclass
class MethodScores:
    """What a method's ``score`` returns: the scores, and how a comparison or a search is to use them.

    ``select``: the method's own circuit selector ``select(scores, n) -> mask`` (None: MIB's pruned top-n);
    ``reused``: the earlier method whose scores these are (their time is counted to this one);
    ``info``: extra keys of the method's row.
    """

    scores: object  # a Graph, or PositionalScores for a position-aware method
    select: Optional[Callable] = None
    reused: Optional[str] = None
    info: dict = field(default_factory=dict)
    warm_scores: Optional[Graph] = None  # a learned method's signed warm start (what a figure colours edges by)


@dataclass
class ComparisonRun:
    """What every method of one comparison (or one search) scores on, and the scores computed so far.

    ``computed``: scores by method name, for warm starts and ensembles (in the order computed);
    ``cost``: the (wall, CPU) seconds each attribution took when it was computed.
    """

    model: HookedTransformer
    selection: Dataset
    layout: GraphLayout
    search: object  # a patching.edges.faithful_circuit.CircuitSearch (that module scores through this one)
    learn: LearnConfig
    warm_start: Optional[str]
    bootstrap_resamples: int
    computed: dict = field(default_factory=dict)
    cost: dict = field(default_factory=dict)

    def attribution(self, name: str, rows: Optional[Sequence[int]] = None, **kw):
        """Edge attribution ``name`` on the selection half (or its ``rows``), with the search's settings."""
        data = self.selection if rows is None else self.selection.select(rows)
        s = self.search
        return edge_attribution(self.model, data, method=name, ig_steps=s.ig_steps, options=s.options(False), **kw)

    def settings_of(self, name: str):
        """Method ``name``'s own settings record in this run's search (its defaults where the search sets none)."""
        return self.search.settings_for(catalogued(name))

    def cached_attribution(self, name: str):
        """:meth:`attribution` of the whole selection half, computed once and timed into ``cost``."""
        if name not in self.computed:
            wall, cpu = time.perf_counter(), time.process_time()
            self.computed[name] = self.attribution(name)
            self.cost[name] = (time.perf_counter() - wall, time.process_time() - cpu)
        return self.computed[name]


# ---------------------------------------------------------------------------- how each kind scores


def attribution_scores(run: ComparisonRun, name: str) -> MethodScores:
    """An attribution method's scores of the selection half (computed once per run: a warm start reuses them)."""
    reused = name if name in run.computed else None
    return MethodScores(run.cached_attribution(name), reused=reused)


def exact_scores(run: ComparisonRun, name: str) -> MethodScores:
    """Every edge patched on its own: the exact effect of each on the selection half."""
    s = run.search
    effects = edge_patch(run.model, None, run.selection, options=s.options(False))
    return MethodScores(effects.graph())


def learned_scores(run: ComparisonRun, name: str) -> MethodScores:
    """A learned mask (``run.learn`` with this method) from the run's warm start, and what the learning took."""
    warm = run.warm_start
    init = run.cached_attribution(warm) if warm else None  # computed before the method's clock started
    config = dataclasses.replace(run.learn, method=name)
    learned = learn_circuit(run.model, run.selection, config=config, init=init, progress=True,  # a bar with an ETA
                            metric=run.search.sweep.metric)
    info = learned.brief(warm, run.cost[warm][0] if warm else 0.0)
    info["learning"] = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("progress", "memory_mb")}
    return MethodScores(learned.graph, info=info, warm_scores=init)


def ensemble_scores(run: ComparisonRun, name: str) -> MethodScores:
    """The mean-rank ensemble of every method scored before it in the run."""
    members = list(run.computed)
    if len(members) < 2:
        raise InputError("'ensemble' combines the methods listed before it: list at least two first.")
    return MethodScores(ensemble(run.layout, [run.computed[m] for m in members], "mean", "rank"),
                        info={"members": members})


def resampled_scores(run: ComparisonRun, name: str) -> MethodScores:
    """The search's attribution over prompt resamples, kept where its sign is stable (Nikankin et al. 2025)."""
    boot = bootstrap_scores(lambda rows: run.attribution(run.search.attribution_method, rows), len(run.selection), run.layout,
                            n_resamples=run.bootstrap_resamples, seed=run.search.seed)
    return MethodScores(boot.graph(), info={"n_resamples": run.bootstrap_resamples, "n_stable": int(boot.stable.sum())})


def ilp_scores(run: ComparisonRun, name: str) -> MethodScores:
    """The search's attribution scores, each size's circuit chosen by the ILP selector."""
    method = run.search.attribution_method
    reused = method if method in run.computed else None
    return MethodScores(run.cached_attribution(method), select=ilp_selector(run.layout), reused=reused)


def positional_scores(run: ComparisonRun, name: str) -> MethodScores:
    """Position-aware edge scores over the prompt layout's spans, by the search's attribution method."""
    return MethodScores(run.attribution(run.search.attribution_method, spans=SPANS))


def acdc_scores(run: ComparisonRun, name: str) -> MethodScores:
    """ACDC's greedy pruning with the method's own settings (threshold, objective), ranked by damage."""
    s = run.search
    own = run.settings_of(name)
    config = ACDCConfig(threshold=own.threshold, objective=own.objective, ablation=s.ablation)
    # over the whole graph ACDC runs for hours on a CPU, far longer than any other row: its bar shows how far it is
    found = acdc(run.model, run.selection, config=config, means_from=means_pool(run.model, run.selection, s),
                 options=s.options(True))
    # ranked by damage, signed: the edges ACDC kept (damage >= τ) come first, so its circuit is a point of the curve
    return MethodScores(found.graph, select=mib_selector(run.layout, absolute=False), info={"acdc": found.to_dict()})


# ---------------------------------------------------------------------------- one method's scores and circuits


def means_pool(model: HookedTransformer, prompts: Dataset, search) -> Optional[Dataset]:
    """The prompts a mean ablation averages over (none of them evaluated); None for the other ablations."""
    if not search.ablation.endswith("mean"):
        return None
    return pool_dataset(model, prompts, search.pool_prompts, seed=derived_seed(search.seed, "mean pool"))


def score_method(run: ComparisonRun, method: CircuitMethod) -> tuple[MethodScores, tuple[float, float]]:
    """``method``'s scores of ``run``'s selection half, and the (wall, CPU) clock read just before it scored.

    A warm start is computed before the clock is read (its time is reported apart); scores the method keeps
    join ``run.computed`` for the warm starts and ensembles after it.
    """
    if WARM_START in method.needs and run.warm_start:
        run.cached_attribution(run.warm_start)
    started = (time.perf_counter(), time.process_time())
    scored = method.score(run, method.name)
    if method.keeps_scores:
        run.computed[method.name] = scored.scores
    return scored, started


def selected_circuit(graph: Graph, fraction: float, select: Optional[Callable] = None) -> Graph:
    """The circuit the curves evaluate at ``fraction`` of the edges: MIB's pruned top-n by |score|
    (:func:`circuits.graph_selection.select_fraction`), or ``select(scores, n)``, a method's own selector."""
    if select is None:
        return select_fraction(graph, fraction)
    n = int(fraction * graph.layout.n_edges)
    return Graph(graph.layout, graph.scores, in_graph=select(graph.scores, n))
