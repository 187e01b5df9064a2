"""The settings every experiment shares, declared once: :class:`RunSettings`.

An experiment's config is a frozen dataclass that extends :class:`RunSettings` with its own
fields; each field is also a command-line flag (:func:`experiments.runtime.cli.option`), so the
defaults and help texts live here, once, for every experiment. The prompts an experiment samples
(:class:`PromptSettings`) and its forward batch (:class:`BatchSettings`) are records of their own that a
config inherits where it has them:

    @dataclass(frozen=True)
    class CircuitConfig(BatchSettings, PromptSettings, RunSettings):
        op: str = option("+", "the operation: + - * / (or addition, subtraction, ...)")

This module imports neither torch nor TransformerLens, so a parser can be built (and ``--help``
answered) before anything heavy loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.runtime.cli import (DTYPES, check_choices, device, nonnegative_float, nonnegative_int, option,
                                     positive_float, positive_int)
from patching.edges.catalogue import ATTRIBUTION_METHODS, LEARN_OBJECTIVES

DEFAULT_MODEL = "gemma-3-270m"  # circuits.loading.DEFAULT_MODEL, without importing it


@dataclass(frozen=True)
class RunSettings:
    """Model, device, dtype, threads, seed, output folder and overwrite: the flags of every experiment."""

    model: str = option(DEFAULT_MODEL, "offline model name (gemma-3-270m, smollm2-135m), a TransformerLens model "
                                       "name, or a folder written by circuits.save_model")
    device: str = option("auto", "auto (CUDA when present, else CPU), cpu, cuda, cuda:N or mps", type=device)
    dtype: str | None = option(None, "weights' dtype (default: float32 on CPU, bfloat16 on CUDA)", choices=DTYPES)
    threads: int = option(0, "torch CPU threads (0: torch's default, every core; give 1 to each of two jobs "
                             "sharing a 2-core machine)", type=nonnegative_int)
    seed: int = option(0, "seed of everything random in the run: prompts, splits, random baselines, training",
                       type=int)
    out: str | None = option(None, "output folder (default: runs/<experiment>-<timestamp>)")
    overwrite: bool = option(False, "replace an earlier run of this toolkit in --out once this one completes (a "
                                    "folder the toolkit did not write is never replaced)")

    def __post_init__(self) -> None:
        check_choices(self)


@dataclass(frozen=True)
class TaskSettings:
    """``--task``: the task a circuit experiment studies instead of ``--op`` (the config declares ``op``).

    An operation's name (addition, subtraction, multiplication, division) sets ``op``; ``ioi`` and
    ``greater-than`` (:mod:`circuits.classic_tasks`) and the path of a prompt-pair file (:mod:`circuits.pair_tasks`,
    checked here, before any model loads) are pair tasks, scored by their own metric.
    """

    task: str = option("", "the task instead of --op: addition, subtraction, multiplication, division, ioi, "
                           "greater-than, or the path of a prompt-pair file (CSV or JSON lines: clean, corrupted and "
                           "correct_idx/incorrect_idx or answer/distractor; circuits.pair_tasks)")

    def __post_init__(self) -> None:
        getattr(super(), "__post_init__", lambda: None)()
        if not self.task:
            return
        from circuits.classic_tasks import ARITHMETIC_TASKS, task_kind
        from circuits.errors import InputError
        from circuits.templates import resolve_operation

        kind = task_kind(self.task)
        if kind == "arithmetic":
            if self.op != "+" and resolve_operation(self.op).symbol != ARITHMETIC_TASKS[self.task]:
                raise InputError(f"--task {self.task} and --op {self.op} name two operations: give one of them.")
            object.__setattr__(self, "op", ARITHMETIC_TASKS[self.task])
        elif kind == "file":
            from circuits.pair_tasks import read_pair_rows

            read_pair_rows(self.task)

    @property
    def arithmetic(self) -> bool:
        """Whether the prompts come from circuits.tasks (an operation) rather than a pair task."""
        from circuits.classic_tasks import ARITHMETIC_TASKS

        return not self.task or self.task in ARITHMETIC_TASKS

    @property
    def task_name(self) -> str:
        """The run's task: the operation's name for arithmetic, else ``--task`` (a file by its stem)."""
        from pathlib import Path

        from circuits.classic_tasks import CLASSIC_TASKS
        from circuits.templates import resolve_operation

        if self.arithmetic:
            return resolve_operation(self.op).name
        return self.task if self.task in CLASSIC_TASKS else Path(self.task).stem


@dataclass(frozen=True)
class ShotSettings:
    """How many solved examples precede each task prompt, and the task those prompts are drawn from.

    :meth:`task_config` is the one place an experiment's prompt flags become a :class:`circuits.tasks.TaskConfig`
    (with the config's ``op`` and ``seed`` where it has them), so no experiment builds one field by field.
    """

    n_shots: int = option(3, "solved examples before each prompt", type=nonnegative_int)

    def task_config(self, **overrides):
        """These flags (and ``op``, ``seed``, ``n_prompts`` where the config has them) as a
        :class:`circuits.tasks.TaskConfig`; ``overrides`` replace fields."""
        from circuits.tasks import TaskConfig

        return project(self, TaskConfig, **overrides)


@dataclass(frozen=True)
class PromptSettings(ShotSettings):
    """How many task prompts an experiment samples, and (:class:`ShotSettings`) the solved examples before each.

    A config inherits it beside :class:`RunSettings` (``class LoopConfig(BatchSettings, PromptSettings,
    RunSettings)``), so the flags, their checks and their help are declared here once; an experiment whose
    prompts differ changes a default with :func:`experiments.runtime.cli.override`.
    """

    n_prompts: int = option(200, "prompts sampled before keeping the correctly answered ones", type=positive_int)


@dataclass(frozen=True)
class BatchSettings:
    """How many prompts one forward pass takes (a training step's examples are another setting)."""

    batch_size: int = option(32, "prompts per forward pass", type=positive_int)


def project(source, target: type, *, prefix: str = "", **overrides):
    """A ``target`` dataclass built from the fields of ``source`` that it shares by name (plus ``overrides``).

    An experiment's flags and a library's settings record use the same names (``seed``, ``batch_size``,
    ``threshold``, ...), so handing settings on is one call instead of a field-by-field copy. With
    ``prefix``, the target's field ``x`` is read from the source's ``prefix + x`` (``learn_steps`` -> ``steps``),
    for a record whose names would clash with the experiment's own.
    """
    import dataclasses

    fields = [f for f in dataclasses.fields(target) if f.init]
    shared = {f.name: getattr(source, prefix + f.name) for f in fields if hasattr(source, prefix + f.name)}
    for f in fields:  # a record inside the target (a search's SweepOptions) is handed on the same way
        if f.name not in shared and f.name not in overrides and dataclasses.is_dataclass(f.default):
            shared[f.name] = dataclasses.replace(f.default, **{name: value for name, value in
                                                              vars(project(source, type(f.default))).items()
                                                              if hasattr(source, name)})
    return target(**{**shared, **overrides})


@dataclass(frozen=True)
class LearnSettings:
    """How a learned circuit is trained: the flags of :class:`patching.edges.learn.LearnConfig` that experiments
    expose, with the defaults of :data:`patching.edges.learn.DEFAULT_CIRCUIT` (written out here, so that a parser
    builds without torch; tests/experiments/runtime/test_settings.py keeps them equal)."""

    warm_start: str = option("EAP-IG-inputs", "scores a learned circuit starts from ('none': a cold start)",
                             choices=ATTRIBUTION_METHODS + ("none",))
    learn_objective: str = option("metric", "what a learned circuit matches: 'metric' (the answer logit) or 'kl' "
                                            "(the END distribution)", choices=LEARN_OBJECTIVES)
    learn_steps: int = option(100, "optimisation steps of a learned circuit", type=positive_int)
    learn_lr: float | None = option(None, "learning rate of a learned circuit, Adam's (default: the method's own, "
                                          "patching.edges.mask_samplers.DEFAULT_LR)", type=positive_float)
    learn_batch_size: int = option(4, "prompts per step of a learned circuit", type=positive_int)
    learn_samples: int = option(7, "circuits per prompt per step (top-n: sizes, 7 = every one; or gates, UGS "
                                   "samples, budgets)",
                                type=positive_int)
    learn_faithfulness_penalty: float = option(1.0, "weight of |1 - f| of every circuit on a step's prompts, added "
                                                     "to a learned circuit's loss", type=nonnegative_float)
    learn_restarts: int = option(1, "runs of a learned circuit with their own seeds, their standardised scores "
                                    "averaged", type=positive_int)

    def learn_config(self, **overrides):
        """These flags as a :class:`patching.edges.learn.LearnConfig` (the top-n method, the run's seed, no progress
        bar; ``overrides`` replace fields)."""
        from patching.edges import LearnConfig

        return project(self, LearnConfig, prefix="learn_", **({"method": "top-n", "seed": self.seed, "progress": False}
                                                               | overrides))

    def warm_start_method(self) -> str | None:
        """``--warm-start`` as the library takes it (None: a cold start)."""
        return None if self.warm_start == "none" else self.warm_start

    def learned_search(self, **fields):
        """The :class:`patching.edges.faithful_circuit.CircuitSearch` of the default learned circuit with these
        flags' warm start, learning settings and seed (``fields``: the search's other settings)."""
        from patching.edges import CircuitSearch

        return CircuitSearch(**({"method": "top-n", "warm_start": self.warm_start_method(),
                                 "learning": self.learn_config(), "seed": self.seed} | fields))
