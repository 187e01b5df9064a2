"""Data for the All-for-One search: the authors' five prompt formats, one-digit prompt sets
for custom templates, and disjoint CAMA-fit / evaluation splits (see :mod:`patching.all_for_one.search`)."""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Sequence

from datasets import Dataset

from circuits.arguments import check_nonnegative_int, check_positive_int
from circuits.errors import InputError
from circuits.tasks import check_operand_range, make_row
from circuits.templates import Template, resolve_operation
from patching.all_for_one.cama import group_rows

# The authors' five formats (paper Table 4): equation without spaces, verbal, question,
# word problem, Python. Written here as circuits.templates.Template data, one set per operation.
# "Python" has no style of its own in circuits.templates; it is filed under "equation".
_AUTHORS_WORDS = {"+": "sum", "-": "difference", "*": "product", "/": "quotient"}
_AUTHORS_WORD_PROBLEMS = {
    "+": "Anna has {A} apples. Tom [gives] her {B} more apples. How many apples does Anna have now? Answer: ",
    "-": "Anna has {A} apples. She [eats] {B} of them. How many apples does Anna have now? Answer: ",
    "*": "Anna has {A} bags with {B} apples [in each]. How many apples does Anna have? Answer: ",
    "/": "Anna [shares] {A} apples equally among {B} friends. How many apples does each friend get? Answer: ",
}


def authors_templates(op: str = "+") -> tuple[Template, ...]:
    """The paper's five prompt formats for ``op`` (ids ``af1-equation``, ``af1-verbal``, ``af1-question``,
    ``af1-word``, ``af1-python``)."""
    op = resolve_operation(op).symbol
    word = _AUTHORS_WORDS[op]
    return (
        Template("af1-equation", op, "equation", f"{{A}}[{op}]{{B}}="),
        Template("af1-verbal", op, "statement", f"The [{word}] of {{A}} and {{B}} is "),
        Template("af1-question", op, "question", f"What is the [{word}] of {{A}} and {{B}}? Answer: "),
        Template("af1-word", op, "word_problem", _AUTHORS_WORD_PROBLEMS[op]),
        # The bare ">>> print(A + B)\n" gets 0% on gemma-3-270m (it continues with ">>>"); the comment cues the value.
        Template("af1-python", op, "equation", f"print({{A}} [{op}] {{B}})  # Output: "),
    )


AUTHORS_TEMPLATES = authors_templates("+")


def make_template_dataset(
    tokenizer, templates: Sequence[Template], n_per_template: int = 100, *,
    operand_range: tuple[int, int] = (0, 9), single_token_answers: bool = True, n_shots: int = 0, seed: int = 0,
) -> Dataset:
    """Zero-shot prompts for custom templates: distinct operand pairs per template (at most all pairs).

    ``single_token_answers`` keeps only pairs whose whole answer is one token (for "+" on
    0..9: sums up to 9). The metrics score the first answer token; with two-digit answers
    most first tokens are "1", and a model that always says "1" would look faithful.
    ``n_shots`` > 0 prefixes solved examples of the same template (from the same candidate
    pairs, other than the query), one per line.
    """
    tokenizer = getattr(tokenizer, "tokenizer", None) or tokenizer
    check_positive_int(n_per_template, "n_per_template")
    check_nonnegative_int(n_shots, "n_shots")
    lo, hi = check_operand_range(operand_range)
    rng = random.Random(seed)
    rows = []
    for template in templates:
        op = resolve_operation(template.op).symbol
        # non-negative differences and exact quotients, as circuits.tasks samples them
        pairs = [(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1)
                 if (op != "-" or a >= b) and (op != "/" or (b != 0 and a % b == 0))]
        candidates = [make_row(tokenizer, template, Fraction(a), Fraction(b)) for a, b in pairs]
        if single_token_answers:
            candidates = [row for row in candidates if len(row["answer_token_ids"]) == 1]
        if not candidates:
            raise InputError(f"No operand pairs in {operand_range} suit {template.id!r} ({op})"
                             f"{' with one-token answers' if single_token_answers else ''}.")
        chosen = rng.sample(range(len(candidates)), min(n_per_template, len(candidates)))
        if n_shots == 0:
            rows.extend(candidates[i] for i in chosen)
            continue
        if len(candidates) <= n_shots:
            raise InputError(f"{template.id!r}: {len(candidates)} operand pairs cannot give {n_shots} shots.")
        for i in chosen:
            shots = rng.sample([j for j in range(len(candidates)) if j != i], n_shots)
            prefix = "".join(candidates[j]["prompt"] + candidates[j]["answer"] + "\n" for j in shots)
            query = candidates[i]
            rows.append(make_row(tokenizer, template, Fraction(query["a"]), Fraction(query["b"]), prefix=prefix))
    return Dataset.from_list(rows)


