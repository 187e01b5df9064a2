"""Circuits across prompt families: one task's edge circuit found on each way of asking, tested on every other.

A task can be asked in several forms: the template styles of :mod:`circuits.templates` (``equation``
"3 + 4 = ", ``statement`` "The sum of 3 and 4 is ", ``question`` "Q: What is 3 plus 4? A: ",
``word_problem``) and the transfer formats of :func:`circuits.tasks.transfer_datasets` (``multi_digit``,
``decimal``, ``zero_shot``). If the model computes the task with one circuit, the circuit found on one
family should be as faithful on the others as their own circuits are; if each family has its own
circuit, it is not.

:func:`family_circuits` takes each family's prompts (e.g. the correctly answered ones of
:func:`family_prompts`) and, with one circuit method (a :data:`patching.edges.catalogue.CATALOGUE`
name or a :class:`~patching.edges.catalogue.CircuitMethod` record, scored as
:func:`~patching.edges.compare.compare_methods` scores it):

1. splits each family's prompts into a selection half and a held-out half
   (:func:`patching.edges.faithful_circuit.split_halves`, ``search.circuit_prompts`` prompts);
2. scores the edges on each family's selection half and takes its circuit at ``fraction`` of the edges
   (MIB's pruned top-n by |score|, or the method's own selector: ``selected_circuit``);
3. evaluates every family's circuit on every family's held-out half:
   f = (m(C) − m(∅)) / (m(full) − m(∅)) with the search's ablation (a mean ablation averages over the
   evaluated family's own prompts), and its 95% bootstrap interval over those prompts, exactly as
   :func:`patching.edges.curves.faithfulness_curve` gives a curve's point at that size (so a family's
   circuit on its own family is its own curve's point);
4. compares the families' own circuits by their edge Jaccard |A ∩ B| / |A ∪ B| at that size
   (:func:`circuits.graph_selection.edge_jaccard`, as :mod:`patching.edges.stability` compares prompt sets).

Read the f matrix by rows (whose circuit) against its diagonal: a row as high as the diagonal in every
column is a circuit that carries over; a column low everywhere but on the diagonal is a family the others'
circuits do not explain. :meth:`FamilyCircuits.figure` draws both matrices as heatmaps.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

from datasets import Dataset
from transformer_lens import HookedTransformer

from circuits.errors import InputError, InputKeyError
from circuits.graph import Graph
from circuits.graph_selection import edge_jaccard
from circuits.stats import Estimate
from circuits.tasks import TaskConfig, make_dataset, transfer_datasets
from circuits.templates import PROMPT_FAMILIES, STYLES, TRANSFER_FORMATS
from patching.edges.catalogue import CircuitMethod, catalogued
from patching.edges.circuit_methods import ComparisonRun, means_pool, score_method, selected_circuit
from patching.edges.curves import FaithfulnessCurve, faithfulness_curve
from patching.edges.faithful_circuit import CircuitSearch, split_halves
from patching.edges.learn import LearnConfig
from patching.edges.stability import why_not_measurable

#: the transfer formats of :func:`circuits.tasks.transfer_datasets` that are not a template style
TRANSFER_FAMILIES = tuple(f for f in TRANSFER_FORMATS if f not in STYLES)
#: every prompt family :func:`family_prompts` builds: the template styles, then the transfer formats
FAMILIES = PROMPT_FAMILIES


def check_families(families: Sequence[str]) -> list[str]:
    """``families`` as a list: at least two, no repeats, each one of :data:`FAMILIES`."""
    families = list(families)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise InputError(f"Unknown prompt families {unknown}: use any of {', '.join(FAMILIES)}.")
    if len(set(families)) != len(families):
        raise InputError(f"Prompt families {families} name one family twice; name each once.")
    if len(families) < 2:
        raise InputError(f"Circuits across prompt families compare at least two families, got {families}.")
    return families


def family_prompts(model, families: Sequence[str], task: TaskConfig = TaskConfig()) -> dict[str, Dataset]:
    """``task``'s prompts (its op, ``n_prompts``, ``n_shots``, operands, seed) in each family: a template style's
    (``make_dataset`` with that style alone) or a transfer format's (:func:`circuits.tasks.transfer_datasets`;
    ``word_problem`` is the style with ``task``'s operands)."""
    families = check_families(families)
    transfer = None
    out = {}
    for name in families:
        if name in STYLES:
            out[name] = make_dataset(model, task, styles=(name,), template_ids=None)
        else:
            if transfer is None:
                transfer = transfer_datasets(model, task.op, task.n_prompts, task.seed, task.n_shots)
            out[name] = transfer[name]
    return out


