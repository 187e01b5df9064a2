"""The three expert tasks of the merging experiment, as SFT datasets: word-problem addition,
multiplication, and English -> French number words.

Merging experts trained on different skills only says something when the skills do not overlap and
each test split is unseen: so the two arithmetic tasks train on some templates and are scored on held-out
ones (:func:`finetune.data.split_templates`), and the translation task splits the number words 0..30
themselves, so no test word is ever a training query or a few-shot example:

* ``add_word``: addition word problems (operands 1..9);
* ``mul``: multiplication in the equation / statement / question templates (operands 1..9);
* ``en_fr``: ``English: seven\\nFrench:`` -> `` sept``, after ``n_shots`` solved pairs of training words.

``expert_task_data(tokenizer, ExpertTaskConfig())`` returns ``{(task, split): Dataset}`` for the
splits ``train``, ``val`` and ``test``; each row has ``prompt``, ``answer`` and the SFT fields of
:func:`finetune.data.encode_pair`. Everything is seeded by ``seed``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from datasets import Dataset

from finetune.data import arithmetic_rows, encode_pairs, split_templates

EXPERT_TASKS = ("add_word", "mul", "en_fr")
SPLITS = ("train", "val", "test")

ENGLISH = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
           "seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four twenty-five twenty-six "
           "twenty-seven twenty-eight twenty-nine thirty").split()
FRENCH = ("zéro un deux trois quatre cinq six sept huit neuf dix onze douze treize quatorze quinze seize dix-sept "
          "dix-huit dix-neuf vingt vingt-et-un vingt-deux vingt-trois vingt-quatre vingt-cinq vingt-six vingt-sept "
          "vingt-huit vingt-neuf trente").split()
ARITHMETIC_TASKS = {"add_word": ("+", ("word_problem",)), "mul": ("*", ("equation", "statement", "question"))}


@dataclass(frozen=True)
class ExpertTaskConfig:
    """Examples per split, few-shot examples per prompt, and the seed of every split."""

    n_train: int = 128
    n_val: int = 12
    n_test: int = 24
    n_shots: int = 1
    seed: int = 0


def number_word_split(seed: int) -> dict[str, list[int]]:
    """The numbers 0..30 shuffled and split: 9 test, 6 validation, 16 training words."""
    numbers = list(range(len(ENGLISH)))
    random.Random(seed).shuffle(numbers)
    return {"test": numbers[:9], "val": numbers[9:15], "train": numbers[15:]}


def french_pairs(words: dict[str, list[int]], queries: list[int], n: int, n_shots: int, seed: int) -> list[tuple[str, str]]:
    """``n`` few-shot (prompt, answer) pairs: shots from ``words["train"]``, the queries cycling through ``queries``."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        q = queries[i % len(queries)]
        shots = rng.sample([w for w in words["train"] if w != q], n_shots)
        prompt = "".join(f"English: {ENGLISH[s]}\nFrench: {FRENCH[s]}\n" for s in shots)
        pairs.append((prompt + f"English: {ENGLISH[q]}\nFrench:", " " + FRENCH[q]))
    return pairs


def arithmetic_task_rows(tokenizer, task: str, split: str, n: int, n_shots: int, seed: int) -> Dataset:
    """SFT rows of ``add_word`` or ``mul``: training templates for ``train``, held-out templates for val/test."""
    op, styles = ARITHMETIC_TASKS[task]
    train_ids, held_ids = split_templates(op, styles)
    ids = train_ids if split == "train" else held_ids
    return arithmetic_rows(tokenizer, op, ids, n, operand_range=(1, 9), n_shots=n_shots, seed=seed)


def expert_task_data(tokenizer, cfg: ExpertTaskConfig = ExpertTaskConfig()) -> dict[tuple[str, str], Dataset]:
    """``{(task, split): Dataset}`` for every task of :data:`EXPERT_TASKS` and split of :data:`SPLITS`."""
    words = number_word_split(cfg.seed)
    data = {}
    for split, n, seed in (("train", cfg.n_train, 1), ("val", cfg.n_val, 2), ("test", cfg.n_test, 3)):
        seed += 10 * cfg.seed
        for task in ARITHMETIC_TASKS:
            data[(task, split)] = arithmetic_task_rows(tokenizer, task, split, n, cfg.n_shots, seed)
        data[("en_fr", split)] = encode_pairs(tokenizer, french_pairs(words, words[split], n, cfg.n_shots, seed))
    return data
