"""Every circuit method as one record: what it is, what it needs, where it comes from, its own settings, and where
its code lives.

A circuit method scores every edge of the graph on the selection half of the prompts (or chooses each size's
circuit from another method's scores). The command line (``experiments.circuit --methods``, ``--method``), the
comparison (:func:`patching.edges.compare.compare_methods`), stability (:mod:`patching.edges.stability`), the
prompt families (:mod:`patching.edges.families`) and the default search
(:func:`patching.edges.faithful_circuit.score_selection`) all read :data:`CATALOGUE`; nothing else lists the
methods' names.

This module imports neither torch nor the methods' code: a record names its implementation as a lazy
``"module:function"`` reference (a function ``score(run, name) -> MethodScores`` on a
:class:`patching.edges.circuit_methods.ComparisonRun`), resolved on first use, so a parser can offer the choices
and flags and answer ``--help`` before anything heavy loads.

A method with parameters of its own declares them as a frozen dataclass (``settings=``), mergekit's way: each
field's ``metadata["help"]`` (and ``"choices"``) becomes a flag ``--<flag_prefix>-<field>`` of every command that
offers the method, and the values reach the method through
:meth:`patching.edges.faithful_circuit.CircuitSearch.settings_for`. So a new method is one new file (its scoring
function) and one record here; docs/index.md, "A new circuit method", shows the file list.
"""

from __future__ import annotations

import math

import importlib
from dataclasses import dataclass, field, fields
from typing import Callable, Optional, Union

from circuits.errors import InputError

#: what a method is
KINDS = {
    "attribution": "edge scores from gradients (EAP, EAP-IG: patching.edges.attribute)",
    "exact": "every edge patched on its own (patching.edges.patch)",
    "learned mask": "a mask over the edges optimised on the selection half (patching.edges.learn)",
    "consensus": "learned masks on resamples of the selection half, each edge ranked by the share of runs that keep "
                 "it (patching.edges.consensus)",
    "ensemble": "the methods listed before it, combined (patching.edges.combine)",
    "resampled": "scores over resamples of the selection half, kept where their sign is stable",
    "selection": "each size's circuit chosen from another method's scores, not by |score| order",
    "position-aware": "edges between spans of the prompt layout (patching.edges.positions)",
    "greedy pruning": "edges removed one at a time from the full graph while the circuit stays close to the model "
                      "(patching.edges.acdc)",
}
#: the kinds a circuit search (``find_faithful_circuit``, ``--method``) can score with on its own: one scored graph
#: whose |score| order gives every size's circuit
SEARCH_KINDS = ("attribution", "learned mask", "consensus")

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

#: how the edges outside a circuit are ablated (:func:`patching.edges.evaluate.evaluate_circuit`)
ABLATIONS = ("counterfactual", "mean", "positional-mean", "zero")
#: what a learned circuit matches: the answer logit, or the END distribution
LEARN_OBJECTIVES = ("metric", "kl")
#: what an ACDC removal's damage measures
ACDC_OBJECTIVES = ("kl", "metric")


def _setting(default, help: str, choices: Optional[tuple] = None):
    """A settings field whose help (and choices) the command line reads."""
    return field(default=default, metadata={"help": help, **({"choices": choices} if choices else {})})


@dataclass(frozen=True)
class ACDCSettings:
    """ACDC's own parameters in a comparison (the rest of :class:`patching.edges.acdc.ACDCConfig` follows the
    search: its ablation, the sweep's batching)."""

    threshold: float = _setting(0.01, "ACDC's threshold τ: an edge stays removed when removing it does less damage "
                                      "than this (in the objective's units)")
    objective: str = _setting("kl", "what an ACDC removal's damage measures: 'kl' (the END distribution's KL from the "
                                    "full model grows) or 'metric' (the answer logit drops)", ACDC_OBJECTIVES)

    def __post_init__(self) -> None:
        if self.objective not in ACDC_OBJECTIVES:
            raise InputError(f"Unknown ACDC objective {self.objective!r}: use one of {ACDC_OBJECTIVES}.")
        check_acdc_threshold(self.threshold)