@dataclass
class FamilyCircuits:
    """What :func:`family_circuits` found (the module docstring); :meth:`to_dict` is results.json's form.

    ``cross[a][b]``: the one-point faithfulness curve of family ``a``'s circuit on family ``b``'s held-out half.
    """

    method: str
    fraction: float
    families: list[str]
    selection: dict[str, Dataset]
    heldout: dict[str, Dataset]
    scores: dict[str, Graph]
    circuits: dict[str, Graph]
    cross: dict[str, dict[str, FaithfulnessCurve]]

    def _check(self, family: str, role: str) -> None:
        if family not in self.families:
            raise InputKeyError(f"{role} {family!r} is not one of this result's families {self.families}.")

    def f(self, circuit_family: str, prompt_family: str) -> Estimate:
        """The faithfulness of ``circuit_family``'s circuit on ``prompt_family``'s held-out prompts."""
        self._check(circuit_family, "circuit_family")
        self._check(prompt_family, "prompt_family")
        return self.cross[circuit_family][prompt_family].faithfulness[0]

    def jaccard(self, a: str, b: str) -> float:
        """The edge Jaccard of the circuits of families ``a`` and ``b`` (1 for a family with itself)."""
        self._check(a, "family")
        self._check(b, "family")
        return edge_jaccard(self.circuits[a].in_graph, self.circuits[b].in_graph)

    def to_dict(self) -> dict:
        """results.json's ``templates`` entry (docs/results_json.md): rows are the circuits' families, columns the
        prompts' families."""
        fams = self.families
        own = {b: self.cross[b][b] for b in fams}
        return {
            "method": self.method, "fraction": self.fraction, "families": fams,
            "n_total_edges": self.scores[fams[0]].layout.n_edges,
            "n_selection": {f: len(self.selection[f]) for f in fams},
            "n_heldout": {f: len(self.heldout[f]) for f in fams},
            "circuit_edges": {f: int(self.circuits[f].in_graph.sum()) for f in fams},
            "f": {a: {b: self.f(a, b).to_dict() for b in fams} for a in fams},
            "jaccard": {a: {b: self.jaccard(a, b) for b in fams} for a in fams},
            "full_metric": {b: own[b].full.to_dict() for b in fams},
            "empty_metric": {b: own[b].empty.to_dict() for b in fams},
            "ablation": own[fams[0]].ablation,
        }

    def figure(self, title: Optional[str] = None):
        """Heatmaps of f (circuit family × prompt family) and of the circuits' edge Jaccard."""
        from circuits.show.edge_figures import family_transfer_figure

        return family_transfer_figure(self.to_dict(), title=title)


def family_circuits(model: HookedTransformer, prompts: Mapping[str, Dataset], method: Union[str, CircuitMethod],
                    search: CircuitSearch = CircuitSearch(), *, fraction: float = 0.05,
                    learn: Optional[LearnConfig] = None, warm_start: Optional[str] = "EAP-IG-inputs",
                    bootstrap_resamples: int = 10, stage=None, log=print) -> FamilyCircuits:
    """Each family's circuit from ``method`` at ``fraction`` of the edges, evaluated on every family (the module
    docstring).

    ``prompts``: family name (:data:`FAMILIES`) -> its prompts, at least ``patching.edges.faithful_circuit.MIN_PROMPTS``
    each (the correctly answered ones, as MIB evaluates). ``method``: a name in
    :data:`patching.edges.catalogue.CATALOGUE` or a :class:`CircuitMethod` record (e.g. a test's stub). ``learn``, ``warm_start``, ``bootstrap_resamples``: as in
    :func:`patching.edges.compare.compare_methods`. ``stage(name)``: a context manager the whole
    measurement runs in; ``log``: one line per family and one per circuit evaluated.
    """
    families = check_families(list(prompts))
    method = catalogued(method)
    refusal = why_not_measurable(method)
    if refusal:
        raise InputError(f"Circuit method {method.name!r} cannot be compared across prompt families: {refusal}.")
    if not 0 < fraction <= 1:
        raise InputError(f"fraction={fraction}: the circuit's size is a fraction of the edges in (0, 1].")
    learn = learn or search.learning
    layout = Graph.from_model(model).layout
    stage = stage or (lambda name: nullcontext())
    with stage(f"circuits of {method.name} across prompt families"):
        selection, heldout, scores, circuits, pools = {}, {}, {}, {}, {}
        for name in families:
            selection[name], heldout[name] = split_halves(prompts[name], search.circuit_prompts, search.seed)
            run = ComparisonRun(model, selection[name], layout, search, learn, warm_start, bootstrap_resamples)
            scored, _ = score_method(run, method)
            scores[name] = scored.scores
            circuits[name] = selected_circuit(scored.scores, fraction, scored.select)
            pools[name] = means_pool(model, prompts[name], search)
            log(f"{name:14s} {method.name}: {int(circuits[name].in_graph.sum())} edges at {100 * fraction:g}% "
                f"({len(selection[name])} selection prompts)")
        cross = {a: {} for a in families}
        for a in families:
            mask = circuits[a].in_graph
            for b in families:
                cross[a][b] = faithfulness_curve(
                    model, circuits[a], heldout[b], fractions=[fraction], ablation=search.ablation,
                    means_from=pools[b], select=lambda _scores, _n, mask=mask: mask, n_bootstrap=search.n_bootstrap,
                    seed=search.seed, options=search.options(False))
                point = cross[a][b].faithfulness[0]
                log(f"circuit of {a:14s} on {b:14s}: f = {point.value:.3f} [{point.low:.3f}, {point.high:.3f}]")
    return FamilyCircuits(method.name, float(fraction), families, selection, heldout, scores, circuits, cross)
