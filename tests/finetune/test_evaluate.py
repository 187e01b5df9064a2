import copy

import pytest
import torch

from circuits.answer_scoring import first_and_whole, first_token_accuracy
from circuits.tasks import make_dataset
from finetune.data import from_task_dataset, split_templates
from finetune.evaluate import (
    NON_MATH_SENTENCES, MathSuiteConfig, answer_accuracy, drift, evaluate_suite, general_texts, math_suite, pydoc_passages,
)


def test_general_texts_are_offline_english():
    passages = pydoc_passages(4)
    assert len(passages) == 4 and all(len(p) >= 300 for p in passages)
    assert len(NON_MATH_SENTENCES) == 30
    assert not any(ch.isdigit() for s in NON_MATH_SENTENCES for ch in s)
    assert len(general_texts(2)) == 32


def test_drift_is_zero_for_the_same_weights_and_grows_with_a_perturbation(tiny_gemma):
    base = copy.deepcopy(tiny_gemma)
    texts = list(NON_MATH_SENTENCES[:6])
    same = drift(tiny_gemma, base, texts)
    assert abs(same["kl"]) < 1e-6 and same["lm_loss"] == pytest.approx(same["base_lm_loss"])
    with torch.no_grad():
        tiny_gemma.blocks[1].mlp.W_out.add_(0.5)
    moved = drift(tiny_gemma, base, texts)
    assert moved["kl"] > 1e-3 and moved["n_tokens"] == same["n_tokens"]


def test_drift_of_the_base_against_itself_equals_drift_against_a_copy(tiny_gemma):
    # the same object skips the second forward; a copy runs it: both must give the same numbers
    texts = list(NON_MATH_SENTENCES[:5])
    itself = drift(tiny_gemma, tiny_gemma, texts, per_text=True)
    copied = drift(tiny_gemma, copy.deepcopy(tiny_gemma), texts, per_text=True)
    assert itself["kl"] == 0.0 and itself["n_tokens"] == copied["n_tokens"]
    assert itself["lm_loss"] == pytest.approx(copied["lm_loss"], rel=1e-6)
    assert itself["base_lm_loss"] == pytest.approx(copied["base_lm_loss"], rel=1e-6)
    assert itself["per_text"]["lm_loss"] == pytest.approx(copied["per_text"]["lm_loss"], rel=1e-6)
    assert abs(copied["kl"]) < 1e-6


def test_math_suite_uses_held_out_templates_only(tiny):
    suite = math_suite(tiny, MathSuiteConfig(ops=("+", "/"), n_heldout=6, n_transfer=3, n_shots=0))
    assert set(suite) == {f"{f}/{op}" for f in ("heldout", "multi_digit", "decimal", "word_problem") for op in "+/"}
    held = set(split_templates("+")[1]) | set(split_templates("/")[1])
    for ds in suite.values():
        assert set(ds["template_id"]) <= held
    assert all(len(a) >= 2 for a in suite["multi_digit/+"]["answer"])


def test_first_token_accuracy_agrees_with_circuits_and_bounds_exact(tiny):
    task = make_dataset(tiny, op="+", n_prompts=24, n_shots=0, operand_range=(10, 99))
    scores = answer_accuracy(tiny, task)
    assert scores["first_token"] == pytest.approx(first_token_accuracy(tiny, task))
    assert scores["exact"] <= scores["first_token"]
    suite = math_suite(tiny, MathSuiteConfig(ops=("+",), n_heldout=12, n_transfer=4, n_shots=0))
    assert scores["exact"] <= scores["first_token"]
    result = evaluate_suite(tiny, copy.deepcopy(tiny), suite, texts=NON_MATH_SENTENCES[:3], progress=False)
    assert set(result) == {"math", "math_summary", "drift"}
    assert "transfer/exact" in result["math_summary"]