def check_acdc_threshold(threshold) -> float:
    """``threshold`` if it is a finite number >= 0, else an :class:`InputError`: a negative τ keeps every edge (no
    removal does less damage than it) and an infinite one none, both without a word."""
    number = isinstance(threshold, (int, float)) and not isinstance(threshold, bool)
    if not number or not math.isfinite(threshold) or threshold < 0:
        why = ": below 0 ACDC keeps every edge, at infinity none" if number else ""
        raise InputError(f"The ACDC threshold must be a finite number >= 0 (τ, in the objective's units; 0.01 by "
                         f"default), got {threshold!r}{why}.")
    return float(threshold)


CONSENSUS_RESAMPLING = ("half", "bootstrap")


@dataclass(frozen=True)
class ConsensusSettings:
    """The consensus circuit's own parameters: how many learned runs, on which resamples, how long each trains."""

    runs: int = _setting(4, "learned runs the consensus circuit counts (each on its own resample and seed)")
    resampling: str = _setting("half", "each run's prompts: 'half' (a half-sample without replacement, stability "
                                       "selection's classic choice) or 'bootstrap' (as many, drawn with replacement)",
                               CONSENSUS_RESAMPLING)
    steps: int = _setting(0, "optimisation steps of each run (0: the learned circuit's own --learn-steps)")

    def __post_init__(self) -> None:
        if not isinstance(self.runs, int) or self.runs < 1:
            raise InputError(f"The consensus circuit counts at least 1 run, got runs={self.runs!r}.")
        if self.resampling not in CONSENSUS_RESAMPLING:
            raise InputError(f"Unknown consensus resampling {self.resampling!r}: use one of {CONSENSUS_RESAMPLING}.")
        if not isinstance(self.steps, int) or self.steps < 0:
            raise InputError(f"Consensus steps must be an integer >= 0 (0: the learned circuit's), got {self.steps!r}.")


@dataclass(frozen=True)
class CircuitMethod:
    """One circuit method: its name, kind, needs, source, settings and implementation.

    ``implementation``: ``"module:function"`` (resolved on first use) or the function itself (a test's stub), a
    ``score(run, name) -> MethodScores``; ``settings``: the dataclass of the method's own parameters (None: it has
    none); ``flag_prefix``: the command-line prefix of those parameters (default: the name, lower case).
    """

    name: str
    kind: str  # one of KINDS
    implementation: Union[str, Callable]
    needs: tuple[str, ...] = (GRADIENTS, COUNTERFACTUALS)  # names in NEEDS
    source: str = ""  # the paper or code it follows
    settings: Optional[type] = None
    flag_prefix: str = ""
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
        if isinstance(self.implementation, str) and ":" not in self.implementation:
            raise TypeError(f"Circuit method {self.name!r}: implementation {self.implementation!r} is not "
                            "'module:function'.")

    @property
    def score(self) -> Callable:
        """The method's scoring function ``score(run, name) -> MethodScores``, imported on first use."""
        if callable(self.implementation):
            return self.implementation
        module, _, function = self.implementation.partition(":")
        return getattr(importlib.import_module(module), function)

    @property
    def searchable(self) -> bool:
        """A circuit search can score with this method alone (:data:`SEARCH_KINDS`)."""
        return self.kind in SEARCH_KINDS and not self.position_aware

    @property
    def prefix(self) -> str:
        """The command-line prefix of the method's settings: ``--<prefix>-<field>``."""
        return self.flag_prefix or self.name.lower().replace("-", "_")

    def default_settings(self):
        """The method's settings record with every default (None for a method without settings)."""
        return None if self.settings is None else self.settings()


