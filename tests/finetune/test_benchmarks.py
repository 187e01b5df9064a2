"""Benchmark loaders, offline, on fixture files in each benchmark's hub schema."""

from pathlib import Path

import pytest

from finetune.benchmarks import BENCHMARKS, choice_accuracy, choice_prompt, load_benchmark, numeric_accuracy

FIXTURES = Path(__file__).parent / "fixtures"


def test_gsm8k_final_number_is_the_answer():
    items = load_benchmark("gsm8k", data_files=str(FIXTURES / "gsm8k.jsonl"))
    assert [i["answer"] for i in items] == ["72", "10", "1500"]
    assert items[0]["question"].startswith("Natalia")


def test_svamp_joins_body_and_question():
    items = load_benchmark("svamp", data_files=str(FIXTURES / "svamp.jsonl"), limit=1)
    assert items == [{"question": items[0]["question"], "answer": "51"}]
    assert "discount" in items[0]["question"] and items[0]["question"].endswith("pack?")


def test_multiple_choice_schemas():
    mmlu = load_benchmark("mmlu", data_files=str(FIXTURES / "mmlu.jsonl"))
    assert mmlu[0]["labels"] == ["A", "B", "C", "D"] and mmlu[0]["answer_index"] == 1
    csqa = load_benchmark("commonsense_qa", data_files=str(FIXTURES / "commonsense_qa.jsonl"))
    assert csqa[1]["choices"][0] == "maine" and csqa[1]["answer_index"] == 0
    assert choice_prompt(mmlu[0]).splitlines()[2] == "B. Mars"


def test_hub_ids_and_unknown_names():
    assert BENCHMARKS["gsm8k"].path == "openai/gsm8k" and BENCHMARKS["mmlu"].path == "cais/mmlu"
    with pytest.raises(ValueError, match="Unknown benchmark"):
        load_benchmark("aime")


def test_scorers_run_on_a_model(tiny):
    items = load_benchmark("mmlu", data_files=str(FIXTURES / "mmlu.jsonl"))
    assert 0.0 <= choice_accuracy(tiny, items) <= 1.0
    numeric = load_benchmark("svamp", data_files=str(FIXTURES / "svamp.jsonl"))
    assert numeric_accuracy(tiny, numeric, max_new_tokens=3) in (0.0, 0.5, 1.0)
