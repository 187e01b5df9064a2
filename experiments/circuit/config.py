"""The settings of ``python -m experiments.circuit``: one flag per field of :class:`CircuitConfig`.

Imports nothing heavy, so ``--help`` and flag errors answer before torch or TransformerLens load: the method names,
ablations and each method's own parameters come from the torch-free :mod:`patching.edges.catalogue` (a method's
settings fields become flags ``--<method>-<field>``), the prompt families from :mod:`circuits.templates`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from circuits.errors import InputError
from experiments.runtime import cli
from experiments.runtime.cli import option
from circuits.templates import PROMPT_FAMILIES
from experiments.runtime.settings import (BatchSettings, LearnSettings, PromptSettings, RunSettings, TaskSettings,
                                          project)
from patching.edges.catalogue import ABLATIONS, CATALOGUE, SEARCH_METHODS

if TYPE_CHECKING:
    from patching.edges import CircuitSearch, LearnConfig

#: one flag per parameter a catalogued circuit method declares (``--acdc-threshold``, ``--consensus-runs``, ...)
MethodFlags = cli.method_settings_flags(CATALOGUE, "MethodFlags")


@dataclass(frozen=True)
class CircuitConfig(MethodFlags, TaskSettings, LearnSettings, BatchSettings, PromptSettings, RunSettings):
    """Every flag of ``python -m experiments.circuit`` beyond :class:`RunSettings`, with its default."""

    op: str = option("+", "the operation: + - * / (or addition, subtraction, ...)")
    circuit_prompts: int = option(64, "correct prompts used, split in half: scores and size chosen on one half, "
                                      "reported on the other", type=cli.positive_int)
    method: str = option("top-n", "the circuit method (patching.edges.catalogue.SEARCH_METHODS): top-n, the "
                                  "learned straight-through top-n warm-started from --warm-start, by default; "
                                  "EAP-IG-inputs for the attribution circuit alone", choices=SEARCH_METHODS)
    ig_steps: int = option(5, "integration steps (path points) of EAP-IG, EAP-GP and CEAP", type=cli.positive_int)
    ablation: str = option("counterfactual", "how edges outside the circuit are ablated (patching.edges.evaluate_circuit)",
                           choices=ABLATIONS)
    threshold: float = option(0.8, "the faithfulness the smallest circuit must reach", type=cli.fraction)
    top_k: int = option(8, "node-level key heads from path patching to relate the circuit to (0: skip path patching)",
                        type=cli.nonnegative_int)
    pool_prompts: int = option(256, "prompts (none of them evaluated) the mean ablations average over; unused by "
                                    "counterfactual", type=cli.positive_int)
    n_bootstrap: int = option(1000, "bootstrap resamples over prompts for every interval", type=cli.positive_int)
    memory_mb: float = option(1024.0, "activation budget of one batched forward or backward (MB)",
                              type=cli.positive_float)
    methods: tuple[str, ...] = option((), "compare these circuit methods on the same halves instead of --method alone: "
                                          + ", ".join(CATALOGUE), nargs="+", choices=tuple(CATALOGUE))
    bootstrap_resamples: int = option(10, "prompt resamples of the 'bootstrap' method", type=cli.positive_int)
    learn_target_fraction: float = option(0.05, "edge-pruning: the fraction of edges to keep",
                                          type=cli.fraction)
    learn_min_fraction: float = option(0.001, "matryoshka: the smallest budget drawn, as a "
                                                                 "fraction of the edges", type=cli.fraction)
    stability_sets: int = option(2, "with --methods: disjoint prompt sets of circuit_prompts // 2 each every method "
                                    "is run on, to compare their circuits (0: skip; else at least 2)",
                                 type=cli.nonnegative_int)
    stability_seeds: tuple[int, ...] = option((), "seeds a learned or resampled method runs with on each stability "
                                                  "set (default: --seed only)", type=int, nargs="+")
    templates: tuple[str, ...] = option((), "also find the --method circuit on each of these prompt families (at least "
                                            "two) and evaluate each on every other: " + ", ".join(PROMPT_FAMILIES),
                                        nargs="+", choices=PROMPT_FAMILIES)
    templates_size: float = option(0.05, "with --templates: the circuits' size, as a fraction of the edges",
                                   type=cli.fraction)
    variables: str = option("", "the run folder of python -m experiments.variables --circuit: its per-node IIA "
                                "goes into the circuit explorer's node hover")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.templates and not self.arithmetic:
            raise InputError(f"--templates compares arithmetic prompt families; --task {self.task} has none: drop "
                             "--templates.")
        if self.templates and (len(self.templates) < 2 or len(set(self.templates)) != len(self.templates)):
            raise InputError(f"--templates {' '.join(self.templates)}: name at least two different prompt families "
                             "to compare their circuits (e.g. --templates equation statement question).")
        if self.templates and self.templates_size == 0:
            raise InputError("--templates-size 0 selects no edge: give a fraction of the edges in (0, 1], e.g. 0.05.")
        if self.variables:
            self._check_variables()
        if len(set(self.stability_seeds)) != len(self.stability_seeds):
            raise InputError(f"--stability-seeds {' '.join(map(str, self.stability_seeds))} repeats a seed: a run "
                             "paired with itself adds a Jaccard of 1 to the stability. Give each seed once.")
        if not self.methods or not self.stability_sets:
            return
        if self.stability_sets < 2:
            raise InputError(f"--stability-sets {self.stability_sets}: stability compares the circuits of at least "
                             "2 disjoint prompt sets; give 2 or more, or 0 to skip it.")
        needed = self.stability_prompts_needed()
        if needed > self.n_prompts:
            raise InputError(f"--stability-sets {self.stability_sets} needs {needed} correct prompts (that many sets "
                             f"and a held-out set of --circuit-prompts // 2 = {self.circuit_prompts // 2} each), more "
                             f"than --n-prompts {self.n_prompts} samples: raise --n-prompts, or lower --stability-sets "
                             "or --circuit-prompts.")

    def _check_variables(self) -> None:
        """``--variables``: a readable run of experiments.variables (checked before any model loads), for the one
        circuit the explorer draws."""
        from experiments.runtime.node_info import read_variables_rows

        if self.methods:
            raise InputError(f"--variables {self.variables} adds IIA to the explorer of one circuit; --methods "
                             "compares methods and draws none: drop one of them.")
        read_variables_rows(self.variables)

    def stability_prompts_needed(self) -> int:
        """``patching.edges.stability.stability_prompts_needed`` of these flags: the sets and the held-out set."""
        return (self.stability_sets + 1) * (self.circuit_prompts // 2)

    def search(self) -> CircuitSearch:
        """The settings of :func:`patching.edges.faithful_circuit.find_faithful_circuit` these flags describe."""
        from patching.edges import CircuitSearch

        return project(self, CircuitSearch, warm_start=self.warm_start_method(), learning=self.learn(),
                       method_settings=cli.method_settings_records(self, CATALOGUE))

    def learn(self) -> LearnConfig:
        """The learned methods' settings (:class:`patching.edges.learn.LearnConfig`) these flags describe."""
        return self.learn_config(target_fraction=self.learn_target_fraction, min_fraction=self.learn_min_fraction)
