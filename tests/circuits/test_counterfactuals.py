"""circuits.counterfactuals: which operators a twin replaces, in which order replacements are tried."""

import pytest

from circuits import counterfactuals
from circuits.errors import TaskDataError
from circuits.templates import COUNTERFACTUAL_SYMBOLS, COUNTERFACTUAL_WORDS, template_by_id


def test_replacements_start_with_the_operators_own_kind():
    symbolic, worded = template_by_id("add-equation-0"), template_by_id("add-statement-1")  # "+" and "plus"
    assert counterfactuals.replacement_operators(symbolic)[:len(COUNTERFACTUAL_SYMBOLS)] == COUNTERFACTUAL_SYMBOLS
    assert counterfactuals.replacement_operators(worded)[:len(COUNTERFACTUAL_WORDS)] == COUNTERFACTUAL_WORDS
    n = len(COUNTERFACTUAL_WORDS)
    pairs = counterfactuals.replacement_operators(symbolic)[len(COUNTERFACTUAL_SYMBOLS) + n:]
    assert len(pairs) == n * (n - 1) and all(len(p.split()) == 2 for p in pairs)


def test_query_twins_keep_the_shots_and_all_twins_replace_every_operator():
    template = template_by_id("add-equation-0")
    prefix = counterfactuals.shot_prefix(template, [("1", "2", "3"), ("4", "4", "8")])
    assert prefix == "1 + 2 = 3\n4 + 4 = 8\n"
    query = next(counterfactuals.twin_candidates(template, "5", "6", prefix, "query"))
    every = next(counterfactuals.twin_candidates(template, "5", "6", prefix, "all"))
    assert query == "1 + 2 = 3\n4 + 4 = 8\n5 # 6 = " and every == "1 # 2 = 3\n4 # 4 = 8\n5 # 6 = "
    assert counterfactuals.parse_shots(template, prefix) == [("1", "2", "3"), ("4", "4", "8")]


def test_bad_rules_and_foreign_shots_are_explained():
    with pytest.raises(TaskDataError, match="corrupt must be one of \\('query', 'all'\\)"):
        counterfactuals.check_corrupt("shots")
    with pytest.raises(TaskDataError, match="is not a solved 'add-equation-0' problem"):
        next(counterfactuals.twin_candidates(template_by_id("add-equation-0"), "5", "6", "7 times 2 = 14\n", "all"))

