"""circuits.classic_tasks: IOI and greater-than are seeded, their twins keep the token length, the answers are right."""

from __future__ import annotations

import pytest

from circuits.classic_tasks import (
    GT_TEMPLATE, GreaterThanConfig, IOIConfig, make_greater_than, make_ioi, make_task, task_kind, year_candidates,
)
from circuits.errors import InputError, TaskDataError
from tests.tiny_models import char_tokenizer

TOK = char_tokenizer()


def test_ioi_is_seeded_with_abc_twins_of_equal_length():
    task = make_ioi(TOK, IOIConfig(n_prompts=12, seed=3))
    assert task.metric == "logit_diff"
    assert make_ioi(TOK, IOIConfig(n_prompts=12, seed=3)).rows.to_list() == task.rows.to_list()
    assert make_ioi(TOK, IOIConfig(n_prompts=12, seed=4)).rows["prompt"] != task.rows["prompt"]
    assert set(task.rows["order"]) == {"ABBA", "BABA"}
    for row in task.rows:
        assert len(row["tokens"]) == len(row["cf_tokens"]) and row["cf_fitted"] == ""
        io, s = row["answer"].strip(), row["distractor"].strip()
        assert row["prompt"].count(io) == 1 and row["prompt"].count(s) == 2  # S returns, IO does not
        assert io not in row["counterfactual"] and s not in row["counterfactual"]  # ABC: three other names
        assert row["answer_token_ids"][0] != row["alt_token_id"]
        # the character tokenizer splits off the space, so it moves into the prompt and the name's letter is scored
        assert row["prompt"].endswith(" ") and TOK.decode(row["answer_token_ids"][:1]) == io[0]


def test_greater_than_on_a_digit_tokenizer_scores_first_digits_of_decade_ends():
    task = make_greater_than(TOK, GreaterThanConfig(n_prompts=10, seed=1))
    assert task.metric == "prob_diff"
    assert list(task.ordered_ids) == [TOK.convert_tokens_to_ids(str(d)) for d in range(10)]
    assert make_greater_than(TOK, GreaterThanConfig(n_prompts=10, seed=1)).rows.to_list() == task.rows.to_list()
    for row in task.rows:
        yy = row["year"]
        assert yy % 10 == 9 and 19 <= yy <= 89  # "year > YY" is then exactly "first digit > YY // 10"
        assert row["prompt"] == GT_TEMPLATE.format(noun=row["noun"], century=row["century"], yy=f"{yy:02d}")
        assert row["counterfactual"].endswith(f"year {row['century']}01 to the year {row['century']}")
        assert len(row["tokens"]) == len(row["cf_tokens"])
        assert row["answer_token_ids"] == [task.ordered_ids[yy // 10]]
    anywhere = make_greater_than(TOK, GreaterThanConfig(n_prompts=30, seed=1, decade_ends=False))
    assert any(y % 10 != 9 for y in anywhere.rows["year"])


class _YearTokenizer:
    """A stand-in for GPT-2's tokenizer: every two-digit year after the prompt is one token."""

    def __call__(self, text, add_special_tokens=True):
        prompt = GT_TEMPLATE.format(noun="war", century=17, yy="32")
        ids = [1] * len(prompt)
        return {"input_ids": ids + ([100 + int(text[len(prompt):])] if len(text) > len(prompt) else [])}


def test_a_tokenizer_with_year_tokens_gets_the_hundred_years():
    ordered, whole = year_candidates(_YearTokenizer(), GT_TEMPLATE.format(noun="war", century=17, yy="32"))
    assert whole and ordered == [100 + y for y in range(100)]


def test_task_names():
    assert task_kind("addition") == "arithmetic" and task_kind("ioi") == "classic"
    with pytest.raises(InputError, match="Unknown task 'ioj'"):
        task_kind("ioj")
    with pytest.raises(TaskDataError, match="is an arithmetic task"):
        make_task(TOK, "division")
    assert make_task(TOK, "greater-than", n_prompts=3).name == "greater-than"
