"""The settings of ``python -m experiments.merge``: one flag per field of :class:`MergeConfig`.

Imports nothing heavy, so ``--help`` and flag errors answer before torch or TransformerLens load: the
task, level and method names that ``finetune`` and ``merging`` own come from their torch-free catalogues
(:mod:`finetune.expert_task_names`, :mod:`merging.methods.catalogue`), the lists the library itself reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from circuits.errors import InputError
from experiments.runtime import cli
from experiments.runtime.cli import option
from experiments.runtime.settings import RunSettings
from finetune.expert_task_names import EXPERT_TASKS
from merging.methods.catalogue import DATA_FREE_METHODS, EXPERT_LIMITS, LEVELS

#: the experts' tasks, in order
TASKS = EXPERT_TASKS
#: the data-free merge methods, in the registry's order
METHODS = DATA_FREE_METHODS
#: the default comparison: every method that merges the experts of all TASKS
DEFAULT_METHODS = tuple(m for m in METHODS if EXPERT_LIMITS.get(m, len(TASKS)) >= len(TASKS))


@dataclass(frozen=True)
class MergeConfig(RunSettings):
    """Every flag of ``python -m experiments.merge``, with its default (model (the base), device, dtype,
    threads, seed, out and overwrite: :class:`experiments.runtime.RunSettings`; the seed draws the data splits
    and the training)."""

    experts_dir: str | None = option(None, "folder of the experts (<task>/ model dirs): those there are loaded, "
                                     "the missing ones trained and saved there (default: <out>/experts)")
    expert_method: str = option("full", "finetune method", choices=("full", "precise", "lora"))
    steps: int = option(16, "optimizer steps per expert", type=cli.positive_int)
    batch_size: int = option(8, "examples per optimizer step", type=cli.positive_int)
    micro_batch_size: int = option(8, "examples per forward/backward pass (gradients accumulate up to --batch-size)",
                                   type=cli.positive_int)
    lr: float = option(1e-5, "expert learning rate (full SFT with Adam: higher values blow up the loss at batch 8)",
                       type=cli.positive_float)
    n_train: int = option(128, "training examples per task", type=cli.positive_int)
    n_val: int = option(12, "validation prompts per task (baseline tuning)", type=cli.positive_int)
    n_test: int = option(24, "test prompts per task", type=cli.positive_int)
    n_shots: int = option(1, "few-shot examples per prompt", type=cli.nonnegative_int)
    mul_operands: str = option("1,9", "operand range of the mul task, 'lo,hi' (two-digit: '10,99')")
    max_number: int = option(30, "en_fr translates the numbers 0..max_number", type=cli.positive_int)
    n_test_numbers: int = option(9, "en_fr test numbers (disjoint from validation and training numbers)",
                                 type=cli.positive_int)
    n_val_numbers: int = option(6, "en_fr validation numbers", type=cli.positive_int)
    target_gain: float = option(0.0, "train each expert until its validation exact accuracy is >= the base's + this "
                                "(checked every --check-every steps, at most --steps steps; 0: train --steps steps)",
                                type=cli.fraction)
    check_every: int = option(8, "optimizer steps between validation checks of --target-gain", type=cli.positive_int)
    n_samples: int = option(16, "samples per task for the closed form (paper: 30)", type=cli.positive_int)
    cf_seeds: int = option(1, "closed-form repeats, each fitted on --n-samples training prompts drawn with its own seed",
                           type=cli.positive_int)
    cf_positions: str = option("all", "positions the closed-form least squares runs over: 'all' (every prompt token), "
                               "'answer' (the positions that predict an answer token) or 'all,answer'")
    cf_batch_size: int = option(4, "batch of the closed-form fit", type=cli.positive_int)
    levels: str = option(",".join(LEVELS), "closed-form levels to run ('': no closed form, circuit-aware included)")
    ta_lambdas: str = option("0.5,1.0", "task-arithmetic λ grid (val)")
    ties_densities: str = option("0.2,0.5", "TIES density grid (val)")
    heads: str | None = option(None, "key heads, e.g. L5H0,L9H1 (default: path patching)")
    k: int = option(4, "key heads per operation from path patching (their union over + and * is used)",
                    type=cli.positive_int)
    n_patch: int = option(12, "prompts per operation for path patching", type=cli.positive_int)
    linearity_samples: int = option(6, "samples per task for the linearity figure (0: skip)", type=cli.nonnegative_int)
    circuit_prompts: int = option(0, "the circuit column: each arithmetic expert's edge circuit on this many prompts, "
                                     "looked at inside every merge of all three (0: skip)", type=cli.nonnegative_int)
    linearity_alphas: str = option("0.5,1.0", "uniform α values of the linearity figure")
    pairs: bool = option(False, "also merge every pair of experts")
    eval_batch_size: int = option(12, "prompts per forward pass when scoring", type=cli.positive_int)
    config: str | None = option(None, "run this mergekit merge YAML instead (merge and save only)")
    markdown: str | None = option(None, "print the results tables of this run folder (its results.json) as markdown")
    methods: str = option(",".join(DEFAULT_METHODS), "data-free merge methods to run (comma-separated; "
                          "default: every method that merges all the tasks' experts, so not "
                          + ", ".join(sorted(EXPERT_LIMITS)) + ")")
    no_circuit_aware: bool = option(False, "skip circuit-aware merging (and the path patching that finds its key heads)")
    cf_repeat_levels: str = option("attn_mlp", "levels fitted for every --cf-seeds seed and --cf-positions choice; "
                                   "the other levels are fitted once (all positions, seed 0)")
    no_save_best: bool = option(False, "skip saving (and reloading) the best merge")
    no_base_test: bool = option(False, "score the base on the validation split only (it is the experts' reference)")
    late_methods: str = option("", "data-free methods (of --methods) run after the closed form, not before "
                               "(what matters first finishes first when a run may be cut short)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.config and self.markdown:
            raise InputError(f"--config {self.config} runs a mergekit YAML and --markdown {self.markdown} prints the "
                             "tables of an earlier run: give one of them.")
        for flag, given, allowed in (("--methods", self.methods, METHODS), ("--late-methods", self.late_methods,
                                     self.methods.split(",")), ("--levels", self.levels, LEVELS),
                                     ("--cf-repeat-levels", self.cf_repeat_levels, LEVELS)):
            unknown = [x for x in given.split(",") if x and x not in allowed]
            if unknown:
                raise InputError(f"{flag} {given}: {unknown} {'is' if len(unknown) == 1 else 'are'} not among "
                                 f"{','.join(allowed)}; give a comma-separated subset of them.")
        too_few = [m for m in self.methods.split(",") if EXPERT_LIMITS.get(m, len(TASKS)) < len(TASKS)]
        if too_few:
            limits = ", ".join(f"{m} merges at most {EXPERT_LIMITS[m]} expert(s)" for m in too_few)
            raise InputError(f"--methods {self.methods}: {limits}, and this comparison merges the {len(TASKS)} "
                             f"experts {', '.join(TASKS)}: leave "
                             f"{'it' if len(too_few) == 1 else 'them'} out (a mergekit YAML with --config runs fewer models).")
        n_train_numbers = self.max_number + 1 - self.n_test_numbers - self.n_val_numbers
        if n_train_numbers < self.n_shots + 1:  # the en_fr expert's numbers, split before any model loads
            raise InputError(f"--max-number {self.max_number} leaves {n_train_numbers} en_fr training numbers after "
                             f"--n-test-numbers {self.n_test_numbers} and --n-val-numbers {self.n_val_numbers}, but "
                             f"--n-shots {self.n_shots} needs {self.n_shots + 1}: give --max-number "
                             f"{self.n_test_numbers + self.n_val_numbers + self.n_shots} or more.")
