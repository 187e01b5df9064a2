"""How stable a circuit method's circuit is: the same method on disjoint prompt sets, the circuits compared.

A circuit that is not the same on the next prompt set is not a finding: circuits found from slightly
different data can share few edges (arXiv 2605.09129). :func:`circuit_stability` runs one registered
circuit method (:data:`patching.edges.catalogue.CATALOGUE`, scored as
:func:`patching.edges.compare.compare_methods` scores it) on ``n_sets`` disjoint training sets
of the prompts, each as large as a selection half (``search.circuit_prompts // 2``), and, for a method
that draws random numbers (a learned mask, resampled scores), with each of ``seeds``. Then, at each
circuit size:

* the circuit every run selects at that size, as the curves select it (MIB's pruned top-n by |score|,
  or the method's own selector);
* the edge Jaccard index |A ∩ B| / |A ∪ B| of every pair of runs' circuits (mean, min, max over pairs),
  and the Spearman correlation of every pair's edge scores (over all edges, not only the circuit's);
* the *stable core*: the edges that more than ``core_share`` of the runs keep (default: a majority;
  with two runs, both), and its faithfulness
  f = (m(core) − m(∅)) / (m(full) − m(∅)) on held-out prompts that no run trained on (a set of the
  same size, disjoint from every training set), with a 95% bootstrap interval over those prompts.

A Jaccard near 1 and a core as faithful as each run's circuit say the circuit is a property of the
task, not of the prompts drawn; a low Jaccard says the size's edges are chosen by noise.
"""

from __future__ import annotations

import dataclasses
import itertools
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch
from datasets import Dataset
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.graph import Graph
from circuits.graph_selection import edge_jaccard, nodes_in_graph, score_spearman
from patching.edges.catalogue import CATALOGUE, EARLIER_METHODS, CircuitMethod, catalogued
from patching.edges.circuit_methods import ComparisonRun, means_pool, score_method, selected_circuit
from patching.edges.compare import MethodResult
from patching.edges.curves import FaithfulnessCurve, faithfulness_curve
from patching.edges.faithful_circuit import MIN_PROMPTS, CircuitSearch, score_selection
from patching.edges.learn import LearnConfig

STABILITY_FRACTIONS = (0.02, 0.05, 0.10)
#: kinds of method whose scores depend on a seed: each runs once per seed of ``circuit_stability``
SEEDED_KINDS = ("learned mask", "consensus", "resampled")


@dataclass
class StabilityResult:
    """What :func:`circuit_stability` measured (the module docstring); :meth:`to_dict` is results.json's form.

    ``runs``: (training set, seed) of each run, in order; ``scores[r]``: run r's edge scores;
    ``circuits[r][i]``: run r's circuit at ``fractions[i]``; ``cores[i]``: the stable core at ``fractions[i]``
    (a Graph whose scores are each edge's share of runs keeping it); ``core_curve``: the cores' faithfulness.
    """

    method: str
    kind: str
    fractions: list[float]
    core_share: float
    runs: list[tuple[int, int]]
    n_per_set: int
    heldout: Dataset
    scores: list[Graph]
    circuits: list[list[Graph]]
    cores: list[Graph]
    core_curve: FaithfulnessCurve

    def pairs(self) -> list[tuple[int, int]]:
        return list(itertools.combinations(range(len(self.runs)), 2))

    def jaccard(self) -> list[list[float]]:
        """At each fraction, the edge Jaccard of every pair of runs' circuits (in :meth:`pairs` order)."""
        return [[edge_jaccard(self.circuits[a][i].in_graph, self.circuits[b][i].in_graph) for a, b in self.pairs()]
                for i in range(len(self.fractions))]

    def node_jaccard(self) -> list[list[float]]:
        """At each fraction, the Jaccard of every pair of runs' node sets: the heads and MLPs (and the input) that the
        circuit's edges touch, the grain at which a circuit is read as "these heads"."""
        nodes = [[nodes_in_graph(c) for c in run] for run in self.circuits]
        return [[edge_jaccard(nodes[a][i], nodes[b][i]) for a, b in self.pairs()] for i in range(len(self.fractions))]

    def spearman(self) -> list[float]:
        """The Spearman correlation of every pair of runs' edge |scores| (in :meth:`pairs` order)."""
        return [score_spearman(self.scores[a], self.scores[b]) for a, b in self.pairs()]

    def to_dict(self) -> dict:
        """results.json's ``stability`` entry of one method (docs/results_json.md)."""
        n_total = self.scores[0].layout.n_edges
        jaccard = [{"fraction": x, "n_edges": int(x * n_total), **_spread(values)}
                   for x, values in zip(self.fractions, self.jaccard())]
        node_jaccard = [{"fraction": x, **_spread(values)} for x, values in zip(self.fractions, self.node_jaccard())]
        core = [{"fraction": x, "n_edges": int(c.in_graph.sum()), "f": f.to_dict()}
                for x, c, f in zip(self.fractions, self.cores, self.core_curve.faithfulness)]
        return {"method": self.method, "kind": self.kind, "n_sets": 1 + max(s for s, _ in self.runs),
                "seeds": sorted({seed for _, seed in self.runs}),
                "runs": [{"set": s, "seed": seed} for s, seed in self.runs], "n_per_set": self.n_per_set,
                "n_heldout": len(self.heldout), "n_total_edges": n_total, "fractions": list(self.fractions),
                "core_share": self.core_share,
                "circuit_edges": [[int(c.in_graph.sum()) for c in run] for run in self.circuits],
                "jaccard": jaccard, "node_jaccard": node_jaccard, "spearman": _spread(self.spearman()), "core": core}


