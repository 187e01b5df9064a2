"""The causal models predict the counterfactual answers arithmetic says they should; pairs obey their definition."""

from __future__ import annotations

from fractions import Fraction

import pytest

from patching.variables.causal_models import (
    CAUSAL_MODELS, PairSettings, causal_model, interchange_pairs, query_positions, split_pairs, task_config,
    variable_pairs,
)
from circuits.errors import TaskDataError
from circuits.tasks import make_dataset
from tests.tiny_models import tiny_model


def one_digit(a, b):
    return {"a": Fraction(a), "b": Fraction(b)}


def two_digit(x, y):
    return {"a_tens": Fraction(x // 10), "a_ones": Fraction(x % 10), "b_tens": Fraction(y // 10), "b_ones": Fraction(y % 10)}


@pytest.mark.parametrize("variable, source, expected", [
    ("a", (8, 1), 12), ("b", (8, 1), 4), ("result", (8, 1), 9), ("ones", (8, 1), 9),
    ("tens", (8, 5), 17),  # 8 + 5 = 13 has tens 1: 10 * 1 + 7
])
def test_one_digit_addition_predicts_the_counterfactual_answer(variable, source, expected):
    """Base 3 + 4 = 7 (tens 0, ones 7)."""
    assert causal_model("+").counterfactual(one_digit(3, 4), one_digit(*source), variable) == expected


@pytest.mark.parametrize("variable, source, expected", [
    ("ones_carry", 27, 78),   # 23 + 45 = 68 (no carry); 27 + 48 carries: tens 2 + 4 + 1 = 7
    ("ones", 27, 65),             # ones of 27 + 48 = 75 is 5
    ("tens", 61, 98),             # tens of 61 + 30 = 91 is 9; base hundreds stays 0
    ("a_ones", 29, 74),           # 29 + 45 = 74: a changed digit moves the ones, the carry and the tens
])
def test_two_digit_addition_predicts_the_counterfactual_answer(variable, source, expected):
    model = causal_model("two_digit_addition")
    other = {27: 48, 61: 30, 29: 45}[source]
    assert model.counterfactual(two_digit(23, 45), two_digit(source, other), variable) == expected
    # with no intervention the model adds
    for x, y in [(23, 45), (99, 99), (50, 50), (19, 81)]:
        assert model.run(two_digit(x, y))["answer"] == x + y


def test_every_registered_model_computes_its_operation_without_intervention():
    for name, make in CAUSAL_MODELS.items():
        model = make()
        if name == "two_digit_addition":
            continue
        for a in range(10):
            for b in range(1, 10):
                expected = {"+": a + b, "-": a - b, "*": a * b, "/": Fraction(a, b)}[name]
                assert model.run(one_digit(a, b))["answer"] == expected


def test_an_unknown_variable_names_the_known_ones():
    with pytest.raises(KeyError, match=r"Causal model 'two_digit_addition' has no variable 'carry'; its variables are "
                                       r"a_tens, a_ones, b_tens, b_ones, ones, ones_carry, tens, hundreds"):
        causal_model("two_digit_addition").counterfactual(two_digit(1, 2), two_digit(3, 4), "carry")


@pytest.fixture(scope="module")
def addition():
    model = tiny_model(n_layers=1)
    causal = causal_model("+")
    data = make_dataset(model, task_config(causal, n_prompts=60, n_shots=1))
    return model, causal, data


def test_pairs_change_the_variable_and_predict_the_answer_arithmetic_gives(addition):
    model, causal, data = addition
    correct = [i % 3 != 0 for i in range(len(data))]  # rows 0, 3, 6, ... "answered wrongly"
    for variable in causal.tested:
        pairs = interchange_pairs(causal, data, correct, variable, model, n_pairs=20, min_pairs=5)
        controls = interchange_pairs(causal, data, correct, variable, model, n_pairs=10, control=True, min_pairs=0)
        for pair in pairs + controls:
            assert correct[pair.base] and correct[pair.source]
            base, source = data[pair.base], data[pair.source]
            a, b = int(base["a"]), int(base["b"])
            sa, sb = int(source["a"]), int(source["b"])
            total = {"a": sa + b, "b": a + sb, "result": sa + sb,
                     "tens": 10 * ((sa + sb) // 10) + (a + b) % 10, "ones": 10 * ((a + b) // 10) + (sa + sb) % 10}
            value = {"a": (a, sa), "b": (b, sb), "result": (a + b, sa + sb),
                     "tens": ((a + b) // 10, (sa + sb) // 10), "ones": ((a + b) % 10, (sa + sb) % 10)}[variable]
            assert (value[0] == value[1]) == pair.control
            assert int(pair.answer) == (a + b if pair.control else total[variable])
            assert model.tokenizer.decode(list(pair.answer_ids)) == pair.answer
            if not pair.control:
                assert int(pair.answer) != a + b


def test_too_few_correct_prompts_say_how_many_there_were(addition):
    model, causal, data = addition
    correct = [i < 2 for i in range(len(data))]
    with pytest.raises(TaskDataError, match=r"Only [012] counterfactual pairs for variable 'a' of 'addition' from the 2 "
                                            r"of 60 prompts the model answers correctly; at least 8 are needed"):
        variable_pairs(model, causal, data, ["a"], PairSettings(min_pairs=8), correct=correct)


def test_splits_keep_a_base_prompt_in_one_split(addition):
    model, causal, data = addition
    pairs = interchange_pairs(causal, data, [True] * len(data), "a", model, n_pairs=40)
    train, validation, test = split_pairs(pairs, (0.5, 0.25, 0.25), seed=1)
    assert len(train) + len(validation) + len(test) == len(pairs)
    bases = [{p.base for p in part} for part in (train, validation, test)]
    assert not (bases[0] & bases[1]) and not (bases[0] & bases[2]) and not (bases[1] & bases[2])


def test_query_positions_label_the_operands_operator_and_end(addition):
    model, _, data = addition
    row = data[0]
    labels = query_positions(row, model)
    assert labels["a"] == row["a_pos"][0] and labels["b"] == row["b_pos"][0] and labels["op"] == row["op_pos"][0]
    assert labels["end"] == row["end_pos"] and min(labels.values()) == row["a_pos"][0]
