"""The smallest faithful edge circuit of a task, chosen on one half of the prompts and reported on the other.

:func:`find_faithful_circuit` is the whole procedure, with its settings in one record
(:class:`CircuitSearch`):

1. the prompts (correctly answered ones) are shuffled with the seed and split into a
   *selection* half and a *held-out* half;
2. every edge is scored on the selection half by the search's method (:func:`score_selection`): by
   default the learned straight-through top-n (:data:`patching.edges.learn.DEFAULT_CIRCUIT`, warm-started
   from EAP-IG-inputs on the same prompts), or any learned method of :data:`patching.edges.learn.METHODS`,
   or an attribution method (:data:`patching.edges.attribute.EDGE_ATTRIBUTION_METHODS`, e.g.
   ``"EAP-IG-inputs"``: a few backward passes); or the caller passes scores of its own (``scores=``);
3. the MIB faithfulness curve of the pruned top-n circuits (:func:`circuits.graph_selection.mib_selector`)
   is measured on each half, with bootstrap intervals (:func:`patching.edges.curves.faithfulness_curve`);
4. the smallest size whose f reaches ``threshold`` is chosen on the selection half and its f is read
   on the held-out half, so the reported number is not inflated by the choice.

:func:`key_head_relation` and :func:`key_heads_by_size` relate the circuit to node-level key heads
(which of them it holds, at each size). :func:`patching.edges.compare.compare_methods` runs the
procedure for several methods (attribution, exact patching, learned masks, ensembles, bootstrapped scores,
the ILP, position-aware edges) on the same two halves, with each method's time.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from datasets import Dataset
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.graph import Graph
from circuits.graph_selection import mib_selector, nodes_in_graph, select_fraction, select_top_n
from circuits.nodes import Head
from patching.edges.catalogue import ATTRIBUTION_METHODS, CATALOGUE, SEARCH_METHODS, CircuitMethod
from patching.edges.circuit_methods import ComparisonRun, means_pool, score_method, selected_circuit
from patching.edges.curves import MIB_FRACTIONS, FaithfulnessCurve, faithfulness_curve
from patching.edges.learn import DEFAULT_CIRCUIT, LearnConfig
from patching.sweeps.metrics import get_metric
from patching.sweeps.options import SweepOptions

MIN_PROMPTS = 4  # two per half: the fewest a bootstrap interval can be drawn from
TOP_EDGES_LISTED = 20


@dataclass(frozen=True)
class CircuitSearch:
    """How :func:`find_faithful_circuit` scores, evaluates and chooses (every field has the CLI's default)."""

    circuit_prompts: int = 64  # prompts used, split in half
    method: str = "top-n"  # one of patching.edges.catalogue.SEARCH_METHODS
    ig_steps: int = 5
    ablation: str = "counterfactual"
    threshold: float = 0.8
    pool_prompts: int = 256  # prompts the mean ablations average over (none of them evaluated)
    n_bootstrap: int = 1000
    seed: int = 0
    #: the batching and memory budget of every sweep of the search (its progress is set per sweep)
    sweep: SweepOptions = SweepOptions(batch_size=32, memory_mb=1024.0)
    warm_start: Optional[str] = "EAP-IG-inputs"  # a learned method's starting scores (None: a cold start)
    learning: LearnConfig = DEFAULT_CIRCUIT  # a learned method's settings (its ``method`` is the search's)
    #: settings records of methods that declare their own (patching.edges.catalogue, ``settings=``); a method not
    #: given here runs with its record's defaults
    method_settings: tuple = ()

    def settings_for(self, method: CircuitMethod):
        """``method``'s own settings: the record of its settings type in :attr:`method_settings`, else its defaults."""
        if method.settings is None:
            return None
        given = [s for s in self.method_settings if type(s) is method.settings]
        return given[0] if given else method.default_settings()

    @property
    def attribution_method(self) -> str:
        """The attribution method of the search: ``method`` itself when it is one, else the warm start's (what
        resampled scores, the ILP and position-aware edges score with), EAP-IG-inputs without one."""
        return self.method if self.method in ATTRIBUTION_METHODS else (self.warm_start or "EAP-IG-inputs")

    def options(self, progress: Optional[bool] = None) -> SweepOptions:
        """The batching and memory budget of every sweep of the search, as :class:`patching.SweepOptions`."""
        return dataclasses.replace(self.sweep, progress=progress)


@dataclass
class FaithfulCircuit:
    """What :func:`find_faithful_circuit` found: the scores, both curves, and the smallest faithful circuit."""

    search: CircuitSearch
    scores: Graph
    selection: Dataset
    heldout: Dataset
    curve_selection: FaithfulnessCurve
    curve_heldout: FaithfulnessCurve
    smallest: Optional[dict]  # fraction, n_edges, f on each half, threshold (None: no size reaches it)
    circuit: Optional[Graph]  # the pruned top-n circuit of that size
    extra: dict = field(default_factory=dict)
    warm_scores: Optional[Graph] = None  # a learned method's signed warm-start scores
    select: Optional[Callable] = None  # the method's own circuit selector (None: MIB's pruned top-n)

    def to_dict(self) -> dict:
        """results.json's ``edge_circuit`` keys (docs/results_json.md)."""
        s = self.search
        return {
            "method": s.method, "method_info": self.extra, "ig_steps": s.ig_steps, "ablation": s.ablation,
            "metric": get_metric(s.sweep.metric).name,
            "threshold": s.threshold, "n_selection": len(self.selection), "n_heldout": len(self.heldout),
            "n_total_edges": self.scores.layout.n_edges, "scores": score_summary(self.scores),
            "curve_heldout": self.curve_heldout.to_dict(), "curve_selection": self.curve_selection.to_dict(),
            "cpr": self.curve_heldout.cpr.to_dict(), "cmd": self.curve_heldout.cmd.to_dict(), "smallest": self.smallest,
        }


def split_halves(prompts: Dataset, n: int, seed: int) -> tuple[Dataset, Dataset]:
    """(selection, held-out): ``n`` of the prompts, shuffled with ``seed``, in two halves."""
    n = min(n, len(prompts))
    if n < MIN_PROMPTS:
        raise InputError(f"The edge circuit needs at least {MIN_PROMPTS} correctly answered prompts (two per half), "
                         f"got {n}: raise --n-prompts / --circuit-prompts or use a stronger model.")
    shuffled = prompts.shuffle(seed=seed).select(range(n))
    half = n // 2
    return shuffled.select(range(half)), shuffled.select(range(half, n))


def curve_of(model: HookedTransformer, scores: Graph, prompts: Dataset, search: CircuitSearch,
             pool: Optional[Dataset], select: Optional[Callable] = None) -> FaithfulnessCurve:
    """The MIB faithfulness curve of the pruned top-n circuits of ``scores`` on ``prompts`` (or of a method's own
    selector ``select(scores, n)``)."""
    return faithfulness_curve(model, scores, prompts, ablation=search.ablation, means_from=pool,
                              select=select or mib_selector(scores.layout), n_bootstrap=search.n_bootstrap,
                              seed=search.seed, options=search.options())


def smallest_faithful(selection: FaithfulnessCurve, heldout: FaithfulnessCurve, threshold: float) -> Optional[dict]:
    """The smallest size whose f reaches ``threshold`` on the selection half, with its f on the held-out half."""
    fraction = selection.smallest_fraction(threshold)
    if fraction is None:
        return None
    i = selection.fractions.index(fraction)
    return {"fraction": fraction, "n_edges": selection.n_edges[i], "f_selection": selection.faithfulness[i].to_dict(),
            "f_heldout": heldout.faithfulness[i].to_dict(), "threshold": threshold}


def find_faithful_circuit(model: HookedTransformer, prompts: Dataset, search: CircuitSearch = CircuitSearch(), *,
                          scores: Optional[Graph] = None, stage=None) -> FaithfulCircuit:
    """Steps 1-4 of the module docstring on ``prompts`` (correctly answered ones).

    ``scores``: edge scores to use instead of scoring the selection half (they must not have
    seen the held-out half). ``stage(name)``: a context manager that times each step (e.g.
    ``Run.stage`` of :mod:`experiments.runtime.lifecycle`); none by default.
    """
    from contextlib import nullcontext

    stage = stage or (lambda name: nullcontext())
    selection, heldout = split_halves(prompts, search.circuit_prompts, search.seed)
    pool = means_pool(model, prompts, search)  # means from prompts that are none of the evaluated ones
    extra, warm, select = {}, None, None
    if scores is None:
        with stage(f"edge scores ({search.method})"):
            scored = score_selection(model, selection, search)
        scores, extra, warm, select = scored.scores, scored.info, scored.warm_scores, scored.select
    with stage("faithfulness curves"):
        curve_selection = curve_of(model, scores, selection, search, pool, select)
        curve_heldout = curve_of(model, scores, heldout, search, pool, select)
    smallest = smallest_faithful(curve_selection, curve_heldout, search.threshold)
    circuit = selected_circuit(scores, smallest["fraction"], select) if smallest else None
    return FaithfulCircuit(search, scores, selection, heldout, curve_selection, curve_heldout, smallest, circuit, extra,
                           warm, select)


@dataclass
class SelectionScores:
    """What :func:`score_selection` returns: the edge scores, what scoring took (``info``, results.json's
    ``method_info``), and a learned method's signed warm start (``warm_scores``: what a figure colours edges by)."""

    scores: Graph
    info: dict
    warm_scores: Optional[Graph] = None
    select: Optional[Callable] = None  # the method's own circuit selector (None: MIB's pruned top-n)


def score_selection(model: HookedTransformer, prompts: Dataset, search: CircuitSearch) -> SelectionScores:
    """Every edge scored on ``prompts`` by ``search.method`` (a searchable record of
    :data:`patching.edges.catalogue.CATALOGUE`: attribution, learned, consensus), through the same
    :func:`patching.edges.circuit_methods.score_method` as the comparison: an attribution method in a few backward
    passes, or a learned one (``search.learning``, its ``method`` replaced by the search's) warm-started from
    ``search.warm_start``'s attribution of the same prompts (None: a cold start)."""
    if search.method not in SEARCH_METHODS:
        raise InputError(f"Circuit search method {search.method!r} is none of {', '.join(SEARCH_METHODS)}: a search "
                         "scores with an attribution, a learned or the consensus method; compare the others with "
                         "compare_methods (experiments.circuit --methods ...).")
    started = time.perf_counter()
    run = ComparisonRun(model, prompts, Graph.from_model(model).layout, search, search.learning, search.warm_start,
                        bootstrap_resamples=0)
    scored, _ = score_method(run, CATALOGUE[search.method])
    info = {"seconds": round(time.perf_counter() - started, 1)} | scored.info
    return SelectionScores(scored.scores, info, scored.warm_scores, scored.select)


def score_summary(scores: Graph) -> dict:
    """Largest |score|, sum, signs, the reference metric and the top edges of a scored graph."""
    layout = scores.layout
    real = scores.scores[layout.real_edge_mask]
    order = torch.argsort(scores.scores.nan_to_num().abs().flatten(), descending=True, stable=True)[:TOP_EDGES_LISTED]
    top = [divmod(int(i), layout.n_backward) for i in order]
    return {"max_abs": float(real.abs().max()), "sum": float(real.sum()), "n_positive": int((real > 0).sum()),
            "n_negative": int((real < 0).sum()), "reference_metric": scores.meta.get("reference_metric"),
            "top_edges": [{"edge": layout.edge_name(f, b), "score": float(scores.scores[f, b])} for f, b in top]}


def _node_name(head: Head) -> str:
    return f"a{head.layer}.h{head.head}"


def key_head_relation(circuit: Graph, heads: Sequence[Head]) -> dict:
    """Which key heads the edge circuit holds (with their in-circuit edges in and out) and which it misses."""
    layout = circuit.layout
    edges = circuit.in_graph & layout.real_edge_mask
    nodes = nodes_in_graph(circuit).tolist()
    rows, missing = [], []
    for head in heads:
        f = layout.head_forward(head.layer, head.head)
        into = [layout.head_backward(head.layer, head.head, x) for x in "qkv"]
        row = {"head": str(head), "node": _node_name(head), "in_circuit": bool(nodes[f]),
               "edges_out": int(edges[f].sum()), "edges_in": int(edges[:, into].sum())}
        rows.append(row)
        if not row["in_circuit"]:
            missing.append(str(head))
    names = {_node_name(h) for h in heads}
    others = [name for name, kept in zip(layout.forward_names, nodes)
              if kept and name.startswith("a") and name not in names]
    return {"key_heads": [str(h) for h in heads], "rows": rows, "missing": missing,
            "n_key_heads_in_circuit": len(heads) - len(missing), "circuit_heads_not_key": others,
            "n_circuit_heads": sum(1 for name, kept in zip(layout.forward_names, nodes) if kept and name.startswith("a"))}


def key_heads_by_size(scores: Graph, heads: Sequence[Head], fractions: Sequence[float] = MIB_FRACTIONS) -> list[dict]:
    """At each curve size: the heads of the pruned top-n circuit, and which key heads are among them."""
    names = {_node_name(h): str(h) for h in heads}
    rows = []
    for fraction in fractions:
        circuit = select_fraction(scores, fraction)
        nodes = [n for n, kept in zip(scores.layout.forward_names, nodes_in_graph(circuit).tolist()) if kept]
        circuit_heads = [n for n in nodes if n.startswith("a")]
        rows.append({"fraction": fraction, "n_edges": int(circuit.in_graph.sum()), "n_heads": len(circuit_heads),
                     "key_heads": [names[n] for n in circuit_heads if n in names]})
    return rows


def circuit_heads(scores: Graph, n_heads: int, fraction: float = 0.05) -> list[Head]:
    """The ``n_heads`` heads holding the most in-circuit edge score in the top ``fraction`` circuit of ``scores``.

    A head's mass is the |score| of its in-circuit edges out of it and into its q, k and v inputs (ties in
    layer-then-head order); heads with no in-circuit edge are never chosen, so fewer than ``n_heads`` may
    come back. For precise SFT on the edge circuit's heads (:func:`finetune.train` ``heads=``).
    """
    layout = scores.layout
    if n_heads < 1:
        raise InputError(f"n_heads must be >= 1, got {n_heads}.")
    mask = select_top_n(scores, int(fraction * layout.n_edges), prune=False).in_graph
    weights = scores.scores.abs().nan_to_num(0.0) * mask
    mass = []
    for layer in range(layout.n_layers):
        for head in range(layout.n_heads):
            f = layout.head_forward(layer, head)
            inputs = [layout.head_backward(layer, head, x) for x in "qkv"]
            mass.append((float(weights[f].sum() + weights[:, inputs].sum()), Head(layer, head)))
    ranked = sorted((m for m in mass if m[0] > 0), key=lambda m: -m[0])  # stable: ties keep layer-head order
    return [head for _, head in ranked[:n_heads]]
