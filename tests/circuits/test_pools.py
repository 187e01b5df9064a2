"""circuits.pools: a mean pool has the evaluated prompts' layouts (template, few-shot prefix, token length) and none
of their problems."""

import pytest

from circuits.pools import pool_dataset
from circuits.errors import TaskDataError
from circuits.tasks import make_dataset
from tests.tiny_models import char_tokenizer


@pytest.fixture(scope="module")
def evaluated():
    return make_dataset(char_tokenizer(), n_prompts=12, n_shots=1, template_ids=("add-equation-0", "add-statement-1"),
                        seed=4)


def _prefix(row):
    return row["prompt"][: row["prompt"].rindex("\n") + 1]


def test_the_pool_shares_layouts_and_no_problem(evaluated):
    pool = pool_dataset(char_tokenizer(), evaluated, 40, seed=1)
    assert len(pool) == 40
    layouts = {(r["template_id"], _prefix(r)) for r in evaluated}
    assert {(r["template_id"], _prefix(r)) for r in pool} == layouts  # every layout, and no other
    assert not {(r["template_id"], r["a"], r["b"]) for r in pool} & {(r["template_id"], r["a"], r["b"]) for r in evaluated}
    assert len({(r["template_id"], r["a"], r["b"]) for r in pool}) == 40  # no problem twice
    lengths = {(r["template_id"], _prefix(r)): len(r["tokens"]) for r in evaluated}
    assert all(len(r["tokens"]) == lengths[(r["template_id"], _prefix(r))] for r in pool)  # one-digit operands: same length
    assert pool_dataset(char_tokenizer(), evaluated, 40, seed=1)["prompt"] == pool["prompt"]  # seeded


def test_a_layout_whose_problems_run_out_gives_all_it_has_and_bad_sizes_are_refused(evaluated):
    one = evaluated.select([0])
    pool = pool_dataset(char_tokenizer(), one, 500)
    problems = {(r["a"], r["b"]) for r in pool}
    assert 90 <= len(pool) == len(problems) <= 100 - 1  # (nearly) every other one-digit pair, each once: not 500
    assert (one[0]["a"], one[0]["b"]) not in problems
    with pytest.raises(TaskDataError, match="empty evaluated dataset"):
        pool_dataset(char_tokenizer(), evaluated.select([]), 10)
    with pytest.raises(TaskDataError, match="n_prompts must be >= 1"):
        pool_dataset(char_tokenizer(), evaluated, 0)
