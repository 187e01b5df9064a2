"""circuits.prompt_splits and circuits.tasks.every_problem: every problem once, checked, split by problem."""

from __future__ import annotations

import logging
from fractions import Fraction

import pytest

from circuits.errors import InputError, TaskDataError
from circuits.prompt_splits import SPLITS, correct_prompt_splits, problem_key
from circuits.tasks import TaskConfig, every_problem, make_dataset, operand_pairs
from circuits.templates import get_templates, resolve_operation
from tests.tiny_models import char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


def test_operand_pairs_are_every_pair_the_sampler_can_draw():
    assert len(operand_pairs("+")) == 100
    minus = operand_pairs("-")
    assert len(minus) == 55 and all(a >= b for a, b in minus)  # 10 + 9 + ... + 1
    assert len(operand_pairs("-", allow_negative=True)) == 100
    divide = operand_pairs("/")
    assert all(b and a % b == 0 for a, b in divide) and (0, 1) in divide and (9, 3) in divide and (9, 2) not in divide
    # written differently from the code: a loop over quotients
    assert sorted(divide) == sorted({(b * q, b) for b in range(1, 10) for q in range(10) if b * q <= 9})


@pytest.mark.parametrize("op", ["+", "-"])
def test_every_problem_holds_each_template_and_pair_once_with_make_datasets_prefix(tok, op):
    config = TaskConfig(op=op, n_shots=1, seed=3)
    dataset = every_problem(tok, config)
    keys = [problem_key(row) for row in dataset]
    assert len(keys) == len(set(keys)) == len(get_templates(op)) * len(operand_pairs(op))
    for row in dataset.select(range(0, len(dataset), 37)):
        assert Fraction(row["answer"]) == resolve_operation(op).compute(Fraction(row["a"]), Fraction(row["b"]))
    sampled = make_dataset(tok, config, n_prompts=12)  # draw 0 is make_dataset's few-shot prefix
    prefixes = {r["template_id"]: r["prompt"][:r["prompt"].rindex("\n") + 1] for r in sampled}
    for row in dataset:
        assert row["prompt"].startswith(prefixes[row["template_id"]]) and row["shot_draw"] == 0
    other = every_problem(tok, config, shot_draw=1)
    assert [problem_key(r) for r in other] == keys and other["prompt"] != dataset["prompt"]


def test_every_problem_refuses_decimals_and_negative_draws(tok):
    with pytest.raises(InputError, match="integer operands"):
        every_problem(tok, TaskConfig(decimals=1))
    with pytest.raises(InputError, match="shot_draw"):
        every_problem(tok, TaskConfig(), shot_draw=-1)


def _answered_if(rule):
    calls = []

    def hits(model, dataset, batch_size):
        calls.append(len(dataset))
        return [rule(row) for row in dataset]

    return hits, calls


def test_splits_are_correct_prompts_of_disjoint_problems_in_the_asked_sizes(tok):
    hits, _ = _answered_if(lambda row: int(row["a"]) % 3 != 0)  # the "model" fails whenever a is 0, 3, 6 or 9
    splits = correct_prompt_splits(tok, TaskConfig(op="+", n_shots=1), (300, 150, 150), hits=hits)
    assert [len(s) for s in splits.splits()] == [300, 150, 150] and not splits.short
    problems = [{problem_key(r) for r in s} for s in splits.splits()]
    assert not (problems[0] & problems[1]) and not (problems[0] & problems[2]) and not (problems[1] & problems[2])
    assert all(int(a) % 3 for s in splits.splits() for a in s["a"])
    assert splits.to_dict()["sizes"] == dict(zip(SPLITS, (300, 150, 150)))
    assert 0 < splits.accuracy < 1 and splits.n_correct <= splits.n_checked
    again = correct_prompt_splits(tok, TaskConfig(op="+", n_shots=1), (300, 150, 150), hits=hits)
    assert again.train["prompt"] == splits.train["prompt"]  # seeded


def test_a_short_split_takes_more_shot_draws_then_says_it_is_short(tok, caplog):
    hits, calls = _answered_if(lambda row: row["template_id"].endswith("-0"))  # 3 of 12 templates answered
    config = TaskConfig(op="-", n_shots=1)
    splits = correct_prompt_splits(tok, config, (150, 40, 40), max_shot_draws=3, hits=hits)
    assert splits.shot_draws >= 2 and len(calls) == splits.shot_draws
    assert set(splits.train["shot_draw"]) >= {0, 1} and len(splits.train) == 150
    with caplog.at_level(logging.WARNING):
        short = correct_prompt_splits(tok, config, (1000, 300, 300), max_shot_draws=2, hits=hits)
    assert short.short["train"] == len(short.train) < 1000 and short.shot_draws == 2
    assert "fewer prompts than asked" in caplog.text


def test_bad_sizes_and_a_model_that_answers_nothing_are_refused(tok):
    with pytest.raises(InputError, match="three positive"):
        correct_prompt_splits(tok, TaskConfig(), (10, 10))
    with pytest.raises(InputError, match="max_shot_draws"):
        correct_prompt_splits(tok, TaskConfig(), max_shot_draws=0)
    hits, _ = _answered_if(lambda row: False)
    with pytest.raises(TaskDataError, match="answers none"):
        correct_prompt_splits(tok, TaskConfig(n_shots=1), (10, 10, 10), max_shot_draws=1, hits=hits)
