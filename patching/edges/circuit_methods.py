"""The circuit methods and their one registry, :data:`REGISTRY`; :func:`compare_methods` runs several side by side.

A circuit method scores every edge of the graph on the selection half of the prompts (or, for a
selection method, chooses each size's circuit from another method's scores). Each is a
:class:`CircuitMethod` record: its name, its kind (:data:`KINDS`), what it needs (:data:`NEEDS`),
where it comes from, and how it scores, a function ``score(run, name) -> MethodScores`` on a
:class:`ComparisonRun` (the model, the halves, the settings, the scores computed so far).
A new method is one record.

:func:`compare_methods` is the smallest-faithful-circuit procedure of
:mod:`patching.edges.faithful_circuit` for every method named: the same selection half scored,
the same two halves curved, each method's time counted apart, each row paired against the first
method on the same held-out prompts.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from datasets import Dataset
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import mib_selector, select_fraction
from circuits.pools import pool_dataset
from patching.edges.acdc import ACDCConfig, acdc
from patching.edges.attribute import EDGE_ATTRIBUTION_METHODS, edge_attribution
from patching.edges.combine import bootstrap_scores, ensemble, ilp_selector
from patching.edges.curves import faithfulness_curve, paired_curve_difference
from patching.edges.faithful_circuit import CircuitSearch, FaithfulCircuit, smallest_faithful, split_halves
from patching.edges.learn import METHODS as LEARNED_METHODS
from patching.edges.learn import LearnConfig, learn_circuit
from patching.edges.patch import edge_patch
from patching.edges.positions import SPANS

#: what a method is
KINDS = {
    "attribution": "edge scores from gradients (EAP, EAP-IG: patching.edges.attribute)",
    "exact": "every edge patched on its own (patching.edges.patch)",
    "learned mask": "a mask over the edges optimised on the selection half (patching.edges.learn)",
    "ensemble": "the methods listed before it, combined (patching.edges.combine)",
    "resampled": "scores over resamples of the selection half, kept where their sign is stable",
    "selection": "each size's circuit chosen from another method's scores, not by |score| order",
    "position-aware": "edges between spans of the prompt layout (patching.edges.positions)",
    "greedy pruning": "edges removed one at a time from the full graph while the circuit stays close to the model "
                      "(patching.edges.acdc)",
}

GRADIENTS = "gradients"
COUNTERFACTUALS = "counterfactuals"
WARM_START = "warm start"
EARLIER_METHODS = "earlier methods"
ILP_SOLVER = "ILP solver"
#: what a method may need
NEEDS = {
    GRADIENTS: "backward passes through the model",
    COUNTERFACTUALS: "a counterfactual twin of every prompt",
    WARM_START: "another method's scores to start from (compare_methods' warm_start; None: a cold start)",
    EARLIER_METHODS: "the scores of at least two methods listed before it",
    ILP_SOLVER: "scipy's MILP solver (scipy.optimize.milp)",
}


@dataclass
class MethodScores:
    """What a method's ``score`` returns: the scores, and how :func:`compare_methods` is to use them.

    ``select``: the method's own circuit selector ``select(scores, n) -> mask`` (None: MIB's pruned top-n);
    ``reused``: the earlier method whose scores these are (their time is counted to this one);
    ``info``: extra keys of the method's row.
    """

    scores: object  # a Graph, or PositionalScores for a position-aware method
    select: Optional[Callable] = None
    reused: Optional[str] = None
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CircuitMethod:
    """One circuit method: its name, kind, needs, source, and how it scores the selection half."""

    name: str
    kind: str  # one of KINDS
    #: ``score(run, name)``: the method's scores of the selection half of ``run``
    score: Callable[["ComparisonRun", str], MethodScores]
    needs: tuple[str, ...] = (GRADIENTS, COUNTERFACTUALS)  # names in NEEDS
    source: str = ""  # the paper or code it follows
    #: its scores join those later warm starts and ensembles draw on
    keeps_scores: bool = True
    #: position-aware edges: curved unpruned, no single circuit, no paired difference
    position_aware: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise TypeError(f"Circuit method {self.name!r}: kind {self.kind!r} is none of {sorted(KINDS)}.")
        unknown = set(self.needs) - set(NEEDS)
        if unknown:
            raise TypeError(f"Circuit method {self.name!r} needs {sorted(unknown)}, none of {sorted(NEEDS)}.")


@dataclass
class ComparisonRun:
    """What every method of one :func:`compare_methods` call scores on, and the scores computed so far.

    ``computed``: scores by method name, for warm starts and ensembles (in the order computed);
    ``cost``: the (wall, CPU) seconds each attribution took when it was computed.
    """

    model: HookedTransformer
    selection: Dataset
    layout: GraphLayout
    search: CircuitSearch
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

    def cached_attribution(self, name: str):
        """:meth:`attribution` of the whole selection half, computed once and timed into ``cost``."""
        if name not in self.computed:
            wall, cpu = time.perf_counter(), time.process_time()
            self.computed[name] = self.attribution(name)
            self.cost[name] = (time.perf_counter() - wall, time.process_time() - cpu)
        return self.computed[name]


# ---------------------------------------------------------------------------- how each kind scores


def _attribution_scores(run: ComparisonRun, name: str) -> MethodScores:
    reused = name if name in run.computed else None
    return MethodScores(run.cached_attribution(name), reused=reused)


def _exact_scores(run: ComparisonRun, name: str) -> MethodScores:
    s = run.search
    effects = edge_patch(run.model, None, run.selection, options=s.options(False))
    return MethodScores(effects.graph())


def _learned_scores(run: ComparisonRun, name: str) -> MethodScores:
    warm = run.warm_start
    init = run.cached_attribution(warm) if warm else None  # computed before the method's clock started
    learned = learn_circuit(run.model, run.selection, config=run.learn, method=name, init=init, progress=False)
    return MethodScores(learned.graph, info=learned.brief(warm, run.cost[warm][0] if warm else 0.0))


def _ensemble_scores(run: ComparisonRun, name: str) -> MethodScores:
    members = list(run.computed)
    if len(members) < 2:
        raise InputError("'ensemble' combines the methods listed before it: list at least two first.")
    return MethodScores(ensemble(run.layout, [run.computed[m] for m in members], "mean", "rank"),
                        info={"members": members})


def _bootstrap_scores(run: ComparisonRun, name: str) -> MethodScores:
    boot = bootstrap_scores(lambda rows: run.attribution(run.search.attribution_method, rows), len(run.selection), run.layout,
                            n_resamples=run.bootstrap_resamples, seed=run.search.seed)
    return MethodScores(boot.graph(), info={"n_resamples": run.bootstrap_resamples, "n_stable": int(boot.stable.sum())})


def _ilp_scores(run: ComparisonRun, name: str) -> MethodScores:
    method = run.search.attribution_method
    reused = method if method in run.computed else None
    return MethodScores(run.cached_attribution(method), select=ilp_selector(run.layout), reused=reused)


def _positional_scores(run: ComparisonRun, name: str) -> MethodScores:
    return MethodScores(run.attribution(run.search.attribution_method, spans=SPANS))


def _acdc_scores(run: ComparisonRun, name: str) -> MethodScores:
    s = run.search
    config = ACDCConfig(threshold=s.acdc_threshold, objective=s.acdc_objective, ablation=s.ablation)
    # over the whole graph ACDC runs for hours on a CPU, far longer than any other row: its bar shows how far it is
    found = acdc(run.model, run.selection, config=config, means_from=means_pool(run.model, run.selection, s),
                 options=s.options(True))
    # ranked by damage, signed: the edges ACDC kept (damage >= τ) come first, so its circuit is a point of the curve
    return MethodScores(found.graph, select=mib_selector(run.layout, absolute=False), info={"acdc": found.to_dict()})


_ATTRIBUTION_SOURCES = {
    "EAP": "Syed et al. 2023, edge attribution patching",
    "EAP-GP": "Zhang et al. 2025, EAP with GradPath, a gradient-steered integration path (arXiv 2502.06852)",
    "CEAP": "conductance EAP (arXiv 2606.16920): Dhamdhere et al. 2018's conductance along EAP-IG's path",
    "EAP-IG-inputs": "Hanna et al. 2024, EAP with integrated gradients over the inputs",
    "EAP-IG-activations": "Hanna et al. 2024 (hannamw/EAP-IG), integrated gradients over each layer's activations",
    "clean-corrupted": "hannamw/EAP-IG, the mean of the reference and counterfactual gradients",
}
_LEARNED_SOURCES = {
    "edge-pruning": "Bhaskar et al. 2024, Edge Pruning (arXiv 2406.16778)",
    "ugs": "Mueller et al. 2025, MIB's uniform gradient sampling",
    "matryoshka": "random-budget (Matryoshka-style) masks: nested circuits faithful at every size",
}
_RECORDS = (
    *(CircuitMethod(name, "attribution", _attribution_scores,
                    source=_ATTRIBUTION_SOURCES.get(name, "patching.edges.attribute"))
      for name in EDGE_ATTRIBUTION_METHODS),
    *(CircuitMethod(name, "learned mask", _learned_scores, needs=(GRADIENTS, COUNTERFACTUALS, WARM_START),
                    source=_LEARNED_SOURCES.get(name, "patching.edges.learn"))
      for name in LEARNED_METHODS),
    CircuitMethod("exact", "exact", _exact_scores, needs=(COUNTERFACTUALS,),
                  source="exact edge patching, the ground truth attribution approximates"),
    CircuitMethod("ensemble", "ensemble", _ensemble_scores, needs=(EARLIER_METHODS,),
                  source="mean of normalised rankings"),
    CircuitMethod("bootstrap", "resampled", _bootstrap_scores,
                  source="Nikankin et al. 2025, sign-stable edges over bootstrap resamples (arXiv 2510.25786)"),
    CircuitMethod("ilp", "selection", _ilp_scores, needs=(GRADIENTS, COUNTERFACTUALS, ILP_SOLVER),
                  source="Nikankin et al. 2025, an ILP that picks the edge set (arXiv 2510.25786)", keeps_scores=False),
    CircuitMethod("positional", "position-aware", _positional_scores,
                  source="Haklay et al. 2025, position-aware edge attribution (PEAP, ACL)", keeps_scores=False,
                  position_aware=True),
    CircuitMethod("ACDC", "greedy pruning", _acdc_scores, needs=(COUNTERFACTUALS,),
                  source="Conmy et al. 2023, automated circuit discovery (ACDC, NeurIPS)"),
)
#: every circuit method by name, in the order the CLI and the errors list them
REGISTRY: dict[str, CircuitMethod] = {r.name: r for r in _RECORDS}


# ---------------------------------------------------------------------------- one method's scores and circuits


def check_method_names(methods: Sequence[str]) -> None:
    """Refuse names that are not in :data:`REGISTRY`, listing the registered ones."""
    unknown = [m for m in methods if m not in REGISTRY]
    if unknown:
        raise InputError(f"Unknown circuit method(s) {unknown}: use any of {', '.join(REGISTRY)}.")


def registered_method(method: "str | CircuitMethod") -> CircuitMethod:
    """``method`` as a record: a :data:`REGISTRY` name looked up (unknown names refused), a record passed through."""
    if isinstance(method, str):
        check_method_names([method])
        return REGISTRY[method]
    return method


def means_pool(model: HookedTransformer, prompts: Dataset, search: CircuitSearch) -> Optional[Dataset]:
    """The prompts a mean ablation averages over (none of them evaluated); None for the other ablations."""
    if not search.ablation.endswith("mean"):
        return None
    return pool_dataset(model, prompts, search.pool_prompts, seed=search.seed + 1)


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


# ---------------------------------------------------------------------------- several methods side by side


@dataclass
class MethodResult:
    """One method of a comparison: its circuit search and its cost (wall and this process's CPU seconds)."""

    name: str
    found: FaithfulCircuit
    seconds: float
    cpu_seconds: float
    info: dict = field(default_factory=dict)
    select: Optional[Callable] = None  # the method's own circuit selector (None: MIB's pruned top-n)

    def row(self, fractions: Sequence[float] = (0.01, 0.02, 0.05, 0.1, 0.2)) -> dict:
        """The comparison table's row: held-out CPR, CMD, f at ``fractions``, the smallest faithful size, time."""
        held = self.found.curve_heldout
        f_at = {}
        for x in fractions:
            if x in held.fractions:
                f_at[f"f@{100 * x:g}%"] = held.faithfulness[held.fractions.index(x)].to_dict()
        smallest = self.found.smallest
        return {"method": self.name, "cpr": held.cpr.to_dict(), "cmd": held.cmd.to_dict(), **f_at,
                "smallest_fraction": None if smallest is None else smallest["fraction"],
                "smallest_f_heldout": None if smallest is None else smallest["f_heldout"],
                "n_heldout": held.n_prompts, "seconds": round(self.seconds, 1), "cpu_seconds": round(self.cpu_seconds, 1),
                **self.info}


def compare_methods(model: HookedTransformer, prompts: Dataset, methods: Sequence[str],
                    search: CircuitSearch = CircuitSearch(), *, learn=None, warm_start: Optional[str] = "EAP-IG-inputs",
                    bootstrap_resamples: int = 10, stage=None, log=print) -> list[MethodResult]:
    """Every method in ``methods`` (names in :data:`REGISTRY`) scored on the same selection half and curved on
    the same held-out half.

    The learned methods (with ``learn``, a :class:`patching.edges.learn.LearnConfig`; default ``search.learning``) start from
    ``warm_start``'s scores (None: cold); ``"ensemble"`` is the mean-rank ensemble of the methods before it;
    ``"bootstrap"`` the sign-stable ``search.attribution_method`` scores over ``bootstrap_resamples`` prompt
    resamples; ``"ilp"`` chooses each size's circuit by the ILP over those scores; ``"positional"`` scores
    position-aware edges (:mod:`patching.edges.positions`) by that method. Time is counted per method,
    warm starts and the scores an ensemble reuses excluded.
    """
    check_method_names(methods)
    stage = stage or (lambda name: nullcontext())
    selection, heldout = split_halves(prompts, search.circuit_prompts, search.seed)
    pool = means_pool(model, prompts, search)
    layout = Graph.from_model(model).layout
    run = ComparisonRun(model, selection, layout, search, learn or search.learning, warm_start, bootstrap_resamples)

    results = []
    for name in methods:
        method = REGISTRY[name]
        with stage(f"circuit method {name}"):
            scored, (wall, cpu) = score_method(run, method)
            scores, select = scored.scores, scored.select
            curves = [faithfulness_curve(model, scores, part, ablation=search.ablation, means_from=pool,
                                         select=select or (None if method.position_aware else mib_selector(layout)),
                                         n_bootstrap=search.n_bootstrap, seed=search.seed,
                                         options=search.options(False))
                      for part in (selection, heldout)]
            smallest = smallest_faithful(curves[0], curves[1], search.threshold)
            graph = scores if isinstance(scores, Graph) else scores.merged()
            circuit = None
            if smallest and not method.position_aware:
                circuit = selected_circuit(graph, smallest["fraction"], select)
            found = FaithfulCircuit(search, graph, selection, heldout, curves[0], curves[1], smallest, circuit)
            seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
            if scored.reused is not None:  # the scores came from an earlier method: count the time they took then
                seconds, cpu_seconds = seconds + run.cost[scored.reused][0], cpu_seconds + run.cost[scored.reused][1]
            result = MethodResult(name, found, seconds, cpu_seconds, scored.info, select)
        if results and not method.position_aware:  # paired against the first method, on the same held-out prompts
            result.info["minus_" + results[0].name] = paired_curve_difference(result.found.curve_heldout,
                                                                               results[0].found.curve_heldout,
                                                                               n_bootstrap=search.n_bootstrap,
                                                                               seed=search.seed)
        results.append(result)
        row = result.row()
        log(f"{name:20s} CPR {row['cpr']['value']:.3f}  CMD {row['cmd']['value']:.3f}  "
            f"f@5% {row.get('f@5%', {}).get('value', float('nan')):.3f}  smallest f>={search.threshold:g}: "
            f"{row['smallest_fraction']}  ({row['seconds']:.0f} s)")
    return results