def _spread(values: Sequence[float]) -> dict:
    """Mean, min and max of the pairs' values (NaN pairs left out of all three, and counted apart)."""
    finite = [v for v in values if np.isfinite(v)]
    stats = {"mean": float(np.mean(finite)), "min": float(min(finite)), "max": float(max(finite))} if finite \
        else {"mean": None, "min": None, "max": None}
    return stats | {"n_pairs": len(values), "n_undefined": len(values) - len(finite)}


def why_not_measurable(method: CircuitMethod) -> Optional[str]:
    """Why ``method`` has no circuit stability of its own to measure (None: it has)."""
    if method.position_aware:
        return "a position-aware method selects no single edge circuit to compare"
    if EARLIER_METHODS in method.needs:
        return "it combines the methods listed before it, so it has no scores of its own on a fresh prompt set"
    return None


def stability_prompts_needed(n_sets: int, circuit_prompts: int) -> int:
    """Prompts :func:`circuit_stability` draws: ``n_sets`` training sets and one held-out set of
    ``circuit_prompts // 2`` each."""
    return (n_sets + 1) * (circuit_prompts // 2)


def disjoint_sets(prompts: Dataset, n_sets: int, search: CircuitSearch) -> tuple[list[Dataset], Dataset]:
    """(``n_sets`` training sets, one held-out set): disjoint, ``search.circuit_prompts // 2`` prompts each,
    drawn from ``prompts`` shuffled with ``search.seed``."""
    if n_sets < 2:
        raise InputError(f"n_sets={n_sets}: stability compares the circuits of at least 2 disjoint prompt sets.")
    size, needed = search.circuit_prompts // 2, stability_prompts_needed(n_sets, search.circuit_prompts)
    if size < MIN_PROMPTS // 2:
        raise InputError(f"circuit_prompts={search.circuit_prompts} makes sets of {size} prompts; the held-out "
                         f"bootstrap needs at least {MIN_PROMPTS // 2}: raise circuit_prompts to {MIN_PROMPTS} or more.")
    if len(prompts) < needed:
        raise InputError(f"Circuit stability over {n_sets} disjoint prompt sets and a held-out set of "
                         f"{size} prompts each (circuit_prompts // 2) needs {needed} prompts, got {len(prompts)}: "
                         f"sample more prompts (--n-prompts), lower --stability-sets or --circuit-prompts.")
    shuffled = prompts.shuffle(seed=search.seed).select(range(needed))
    sets = [shuffled.select(range(i * size, (i + 1) * size)) for i in range(n_sets + 1)]
    return sets[:-1], sets[-1]


def circuit_stability(model: HookedTransformer, prompts: Dataset, method: Union[str, CircuitMethod],
                      search: CircuitSearch = CircuitSearch(), *, n_sets: int = 2, seeds: Optional[Sequence[int]] = None,
                      fractions: Sequence[float] = STABILITY_FRACTIONS, core_share: float = 0.5,
                      learn: Optional[LearnConfig] = None, warm_start: Optional[str] = "EAP-IG-inputs",
                      bootstrap_resamples: int = 10, reuse: Optional[MethodResult] = None, stage=None,
                      log=print, progress: Optional[Callable[[bool], None]] = None) -> StabilityResult:
    """The stability of one circuit method's circuits over ``n_sets`` disjoint prompt sets (the module docstring).

    ``method``: a name in :data:`patching.edges.catalogue.CATALOGUE`, or a :class:`CircuitMethod` record itself (one not registered:
    a test's stub). ``seeds``: the seeds a learned or resampled method runs with on each set (default
    ``search.seed`` alone); the seed replaces ``search.seed`` and ``learn.seed`` of the run. ``core_share``:
    a core edge is kept by more than this share of the runs (0.5: a majority). ``learn``, ``warm_start``,
    ``bootstrap_resamples``: as in :func:`patching.edges.compare.compare_methods`. ``reuse``: this
    method's result in :func:`patching.edges.compare.compare_methods` with the same prompts and ``search``;
    its selection half is the first training set here (both draw from the prompts shuffled with ``search.seed``), so
    its scores stand for the run on set 0 with ``search.seed`` instead of scoring that set again (for ACDC, an hour
    on gemma-3-270m). ``stage(name)``: a context manager the whole measurement runs in (one stage); ``log``: one
    line per run and a summary; ``progress(scored)``: called as each of the :func:`stability_runs` runs ends, with
    False for the run ``reuse`` stood for (it cost nothing: an estimate of the time left should not count it).
    """
    method = catalogued(method)
    refusal = why_not_measurable(method)
    if refusal:
        raise InputError(f"Circuit method {method.name!r} has no circuit stability to measure: {refusal}.")
    fractions = [float(x) for x in fractions]
    if not fractions or any(not 0 < x <= 1 for x in fractions) or sorted(set(fractions)) != fractions:
        raise InputError(f"fractions must increase strictly within (0, 1], got {fractions}.")
    if not 0 <= core_share < 1:
        raise InputError(f"core_share={core_share}: a core edge is kept by more than this share of the runs; "
                         "give a share in [0, 1) (0.5: a majority).")
    seeds = [search.seed] if seeds is None else list(seeds)
    if len(set(seeds)) != len(seeds):
        raise InputError(f"seeds {seeds} repeat a seed: a run paired with itself adds a Jaccard of 1 to the "
                         "stability. Give each seed once.")
    if not seeds:
        raise InputError("seeds is empty: give at least one seed (default: search.seed).")
    train_sets, heldout = disjoint_sets(prompts, n_sets, search)
    if method.kind not in SEEDED_KINDS:  # deterministic given the prompts: one run per set
        seeds = seeds[:1]
    learn = learn or search.learning
    reused_seed = _reused_seed(reuse, method, train_sets[0], search, learn)
    layout = Graph.from_model(model).layout
    stage = stage or (lambda name: nullcontext())

    with stage(f"stability of circuit method {method.name}"):
        runs, scores, circuits = [], [], []
        for index, train in enumerate(train_sets):
            for seed in seeds:
                if index == 0 and seed == reused_seed:
                    graph, select, how = reuse.found.scores, reuse.select, "the comparison's run"
                else:
                    run = ComparisonRun(model, train, layout, dataclasses.replace(search, seed=seed),
                                        dataclasses.replace(learn, seed=seed), warm_start, bootstrap_resamples)
                    scored, _ = score_method(run, method)
                    graph, select, how = scored.scores, scored.select, "scored"
                runs.append((index, seed))
                scores.append(graph)
                circuits.append([selected_circuit(graph, x, select) for x in fractions])
                log(f"{method.name:20s} set {index} seed {seed} ({how}): circuit edges "
                    + ", ".join(f"{100 * x:g}% {int(c.in_graph.sum())}" for x, c in zip(fractions, circuits[-1])))
                if progress is not None:
                    progress(how == "scored")
        result = compare_runs(model, runs, scores, circuits, heldout, search, method=method.name, kind=method.kind,
                              fractions=fractions, core_share=core_share, n_per_set=len(train_sets[0]),
                              means_from=means_pool(model, prompts, search))
    summary = result.to_dict()
    log(f"{method.name:20s} stability over {len(runs)} runs: Jaccard "
        + ", ".join(f"{100 * j['fraction']:g}% {_text(j['mean'])}" for j in summary["jaccard"])
        + "; core f " + ", ".join(f"{100 * c['fraction']:g}% {c['f']['value']:.3f} ({c['n_edges']} edges)"
                                  for c in summary["core"]))
    return result


def stability_runs(method: Union[str, CircuitMethod], n_sets: int, seeds: Optional[Sequence[int]] = None) -> int:
    """How many runs :func:`circuit_stability` makes of ``method`` with these ``n_sets`` and ``seeds``: one per set,
    times the seeds for a method that draws random numbers (a deterministic one runs once per set); 0 for a method
    with no circuit stability to measure (:func:`why_not_measurable`)."""
    method = catalogued(method)
    if why_not_measurable(method):
        return 0
    return n_sets * (len(seeds) if seeds and method.kind in SEEDED_KINDS else 1)


def _reused_seed(reuse: Optional[MethodResult], method: CircuitMethod, first_set: Dataset, search: CircuitSearch,
                 learn: LearnConfig) -> Optional[int]:
    """The seed of the run on the first set that ``reuse`` stands for (None: no run is reused).

    A result of another method, or one whose selection half is not the first set, is refused: its scores would
    pass for a run they are not. A learned mask run with ``learn.seed`` other than ``search.seed`` is a run that
    :func:`circuit_stability` never makes (it gives both the same seed), so it is not reused.
    """
    if reuse is None:
        return None
    if reuse.name != method.name:
        raise InputError(f"reuse holds circuit method {reuse.name!r}'s result, not {method.name!r}'s: pass the "
                         "comparison's result of the method whose stability is measured.")
    if reuse.found.selection["tokens"] != first_set["tokens"]:
        raise InputError(f"reuse of {method.name!r}: its selection half is not the first stability set; pass the "
                         "result of compare_methods run on the same prompts with the same search (seed and "
                         "circuit_prompts).")
    if method.kind in SEEDED_KINDS and learn.seed != search.seed:
        return None
    return search.seed


def _text(value: Optional[float]) -> str:
    return "undefined" if value is None else f"{value:.3f}"


def stability_of_found(model: HookedTransformer, prompts: Dataset, scores: Graph, search: CircuitSearch, *,
                       n_sets: int = 2, fractions: Sequence[float] = STABILITY_FRACTIONS, select=None,
                       log=print) -> StabilityResult:
    """The stability of a circuit already found on the first of :func:`disjoint_sets`' sets (``scores``: e.g.
    :func:`patching.edges.faithful_circuit.find_faithful_circuit`'s, whose selection half is that set): the
    search's method (:func:`patching.edges.faithful_circuit.score_selection`) on each further set, the circuits
    compared and the stable core curved on the held-out set, as :func:`circuit_stability` does, one run fewer.
    ``select``: the found circuit's own selector (``FaithfulCircuit.select``; None: MIB's pruned top-n)."""
    train_sets, heldout = disjoint_sets(prompts, n_sets, search)
    graphs, selectors = [scores], [select]
    for index, train in enumerate(train_sets[1:], start=1):
        scored = score_selection(model, train, search)
        graphs.append(scored.scores)
        selectors.append(scored.select)
        log(f"{search.method}: set {index} scored ({scored.info['seconds']:.0f} s)")
    circuits = [[selected_circuit(g, x, chooser) for x in fractions] for g, chooser in zip(graphs, selectors)]
    return compare_runs(model, [(i, search.seed) for i in range(len(graphs))], graphs, circuits, heldout, search,
                        method=search.method, kind=CATALOGUE[search.method].kind, fractions=fractions,
                        n_per_set=len(train_sets[0]), means_from=means_pool(model, prompts, search))


def compare_runs(model: HookedTransformer, runs: Sequence[tuple[int, int]], scores: Sequence[Graph],
                 circuits: Sequence[Sequence[Graph]], heldout: Dataset, search: CircuitSearch, *, method: str,
                 kind: str, fractions: Sequence[float], core_share: float = 0.5, n_per_set: int = 0,
                 means_from: Optional[Dataset] = None) -> StabilityResult:
    """The comparison of circuits that runs have already found: their stable cores and the cores' held-out curve.

    ``runs``: (training set, seed) of each run; ``scores[r]`` its edge scores; ``circuits[r][i]`` its circuit at
    ``fractions[i]``; ``heldout``: prompts no run trained on. :func:`circuit_stability` calls this after scoring
    its own runs; an experiment that learns its circuits itself (``experiments.learned_circuit``) hands its runs here.
    """
    if len(runs) < 2 or not (len(runs) == len(scores) == len(circuits)):
        raise InputError(f"Stability compares at least 2 runs, each with scores and one circuit per fraction; got "
                         f"{len(runs)} runs, {len(scores)} score graphs and {len(circuits)} circuit lists.")
    fractions = [float(x) for x in fractions]
    layout = scores[0].layout
    cores = []
    for i in range(len(fractions)):
        share = torch.stack([run[i].in_graph for run in circuits]).float().mean(dim=0)
        cores.append(Graph(layout, share, in_graph=share > core_share))
    by_size = {int(x * layout.n_edges): core.in_graph for x, core in zip(fractions, cores)}
    # the curve asks a selector for the circuit of each size; this one hands back the core of that size
    core_curve = faithfulness_curve(model, cores[0], heldout, fractions=fractions, ablation=search.ablation,
                                    means_from=means_from, select=lambda _scores, n: by_size[n],
                                    n_bootstrap=search.n_bootstrap, seed=search.seed, options=search.options(False))
    return StabilityResult(method, kind, fractions, core_share, list(runs), n_per_set, heldout, list(scores),
                           [list(c) for c in circuits], cores, core_curve)
