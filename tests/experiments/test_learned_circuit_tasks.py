"""``python -m experiments.learned_circuit --task``: a pair task (IOI, a prompt-pair file) split at random, every
learned circuit and curve scored by the task's metric; on a tiny random model."""

from __future__ import annotations

import json

import pytest

from circuits.errors import InputError
from circuits.pair_tasks import split_pairs
from experiments import learned_circuit

SMALL = ["--n-train", "6", "--n-validation", "4", "--n-test", "4", "--steps", "2", "--learn-batch-size", "4",
         "--samples", "2", "--n-bootstrap", "50", "--warm-start-prompts", "4", "--threads", "1", "--penalties", "0"]


def test_ioi_is_learned_on_its_logit_difference(tmp_path, tiny_dir):
    out = tmp_path / "run"
    results = learned_circuit.main(SMALL + ["--model", str(tiny_dir), "--task", "ioi", "--out", str(out)])
    saved = json.loads((out / "results.json").read_text())
    assert saved["experiment"] == "learned_circuit-ioi" and saved["task"]["metric"] == "logit_diff"
    prompts = results["prompts"]
    assert prompts["train_sets"] == [6, 6] and (prompts["validation"], prompts["test"]) == (4, 4)
    assert not prompts["scaled_down"] and saved["task"]["n_rows"] == 2 * (6 * 2 + 4 + 4)
    assert set(results["test"]) >= {"EAP-IG-inputs", "matryoshka"}


def test_a_short_pair_file_is_scaled_down(tmp_path, tiny_dir):
    rows = [f"ab{i}=,cd{i}=,{(i + 1) % 10},{(i + 5) % 10}" for i in range(30)]  # about half are solved
    path = tmp_path / "pairs.csv"
    path.write_text("clean,corrupted,answer,distractor\n" + "\n".join(rows) + "\n")
    results = learned_circuit.main(SMALL + ["--model", str(tiny_dir), "--task", str(path), "--no-baselines",
                                            "--out", str(tmp_path / "run")])
    assert results["experiment"] == "learned_circuit-pairs" and results["prompts"]["scaled_down"]
    assert sum(results["prompts"]["train_sets"]) + results["prompts"]["validation"] + results["prompts"]["test"] <= 30


def test_split_pairs_is_seeded_disjoint_and_refuses_too_few_rows():
    from datasets import Dataset

    rows = Dataset.from_list([{"i": i} for i in range(20)])
    parts, scaled = split_pairs(rows, [6, 6, 4, 4], seed=1)
    assert not scaled and [len(p) for p in parts] == [6, 6, 4, 4]
    seen = [i for p in parts for i in p["i"]]
    assert len(set(seen)) == 20 and split_pairs(rows, [6, 6, 4, 4], seed=1)[0][0]["i"] == parts[0]["i"]
    assert [len(p) for p in split_pairs(rows, [20, 10, 10], seed=1)[0]] == [10, 5, 5]
    with pytest.raises(InputError, match=r"20 rows cannot be split into parts of \[40, 2\]"):
        split_pairs(rows, [40, 2])
