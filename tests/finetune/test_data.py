import pytest

from circuits.templates import template_by_id
from tests.tiny_models import tiny_model
from finetune.data import (
    ArithmeticMix, arithmetic_pairs, SFTDataError, arithmetic_train_set, collate, encode_pairs, epoch_order, split_templates, targets,
)


def test_encode_pairs_for_a_non_math_task():
    tok = tiny_model().tokenizer
    ds = encode_pairs(tok, [("English: seven\nFrench:", " sept"), ("English: two\nFrench:", " deux")])
    row = ds[0]
    assert row["input_ids"][0] == tok.bos_token_id
    assert tok.decode(row["input_ids"][row["n_prompt"]:]) == " sept"
    assert row["input_ids"][: row["n_prompt"]] == tok("English: seven\nFrench:")["input_ids"]
    with pytest.raises(SFTDataError, match="Empty answer"):
        encode_pairs(tok, [("a", "")])


def test_template_split_is_disjoint_and_covers_every_style():
    for op in "+-*/":
        train, held = split_templates(op)
        assert not set(train) & set(held)
        assert {template_by_id(t).style for t in held} == {"equation", "statement", "question", "word_problem"}
        assert len(train) == 11 and len(held) == 4


def test_arithmetic_mix_uses_training_templates_and_weights():
    model = tiny_model()
    ds = arithmetic_train_set(model, ArithmeticMix(ops=("+", "*"), op_weights=(3, 1), n_examples=40, n_shots=0))
    assert len(ds) == 40
    train = set(split_templates("+")[0]) | set(split_templates("*")[0])
    assert set(ds["template_id"]) <= train
    assert sum(template_by_id(t).op == "+" for t in ds["template_id"]) == 30
    assert "word_problem" in {template_by_id(t).style for t in ds["template_id"]}
    assert all(0 < n < len(i) for n, i in zip(ds["n_prompt"], ds["input_ids"]))


def test_collate_and_targets_align():
    rows = [{"input_ids": [1, 5, 6, 7], "n_prompt": 2}, {"input_ids": [1, 8, 9], "n_prompt": 2}]
    tokens, mask = collate(rows, pad_id=0)
    assert tokens.tolist() == [[1, 5, 6], [1, 8, 0]]
    assert targets(rows, mask).tolist() == [6, 7, 9]
    with pytest.raises(SFTDataError, match="leaves no answer"):
        collate([{"input_ids": [1, 2], "n_prompt": 2}], 0)


def test_epoch_order_is_a_seeded_permutation():
    assert sorted(epoch_order(10, 0, 1)) == list(range(10))
    assert epoch_order(10, 0, 1) == epoch_order(10, 0, 1) != epoch_order(10, 1, 1)


def test_arithmetic_pairs_have_correct_answers():
    from fractions import Fraction

    for op, check in (("/", lambda a, b, c: Fraction(a) / Fraction(b) == Fraction(c)),
                      ("-", lambda a, b, c: int(a) - int(b) == int(c) >= 0)):
        ids = split_templates(op)[0][:1]  # an equation template: "{A} op {B} = "
        for item in arithmetic_pairs(op, ids, 30, n_shots=1, seed=2):
            last = item["prompt"].splitlines()[-1]
            a, _, b, _ = last.split(" ", 3)
            assert check(a, b, item["answer"]), (last, item["answer"])
    with pytest.raises(SFTDataError, match="not for operation"):
        arithmetic_pairs("+", split_templates("-")[0], 2)
