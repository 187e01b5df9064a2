"""Several circuit methods side by side: :func:`compare_methods`.

The smallest-faithful-circuit procedure of :mod:`patching.edges.faithful_circuit` for every method named (records of
:data:`patching.edges.catalogue.CATALOGUE`): the same selection half scored through
:func:`patching.edges.circuit_methods.score_method`, the same two halves curved, each method's time counted apart,
each row paired against the first method on the same held-out prompts.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from datasets import Dataset
from transformer_lens import HookedTransformer

from circuits.graph import Graph
from circuits.graph_selection import mib_selector
from patching.edges.catalogue import CATALOGUE, check_method_names
from patching.edges.circuit_methods import ComparisonRun, means_pool, score_method, selected_circuit
from patching.edges.curves import faithfulness_curve, paired_curve_difference
from patching.edges.faithful_circuit import CircuitSearch, FaithfulCircuit, smallest_faithful, split_halves


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
    """Every method in ``methods`` (names in :data:`patching.edges.catalogue.CATALOGUE`) scored on the same selection half and curved on
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
        method = CATALOGUE[name]
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
