"""Mean pools: prompts in the evaluated prompts' layouts but none of their problems.

Mean ablation replaces an activation by its mean over prompts of the same layout (template and
token length). Taking that mean over the evaluated prompts themselves leaks each prompt's own
information back into its ablated activation; :func:`pool_dataset` builds a separate pool
(same few-shot prefix per template, fresh operand pairs, the same counterfactual rule) so the
means never include an evaluated prompt.
"""

from __future__ import annotations

import random

from datasets import Dataset
from tqdm.auto import tqdm

from circuits.errors import TaskDataError
from circuits.tasks import format_number, make_row, sample_operands
from circuits.templates import template_by_id


def _operand_format(dataset: Dataset) -> tuple[tuple[int, int], int]:
    """The operand range (by digit count) and decimal places that ``dataset``'s operands were drawn with."""
    values = [v for col in ("a", "b") for v in dataset[col]]
    decimals = max((len(v.split(".")[1]) for v in values if "." in v), default=0)
    digits = [len(v.lstrip("-").split(".")[0]) for v in values]
    low = 0 if min(digits) == 1 else 10 ** (min(digits) - 1)
    return (low, 10 ** max(digits) - 1), decimals


def pool_dataset(
    tokenizer,
    evaluated: Dataset,
    n_prompts: int = 512,
    *,
    operand_range: tuple[int, int] | None = None,
    decimals: int | None = None,
    seed: int = 0,
) -> Dataset:
    """Prompts in ``evaluated``'s layouts but none of its problems: a pool to average ablation means over.

    For each (template, few-shot prefix) of ``evaluated`` (read from its rows, so the pool's prompts
    align token for token with the evaluated ones) the pool gets an equal share of ``n_prompts``
    fresh queries, skipping every (template, a, b) that ``evaluated`` contains, with the same
    counterfactual rule (``corrupt`` column). A template whose unseen operand pairs run out
    contributes all of them. ``operand_range`` and ``decimals`` default to what the evaluated
    operands need (one-digit -> (0, 9), two-digit -> (10, 99), decimal places as seen).
    """
    tokenizer = getattr(tokenizer, "tokenizer", None) or tokenizer
    if len(evaluated) == 0:
        raise TaskDataError("pool_dataset got an empty evaluated dataset: there are no layouts to match.")
    if n_prompts < 1:
        raise TaskDataError(f"n_prompts must be >= 1, got {n_prompts}.")
    inferred_range, inferred_decimals = _operand_format(evaluated)
    operand_range = operand_range or inferred_range
    decimals = inferred_decimals if decimals is None else decimals
    corrupt = evaluated["corrupt"][0] if "corrupt" in evaluated.column_names else "query"
    allow_negative = any(v.startswith("-") for v in evaluated["answer"])
    groups: dict[tuple[str, str], set] = {}
    for row in evaluated.select_columns(["prompt", "template_id", "a", "b"]).to_list():
        template = template_by_id(row["template_id"])
        prefix = row["prompt"][: len(row["prompt"]) - len(template.fill(row["a"], row["b"]))]
        groups.setdefault((template.id, prefix), set()).add((row["a"], row["b"]))
    rng = random.Random(f"{seed}/pool")
    rows, live, turn = [], sorted(groups), 0
    bar = tqdm(total=n_prompts, desc="building the mean pool", disable=n_prompts < 500, leave=False)
    while len(rows) < n_prompts and live:
        template_id, prefix = live[turn % len(live)]
        turn += 1
        template, used = template_by_id(template_id), groups[(template_id, prefix)]
        for _ in range(200):
            a, b = sample_operands(rng, template.op, operand_range, decimals, allow_negative)
            key = (format_number(a, decimals), format_number(b, decimals))
            if key not in used:
                break
        else:  # every unseen pair is taken (or too rare to draw): this layout's share is complete
            live.remove((template_id, prefix))
            continue
        used.add(key)
        rows.append(make_row(tokenizer, template, a, b, prefix=prefix, decimals=decimals, corrupt=corrupt))
        bar.update(1)
    bar.close()
    if not rows:
        raise TaskDataError("No operand pair outside the evaluated prompts is left for the pool; evaluate fewer prompts.")
    return Dataset.from_list(rows)
