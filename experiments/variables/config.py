"""The settings of ``python -m experiments.variables``: one flag per field of :class:`VariablesConfig`.

Imports nothing heavy, so ``--help`` and flag errors answer before torch or TransformerLens load: the task
names and featurizer kinds offered come from :mod:`patching.variables.catalogue`, which imports no torch, so a
causal model or featurizer recorded there is a choice here with no edit.
"""

from __future__ import annotations

import math

from pathlib import Path
from dataclasses import dataclass
from typing import Mapping

from circuits.errors import InputError
from experiments.runtime import cli
from experiments.runtime.cli import option, override
from experiments.runtime.settings import BatchSettings, PromptSettings, RunSettings
from patching.variables import catalogue


def featurizer_choices(featurizers: Mapping[str, catalogue.FeaturizerRecord] | None = None) -> tuple[str, ...]:
    """The kinds ``--featurizers`` offers: every featurizer of ``featurizers`` (default: the catalogue's) but the
    baseline, the full vector, which always runs."""
    featurizers = catalogue.FEATURIZERS if featurizers is None else featurizers
    return tuple(name for name in featurizers if name != catalogue.BASELINE)


#: the causal models ``--task`` offers (:data:`patching.variables.catalogue.CAUSAL_MODELS`)
TASKS = tuple(catalogue.CAUSAL_MODELS)
#: the featurizers ``--featurizers`` offers (:func:`featurizer_choices`)
FEATURIZERS = featurizer_choices()
#: those a run fits unless told: DAS and its null, and PCA (DBM, a learned mask, is fitted when named: it costs a
#: DAS run and decides no verdict)
DEFAULT_FEATURIZERS = tuple(name for name in FEATURIZERS if name != "dbm")


#: where a run folder of ``experiments.circuit`` or the main job keeps its edge circuit (EAP-IG graph JSON)
CIRCUIT_IN_RUN = "edge_circuit/circuit.json"


def circuit_file(path: str) -> Path:
    """``--circuit``'s graph JSON: the file itself, or a run folder's :data:`CIRCUIT_IN_RUN`."""
    given = Path(path)
    if given.is_dir():
        inside = given / CIRCUIT_IN_RUN
        if not inside.is_file():
            raise InputError(f"--circuit {path}: the folder holds no {CIRCUIT_IN_RUN} (a run of experiments.circuit or "
                             "the main job writes it when it finds a circuit). Give such a run folder or an EAP-IG "
                             "graph JSON.")
        return inside
    if not given.is_file():
        raise InputError(f"--circuit {path}: no such file or folder. Give an EAP-IG graph JSON or the run folder of "
                         "experiments.circuit or the main job.")
    return given


@dataclass(frozen=True)
class VariablesConfig(BatchSettings, PromptSettings, RunSettings):
    """Every flag of ``python -m experiments.variables``, with its default (model, device, dtype, threads, seed, out
    and overwrite: :class:`experiments.runtime.RunSettings`; the seed draws the prompts, the pairs, their split, the
    featurizers' initial rotations and the random-subspace null)."""

    task: str = option("+", "the causal model: one-digit a op b (+ - * /; the default, one-digit addition, is a task "
                            "gemma-3-270m answers) or two_digit_addition (MIB: 'The sum of AB and CD is'; gemma-3-270m "
                            "answers too few of its prompts to pair them)", choices=TASKS)
    variables: tuple[str, ...] = option((), "variables to test (default: the task's own: ones, ones_carry, tens for "
                                            "two_digit_addition; a, b and result for one digit, whose digits tens "
                                            "and ones are tested when named)")
    n_prompts: int = override(PromptSettings, "n_prompts", 160, "prompts sampled before keeping the correctly answered "
                                                               "ones (pairs are drawn among those)")
    n_pairs: int = option(256, "counterfactual pairs per variable, split train / validation / test (256: about 64 "
                               "test pairs, which resolve 0.2 above a random-subspace null near 0.03)",
                          type=cli.positive_int)
    n_controls: int = option(16, "control pairs per variable (the variable unchanged, the answer the base's)",
                             type=cli.positive_int)
    split: tuple[float, ...] = option((0.5, 0.25, 0.25), "train, validation and test fractions of the pairs",
                                      type=float)
    scoring: str = option("whole", "an answer is right when its first token (first) or every token, teacher-forced "
                                   "(whole), is top-1", choices=("first", "whole"))
    layers: tuple[int, ...] | None = option(None, "layers of the residual-stream sweep (default: every layer)",
                                            type=int, nargs="+")
    full_sweep: bool = option(False, "run every location of the sweep and every circuit node on all their pairs "
                                     "(default: one whose interval lies wholly below the best's after a batch of "
                                     "pairs stops there: patching.variables.interchange.iia_sweep(prune=True))")
    no_answer_span: bool = option(False, "do not also sweep END together with the answer positions after it "
                                         "(end+answer), where an answer of several tokens is read out")
    das_locations: int = option(1, "locations per variable for DAS and the other featurizers: the best by the full "
                                   "vector's validation IIA", type=cli.positive_int)
    featurizers: tuple[str, ...] = option(DEFAULT_FEATURIZERS, "featurizers fitted at those locations (the full "
                                                              "vector always runs)", choices=FEATURIZERS)
    ks: tuple[int, ...] = option((8, 64), "subspace sizes k tried by PCA, chosen on the validation pairs",
                                 type=cli.positive_int)
    das_ks: tuple[int, ...] = option((8,), "subspace sizes k tried by DAS, chosen on the validation pairs (8 won "
                                           "for a, b and the result on gemma-3-270m once DAS trained long enough: "
                                           "docs/results.md)", type=cli.positive_int)
    das_steps: tuple[int, ...] = option((30, 100), "optimiser steps of DAS per k: one run per k to the largest, "
                                                   "scored on the validation pairs after each count given, which is "
                                                   "chosen with k (DBM trains for the largest)", type=cli.positive_int)
    das_batch: int = option(16, "training pairs per DAS / DBM step", type=cli.positive_int)
    das_lr: float = option(0.01, "learning rate of DAS and DBM", type=cli.positive_float)
    nodes: tuple[str, ...] = option((), "circuit nodes to test (L3H1, MLP5, ...), each at the best position of each "
                                        "variable (default: every head and MLP)")
    circuit: str | None = option(None, "the circuit whose nodes are tested instead of --nodes: an EAP-IG graph JSON, "
                                       "or the run folder of experiments.circuit or the main job (its "
                                       f"{CIRCUIT_IN_RUN})")
    n_shots: int = override(PromptSettings, "n_shots", 3)

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.split) != 3 or not all(math.isfinite(f) and f > 0 for f in self.split) \
                or abs(sum(self.split) - 1) > 1e-6:
            raise InputError(f"--split {' '.join(map(str, self.split))}: give three positive fractions (train, "
                             "validation, test) that sum to 1, such as 0.5 0.25 0.25.")
        if self.nodes and self.circuit:
            raise InputError("--nodes and --circuit both name the circuit's nodes: give one of them.")
        if self.circuit:
            circuit_file(self.circuit)  # a missing file is refused before the model loads
        if self.nodes:  # as is a node name no model has
            from circuits import parse_node

            for name in self.nodes:
                parse_node(name)
