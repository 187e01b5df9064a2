"""experiments.bench_finetune end to end on a tiny random model: memory and trainable-parameter ratios."""

import json

import pytest


pytestmark = pytest.mark.usefixtures("one_thread")


def test_bench_finetune_writes_ratios(run_main, tiny_loader, tmp_path):
    run_main("experiments.bench_finetune", ["--out", str(tmp_path), "--heads", "L1H0", "--steps", "2", "--rounds", "1",
                                            "--batch-size", "4", "--micro-batch-size", "4"], tiny_loader)
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["ratios"]) == {"full", "full_all"}
    for arm in ("full", "full_all"):
        assert results["ratios"][arm]["precise_optimizer_memory_ratio"] < 1
        assert results["methods"]["precise"]["n_trainable"] < results["methods"][arm]["n_trainable"]
    assert results["methods"]["full"]["n_trainable"] < results["methods"]["full_all"]["n_trainable"]
    assert "precise_nokv" not in results["methods"]


def test_bench_finetune_nokv_arm(run_main, tiny_loader, tmp_path):
    run_main("experiments.bench_finetune", ["--out", str(tmp_path), "--heads", "L1H0", "--steps", "2", "--rounds", "1",
                                            "--batch-size", "4", "--micro-batch-size", "4", "--no-full-all", "--nokv"],
             tiny_loader)
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["ratios"]) == {"full"}
    methods = results["methods"]
    assert methods["precise_nokv"]["n_trainable"] < methods["precise"]["n_trainable"]
    assert 0 < methods["precise_nokv"]["vs_precise_with_kv"]["optimizer_memory_ratio_to_precise_with_kv"] < 1
