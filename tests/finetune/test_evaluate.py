import copy

import pytest
import torch

from circuits.tasks import accuracy, make_dataset
from finetune.data import split_templates
from finetune.evaluate import (
    NON_MATH_SENTENCES, MathSuiteConfig, answer_accuracy, drift, evaluate, general_texts, math_suite, pydoc_passages,
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
    assert scores["first_token"] == pytest.approx(accuracy(tiny, task))
    assert scores["exact"] <= scores["first_token"]
    suite = math_suite(tiny, MathSuiteConfig(ops=("+",), n_heldout=12, n_transfer=4, n_shots=0))
    assert scores["exact"] <= scores["first_token"]
    result = evaluate(tiny, copy.deepcopy(tiny), suite, texts=NON_MATH_SENTENCES[:3], progress=False)
    assert set(result) == {"math", "math_summary", "drift"}
    assert "transfer/exact" in result["math_summary"]
