"""Circuit prompts at scale: every problem of a task, kept where the model answers it, split three ways.

A circuit learned on 16 or 32 prompts fits those prompts (docs/results.md): its settings cannot be chosen
and its numbers cannot be reported on the same few. :func:`correct_prompt_splits` builds the pool the
learned circuits need:

* **every problem**: each (template, a, b) of the operation's templates and operand range, once
  (:func:`circuits.tasks.every_problem`), not a sample;
* **checked correct**: a prompt is kept only where the model's top-1 first answer token is right
  (:func:`circuits.answer_scoring.first_token_hits`);
* **split by problem**: the problems are shuffled (seeded) and dealt to *train*, *validation* and *test*
  in proportion to the sizes asked for, so no problem (template and operands) is in two splits;
* **more shot draws where a split is short**: the same problems again with another few-shot prefix
  (draw ``d`` seeds the prefix of every template with ``f"{seed}/{d}/{template}"``; draw 0 is
  :func:`circuits.tasks.make_dataset`'s prefix), until each split holds its size or ``max_shot_draws``
  draws are used. A prompt's problem stays in its split whatever its prefix.

Settings are chosen on *validation*, numbers are reported on *test*, circuits are trained on *train*.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from datasets import Dataset, concatenate_datasets

from circuits.errors import InputError, TaskDataError
from circuits.tasks import TaskConfig, every_problem
from circuits.templates import resolve_operation

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
#: prompts per split by default: learned circuits train on 256, settings are chosen on 128, numbers reported on 128
SPLIT_SIZES = (256, 128, 128)


def problem_key(row: dict) -> tuple[str, str, str]:
    """What makes two prompts the same problem whatever their few-shot prefix: template and operands."""
    return row["template_id"], row["a"], row["b"]


@dataclass
class PromptSplits:
    """Correct prompts in three problem-disjoint splits (module docstring), and how they were found."""

    train: Dataset
    validation: Dataset
    test: Dataset
    sizes: tuple[int, int, int]  # the sizes asked for
    n_checked: int  # prompts the model answered (every problem, per shot draw used)
    n_correct: int  # of them, answered correctly
    shot_draws: int  # few-shot prefix draws used

    @property
    def accuracy(self) -> float:
        return self.n_correct / self.n_checked if self.n_checked else float("nan")

    @property
    def short(self) -> dict[str, int]:
        """The splits holding fewer prompts than asked for, with how many they hold."""
        return {name: len(split) for name, split, size in zip(SPLITS, self.splits(), self.sizes) if len(split) < size}

    def splits(self) -> tuple[Dataset, Dataset, Dataset]:
        return self.train, self.validation, self.test

    def to_dict(self) -> dict:
        return {"sizes": dict(zip(SPLITS, map(len, self.splits()))), "asked": dict(zip(SPLITS, self.sizes)),
                "n_checked": self.n_checked, "n_correct": self.n_correct, "accuracy": self.accuracy,
                "shot_draws": self.shot_draws, "short": self.short}


def correct_prompt_splits(
    model,
    config: TaskConfig = TaskConfig(),
    sizes: Sequence[int] = SPLIT_SIZES,
    *,
    max_shot_draws: int = 4,
    batch_size: int = 32,
    hits: Optional[Callable[[object, Dataset, int], list[bool]]] = None,
) -> PromptSplits:
    """Correct prompts of every problem of ``config``, split train / validation / test (module docstring).

    ``sizes``: prompts per split (train, validation, test). ``hits(model, dataset, batch_size)``: which rows the
    model answers correctly (default :func:`circuits.answer_scoring.first_token_hits`). A split that is still
    short after ``max_shot_draws`` draws keeps what it has (see :attr:`PromptSplits.short`; a warning says so).
    """
    sizes = tuple(int(n) for n in sizes)
    if len(sizes) != 3 or any(n < 1 for n in sizes):
        raise InputError(f"sizes must be three positive prompt counts (train, validation, test), got {sizes}.")
    if max_shot_draws < 1:
        raise InputError(f"max_shot_draws must be >= 1, got {max_shot_draws}.")
    if hits is None:
        from circuits.answer_scoring import first_token_hits as hits  # scoring needs TransformerLens; the data does not

    candidates = every_problem(model, config, 0)
    problems = sorted({problem_key(row) for row in candidates})
    random.Random(f"splits/{config.seed}").shuffle(problems)
    total = sum(sizes)
    bounds = [round(len(problems) * sum(sizes[:i + 1]) / total) for i in range(3)]
    split_of = {key: next(i for i, end in enumerate(bounds) if position < end) for position, key in enumerate(problems)}
    kept: list[list[int]] = [[], [], []]
    parts, n_checked, offset, draws = [], 0, 0, 0
    for draw in range(max_shot_draws):
        dataset = candidates if draw == 0 else every_problem(model, config, draw)
        wanted = [i for i in range(3) if len(kept[i]) < sizes[i]]
        if not wanted:
            break
        owner = [split_of[problem_key(row)] for row in dataset.select_columns(["template_id", "a", "b"]).to_list()]
        rows = [j for j, i in enumerate(owner) if i in wanted]
        dataset = dataset.select(rows)
        for j, (ok, row) in enumerate(zip(hits(model, dataset, batch_size), rows)):
            if ok:
                kept[owner[row]].append(offset + j)
        parts.append(dataset)
        n_checked, offset, draws = n_checked + len(dataset), offset + len(dataset), draw + 1
    pool = concatenate_datasets(parts)
    rng = random.Random(f"split-order/{config.seed}")
    splits = []
    for i in range(3):
        rng.shuffle(kept[i])
        splits.append(pool.select(kept[i][:sizes[i]]))
    result = PromptSplits(*splits, sizes=sizes, n_checked=n_checked, n_correct=sum(map(len, kept)), shot_draws=draws)
    if not result.n_correct:
        raise TaskDataError(f"The model answers none of the {n_checked} {resolve_operation(config.op).name} prompts "
                            "correctly, so no circuit prompts are left.")
    if result.short:
        logger.warning("correct_prompt_splits: %s hold fewer prompts than asked (%s) after %d few-shot draws; the "
                       "model answers %.0f%% of %d prompts. Raise max_shot_draws or ask for smaller splits.",
                       result.short, dict(zip(SPLITS, sizes)), draws, 100 * result.accuracy, n_checked)
    return result