def split_fit_eval(dataset: Dataset, fit_fraction: float = 0.5, seed: int = 0) -> tuple[Dataset, Dataset]:
    """Disjoint (fit, eval) splits, stratified by CAMA alignment group; equal prompts go to one side."""
    if len(dataset) < 2:
        raise InputError(f"Need at least 2 prompts to split into fit and eval sets, got {len(dataset)}.")
    rng = random.Random(seed)
    prompts = dataset["prompt"]
    fit, evaluate = [], []
    for rows in group_rows(dataset).values():
        by_prompt: dict[str, list[int]] = {}
        for i in rows:
            by_prompt.setdefault(prompts[i], []).append(i)
        unique = list(by_prompt)
        rng.shuffle(unique)
        n_fit = round(fit_fraction * len(unique))
        if len(unique) >= 2:
            n_fit = min(max(n_fit, 1), len(unique) - 1)
        for j, prompt in enumerate(unique):
            (fit if j < n_fit else evaluate).extend(by_prompt[prompt])
    if not fit or not evaluate:
        raise InputError("The split left the fit or the eval set empty; use more prompts.")
    return dataset.select(sorted(fit)), dataset.select(sorted(evaluate))


def cross_fit_folds(dataset: Dataset, n_folds: int = 2, seed: int = 0, stratify: str | None = "b") -> list[int]:
    """A fold number per row for cross-fitted CAMA means: fit on the other folds, evaluate on this one.

    Folds are drawn within each CAMA alignment group and, inside it, within each value of the
    ``stratify`` column (default: the second operand, whose token CAMA conditions on), so every
    (position, token) mean of a fold's complement has as many prompts as the data allow;
    equal prompts share a fold (a prompt must never sit on both sides).
    """
    check_positive_int(n_folds, "n_folds")
    if n_folds < 2:
        raise InputError(f"Cross-fitting needs n_folds >= 2 (fit on the others, evaluate on one), got {n_folds}.")
    if stratify is not None and stratify not in dataset.column_names:
        raise InputError(f"Cannot stratify the folds by {stratify!r}: the dataset has columns {dataset.column_names}.")
    rng = random.Random(seed)
    prompts = dataset["prompt"]
    strata = dataset[stratify] if stratify is not None else [None] * len(dataset)
    folds = [0] * len(dataset)
    for rows in group_rows(dataset).values():
        by_stratum: dict[object, dict[str, list[int]]] = {}
        for i in rows:
            by_stratum.setdefault(strata[i], {}).setdefault(prompts[i], []).append(i)
        offset = rng.randrange(n_folds)  # which fold gets the odd prompt of each stratum rotates
        for _, by_prompt in sorted(by_stratum.items(), key=lambda kv: str(kv[0])):
            unique = list(by_prompt)
            rng.shuffle(unique)
            for j, prompt in enumerate(unique):
                for i in by_prompt[prompt]:
                    folds[i] = (offset + j) % n_folds
            offset = (offset + len(unique)) % n_folds
    return folds