_SCORING = "patching.edges.circuit_methods"
_ATTRIBUTION_SOURCES = {
    "EAP": "Syed et al. 2023, edge attribution patching",
    "EAP-IG-inputs": "Hanna et al. 2024, EAP with integrated gradients over the inputs",
    "EAP-IG-activations": "Hanna et al. 2024 (hannamw/EAP-IG), integrated gradients over each layer's activations",
    "clean-corrupted": "hannamw/EAP-IG, the mean of the reference and counterfactual gradients",
    "EAP-GP": "Zhang et al. 2025, EAP with GradPath, a gradient-steered integration path (arXiv 2502.06852)",
    "CEAP": "conductance EAP (arXiv 2606.16920): Dhamdhere et al. 2018's conductance along EAP-IG's path",
}
_LEARNED_SOURCES = {
    "edge-pruning": "Bhaskar et al. 2024, Edge Pruning (arXiv 2406.16778)",
    "ugs": "Mueller et al. 2025, MIB's uniform gradient sampling",
    "matryoshka": "random-budget (Matryoshka-style) masks: nested circuits faithful at every size",
    "top-n": "the hard top-n circuits at the reported sizes, learned straight-through (patching.edges.learn)",
}
_RECORDS = (
    *(CircuitMethod(name, "attribution", f"{_SCORING}:attribution_scores", source=source)
      for name, source in _ATTRIBUTION_SOURCES.items()),
    *(CircuitMethod(name, "learned mask", f"{_SCORING}:learned_scores", needs=(GRADIENTS, COUNTERFACTUALS, WARM_START),
                    source=source)
      for name, source in _LEARNED_SOURCES.items()),
    CircuitMethod("exact", "exact", f"{_SCORING}:exact_scores", needs=(COUNTERFACTUALS,),
                  source="exact edge patching, the ground truth attribution approximates"),
    CircuitMethod("ensemble", "ensemble", f"{_SCORING}:ensemble_scores", needs=(EARLIER_METHODS,),
                  source="mean of normalised rankings"),
    CircuitMethod("bootstrap", "resampled", f"{_SCORING}:resampled_scores",
                  source="Nikankin et al. 2025, sign-stable edges over bootstrap resamples (arXiv 2510.25786)"),
    CircuitMethod("ilp", "selection", f"{_SCORING}:ilp_scores", needs=(GRADIENTS, COUNTERFACTUALS, ILP_SOLVER),
                  source="Nikankin et al. 2025, an ILP that picks the edge set (arXiv 2510.25786)", keeps_scores=False),
    CircuitMethod("positional", "position-aware", f"{_SCORING}:positional_scores",
                  source="Haklay et al. 2025, position-aware edge attribution (PEAP, ACL)", keeps_scores=False,
                  position_aware=True),
    CircuitMethod("ACDC", "greedy pruning", f"{_SCORING}:acdc_scores", needs=(COUNTERFACTUALS,),
                  source="Conmy et al. 2023, automated circuit discovery (ACDC, NeurIPS)", settings=ACDCSettings),
    CircuitMethod("consensus", "consensus", "patching.edges.consensus:consensus_scores",
                  needs=(GRADIENTS, COUNTERFACTUALS, WARM_START), settings=ConsensusSettings,
                  source="Meinshausen & Bühlmann 2010, stability selection, over learned top-n runs; CIRCUS (arXiv "
                         "2603.00523) for the core / contingent split"),
)
#: every circuit method by name, in the order the command line and the errors list them
CATALOGUE: dict[str, CircuitMethod] = {r.name: r for r in _RECORDS}


def names_of_kind(*kinds: str) -> tuple[str, ...]:
    """The catalogue's names of these kinds, in catalogue order."""
    return tuple(name for name, record in CATALOGUE.items() if record.kind in kinds)


#: the attribution methods (``edge_attribution(method=)``, a learned method's warm start)
ATTRIBUTION_METHODS = names_of_kind("attribution")
#: the learned-mask methods (``LearnConfig.method``)
LEARNED_METHODS = names_of_kind("learned mask")
#: what a circuit search scores with (``CircuitSearch.method``, ``--method``)
SEARCH_METHODS = tuple(name for name, record in CATALOGUE.items() if record.searchable)


def check_method_names(methods, catalogue: Optional[dict] = None) -> None:
    """Refuse names that are not in the catalogue, listing the catalogued ones."""
    catalogue = CATALOGUE if catalogue is None else catalogue
    unknown = [m for m in methods if m not in catalogue]
    if unknown:
        raise InputError(f"Unknown circuit method(s) {unknown}: use any of {', '.join(catalogue)}.")


def catalogued(method: "str | CircuitMethod") -> CircuitMethod:
    """``method`` as a record: a :data:`CATALOGUE` name looked up (unknown names refused), a record passed through."""
    if isinstance(method, str):
        check_method_names([method])
        return CATALOGUE[method]
    return method


def settings_fields(record: CircuitMethod):
    """The dataclass fields of ``record``'s own settings (none for a method without settings)."""
    return () if record.settings is None else fields(record.settings)
