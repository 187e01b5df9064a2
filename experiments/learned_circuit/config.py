"""The settings of ``python -m experiments.learned_circuit``: one flag per field of :class:`LearnedCircuitConfig`.

Imports nothing heavy, so ``--help`` and flag errors answer before torch or TransformerLens load; the
learned-method names come from the torch-free :mod:`patching.edges.catalogue`.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

from circuits.errors import InputError
from experiments.runtime import cli
from experiments.runtime.cli import option
from experiments.runtime.settings import BatchSettings, RunSettings, ShotSettings, TaskSettings
from patching.edges.catalogue import CONSENSUS_RESAMPLING, LEARNED_METHODS


@dataclass(frozen=True)
class LearnedCircuitConfig(TaskSettings, BatchSettings, ShotSettings, RunSettings):
    """Every flag of ``python -m experiments.learned_circuit`` beyond :class:`RunSettings`, with its default."""

    op: str = option("+", "the operation: + - * / (or addition, subtraction, ...)")
    n_train: int = option(256, "correct prompts each circuit is learned on (per training set)", type=cli.positive_int)
    n_validation: int = option(128, "correct prompts the settings are chosen on", type=cli.positive_int)
    n_test: int = option(128, "correct prompts every reported number is measured on", type=cli.positive_int)
    max_shot_draws: int = option(4, "few-shot prefix draws tried before a split is left short",
                                 type=cli.positive_int)
    method: str = option("top-n", "the learned-circuit method swept and reported (patching.edges.learn)",
                         choices=LEARNED_METHODS)
    lrs: tuple[float, ...] = option((0.02,), "learning rates swept", type=cli.positive_float, nargs="+")
    temperatures: tuple[float, ...] = option((1.0,), "starting widths of the soft top-n swept (standard "
                                                         "deviations of the scores)", type=cli.positive_float, nargs="+")
    penalties: tuple[float, ...] = option((0.0, 1.0), "weights of the |1 - f| penalty swept", type=float, nargs="+")
    steps: tuple[int, ...] = option((100,), "optimisation steps of every learned circuit (several: swept)",
                                    type=cli.positive_int, nargs="+")
    learn_batch_size: tuple[int, ...] = option((4,), "prompts per optimisation step (several: swept)",
                                               type=cli.positive_int, nargs="+")
    samples: tuple[int, ...] = option((7,), "circuits per prompt per step (top-n: sizes drawn from its 7 default "
                                            "sizes; 7 = all of them; several: swept)", type=cli.positive_int, nargs="+")
    restarts: tuple[int, ...] = option((1,), "independent runs per circuit whose standardised scores are averaged "
                                             "(patching.edges.learn; several: swept)", type=cli.positive_int, nargs="+")
    consensus_runs: tuple[int, ...] = option((1,), "learned runs per circuit (above 1: the consensus circuit of that "
                                                   "many runs on resamples of the training set, "
                                                   "patching.edges.consensus; several: swept)",
                                             type=cli.positive_int, nargs="+")
    resampling: tuple[str, ...] = option(("half",), "the consensus runs' resamples of the training set (half-samples "
                                                    "or bootstraps; several: swept)",
                                         choices=CONSENSUS_RESAMPLING, nargs="+")
    equal_cost: bool = option(False, "a consensus of k runs trains each run --steps / k steps, so that every "
                                     "setting costs one learned run's steps (the consensus at the cost of one run)")
    warm_start_prompts: int = option(64, "training prompts the EAP-IG-inputs warm start is scored on (0: a cold "
                                         "start)", type=cli.nonnegative_int)
    baselines: bool = option(True, "also curve EAP-IG-inputs (the warm start) and matryoshka (same steps and prompts "
                                   "per step) on the test prompts")
    stability_sets: int = option(2, "disjoint training sets the chosen setting is learned on (1: no comparison "
                                    "across prompt sets)", type=cli.positive_int)
    sweep_stability: bool = option(True, "learn every swept setting on the second training set too, and add "
                                         "--stability-weight x (1 - the edge Jaccard of the two circuits at five "
                                         "percent of the edges) to the choice (training prompts only; needs "
                                         "--stability-sets >= 2)")
    stability_weight: float = option(1.0, "weight of 1 - that Jaccard in the sweep's choice (with --sweep-stability)",
                                     type=float)
    stability_seeds: tuple[int, ...] = option((), "further seeds the chosen setting is learned with on the first "
                                                  "set", type=int, nargs="+")
    n_bootstrap: int = option(1000, "bootstrap resamples over prompts for every interval", type=cli.positive_int)
    memory_mb: float = option(2048.0, "activation budget of one batched forward or backward (MB)",
                              type=cli.positive_float)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not math.isfinite(self.stability_weight) or self.stability_weight < 0:
            raise InputError(f"--stability-weight {self.stability_weight}: a weight is a finite number >= 0 (NaN makes "
                             "every setting's criterion NaN, and the first would be 'chosen').")
        if any(p < 0 for p in self.penalties):
            raise InputError(f"--penalties {self.penalties}: a penalty weight is >= 0.")
        if max(self.consensus_runs) > 1 and (self.method != "top-n" or max(self.restarts) > 1):
            raise InputError(f"--consensus-runs {' '.join(map(str, self.consensus_runs))} counts learned top-n runs, "
                             f"each learned once: use --method top-n and --restarts 1 with it (got --method "
                             f"{self.method}, --restarts {' '.join(map(str, self.restarts))}).")
        if len(set(self.stability_seeds)) != len(self.stability_seeds) or self.seed in self.stability_seeds:
            raise InputError(f"--stability-seeds {self.stability_seeds} repeat each other or --seed {self.seed}: "
                             "give seeds other than --seed, once each.")

    def grid(self) -> list[dict]:
        """Every swept setting: LearnConfig fields, the learned runs it counts and (several runs) their resampling."""
        counted = [{"runs": runs} | ({"resampling": how} if runs > 1 else {}) for runs in self.consensus_runs
                   for how in (self.resampling if runs > 1 else self.resampling[:1])]
        return [{"lr": lr, "temperature": t, "faithfulness_penalty": p, "steps": self.run_steps(steps, runs["runs"]),
                 "samples": samples, "batch_size": batch, "restarts": restarts} | runs
                for steps in self.steps for samples in self.samples for batch in self.learn_batch_size
                for restarts in self.restarts for runs in counted
                for lr in self.lrs for t in self.temperatures for p in self.penalties]

    def run_steps(self, steps: int, runs: int) -> int:
        """Each learned run's steps in a setting of ``runs`` runs: ``steps``, or with ``--equal-cost`` its share."""
        return max(steps // runs, 1) if self.equal_cost else steps

    def measures_sweep_stability(self) -> bool:
        """Whether every swept setting is also learned on the second training set (it needs one)."""
        return self.sweep_stability and self.stability_sets >= 2