def test_validation_is_disjoint_from_test_and_train(tiny):
    from finetune.data import ArithmeticMix, arithmetic_train_set
    from finetune.evaluate import validation_suite

    config = MathSuiteConfig(ops=("+", "/"), n_heldout=24, n_transfer=3, n_shots=1)
    test = math_suite(tiny, config)
    train = arithmetic_train_set(tiny, ArithmeticMix(ops=("+", "/"), n_examples=64, n_shots=1))
    val = validation_suite(tiny, config, 24, exclude=[*test.values(), train])
    assert set(val) == {"heldout/+", "heldout//"}
    held = set(split_templates("+")[1]) | set(split_templates("/")[1])
    test_queries = {q for ds in test.values() for q in ds["query"]}
    test_prompts = {p for ds in test.values() for p in ds["prompt"]}
    for name, ds in val.items():
        assert len(ds) == 24 and set(ds["template_id"]) <= held  # same templates as the test's held-out sets
        assert not set(ds["query"]) & test_queries  # no test problem, not even with other shots
        assert not set(ds["prompt"]) & (test_prompts | set(train["prompt"]))
        assert len(set(ds["prompt"])) == len(ds)
    # without the exclusion the same draw does share problems with the test: the filter is doing work
    unfiltered = validation_suite(tiny, config, 24)
    assert any(set(ds["query"]) & test_queries for ds in unfiltered.values())
    # zero-shot division on 4 held-out templates has 4 x 32 distinct problems: 200 cannot be found
    with pytest.raises(ValueError, match="validation prompts"):
        validation_suite(tiny, MathSuiteConfig(ops=("/",), n_shots=0), 200)


def test_per_prompt_hits_and_drift_intervals(tiny_gemma):
    from circuits.stats import wilson_interval
    from finetune.evaluate import accuracy_estimate, drift_estimates

    base = copy.deepcopy(tiny_gemma)
    suite = math_suite(tiny_gemma, MathSuiteConfig(ops=("+",), n_heldout=8, n_transfer=2, n_shots=0))
    with torch.no_grad():
        tiny_gemma.blocks[1].mlp.W_out.add_(0.3)
    scores = evaluate_suite(tiny_gemma, base, suite, texts=NON_MATH_SENTENCES[:6], progress=False, per_prompt=True)
    held = scores["math"]["heldout/+"]
    assert len(held["exact_hits"]) == 8 and sum(held["exact_hits"]) / 8 == held["exact"]
    est = accuracy_estimate(scores["math"], "heldout")
    assert (est.low, est.high) == pytest.approx(wilson_interval(sum(held["exact_hits"]), 8)) and est.n == 8
    assert accuracy_estimate(scores["math"], "transfer").n == 6  # three transfer formats x 2
    per_text = scores["drift"]["per_text"]
    assert len(per_text["kl"]) == 6 and sum(per_text["n_tokens"]) == scores["drift"]["n_tokens"]
    assert sum(per_text["kl"]) / sum(per_text["n_tokens"]) == pytest.approx(scores["drift"]["kl"])
    d = drift_estimates(per_text)
    assert d["kl"].value == pytest.approx(scores["drift"]["kl"]) and d["kl"].low <= d["kl"].value <= d["kl"].high
    assert d["kl"].low > 0 and d["kl"].n == 6
    paired = drift_estimates(per_text, per_text)  # a model against itself: exactly zero
    assert paired["kl"].value == 0 and paired["kl"].high == 0
    shorter = {k: v[:-1] for k, v in per_text.items()}
    with pytest.raises(ValueError, match="same texts in both arms"):
        drift_estimates(per_text, shorter)


def test_the_harness_scores_prompts_as_the_core_and_a_plain_forward_do(tiny):
    # even rows carry the model's own greedy two-token answer, odd rows the true sum: hits and misses
    data = make_dataset(tiny, op="+", n_prompts=16, n_shots=1, seed=4, operand_range=(0, 30))

    def own_answer(row, i):
        tokens = list(row["tokens"])
        for _ in range(2):
            tokens.append(int(tiny(torch.tensor([tokens]))[0, -1].argmax()))
        return {"answer_token_ids": tokens[len(row["tokens"]):]} if i % 2 == 0 else {}

    data = data.map(own_answer, with_indices=True)
    scores = answer_accuracy(tiny, from_task_dataset(data), batch_size=5, per_prompt=True)
    first, whole = first_and_whole(tiny, data)
    plain_first, plain_whole = [], []
    with torch.no_grad():
        for row in data:  # one full forward per row, the argmax of the full logits at every answer position
            tokens = torch.tensor([row["tokens"] + row["answer_token_ids"][:-1]])
            predicted = tiny(tokens)[0, len(row["tokens"]) - 1:].argmax(-1).tolist()
            plain_first.append(int(predicted[0] == row["answer_token_ids"][0]))
            plain_whole.append(int(predicted == row["answer_token_ids"]))
    assert scores["first_token_hits"] == [int(hit) for hit in first] == plain_first
    assert scores["exact_hits"] == [int(hit) for hit in whole] == plain_whole
    assert scores["first_token"] == first_token_accuracy(tiny, data)
    assert sum(plain_whole) >= 8 and sum(plain_whole) < len(data)  # both hits and misses
