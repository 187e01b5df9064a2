"""The finetune experiments end to end on a tiny random model (the loader is swapped for a tiny one)."""

import json
import runpy
import sys

import pytest

import circuits.loading
from circuits.runs import OutputExistsError
from circuits.testing import tiny_model


@pytest.fixture
def tiny_loader(monkeypatch):
    monkeypatch.setattr(circuits.loading, "load_model", lambda *a, **k: tiny_model(style="gemma", n_layers=2))


def _run(module, argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", [module, *argv])
    runpy.run_module(module, run_name="__main__")


def test_precise_sft_experiment_writes_results(tiny_loader, monkeypatch, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--out", str(out), "--k", "2", "--ablation-k", "1,2", "--ablation-mlps", "1", "--n-train", "16",
            "--steps", "2", "--batch-size", "8", "--micro-batch-size", "8", "--n-heldout", "2", "--n-transfer", "1",
            "--n-shots", "0", "--n-pydoc", "1", "--n-sentences", "3", "--n-rank-prompts", "4", "--lr", "1e-2",
            "--full-lr", "1e-3"]
    _run("experiments.precise_sft", argv, monkeypatch)
    results = json.loads((out / "results.json").read_text())
    assert {name: r["lr"] for name, r in results["runs"].items() if name in ("precise_k2", "full", "lora")} == {
        "precise_k2": 1e-2, "full": 1e-3, "lora": 2e-4}
    assert set(results["runs"]) == {"precise_k2", "full", "lora", "precise_k1", "precise_k1_mlp1", "precise_k2_mlp1"}
    assert results["runs"]["precise_k2"]["train"]["n_trainable"] < results["runs"]["full"]["train"]["n_trainable"]
    assert (out / "report.html").is_file()
    # the command line turns the OutputExistsError into one line on stderr and exit status 2
    with pytest.raises(SystemExit) as exit_info:
        _run("experiments.precise_sft", argv, monkeypatch)
    assert exit_info.value.code == 2
    assert isinstance(exit_info.value.__context__, OutputExistsError)
    assert "already holds a run" in capsys.readouterr().err


def test_bench_finetune_writes_ratios(tiny_loader, monkeypatch, tmp_path):
    _run("experiments.bench_finetune", ["--out", str(tmp_path), "--heads", "L1H0", "--steps", "2", "--rounds", "1",
                                        "--batch-size", "4", "--micro-batch-size", "4"], monkeypatch)
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["ratios"]) == {"full", "full_all"}
    for arm in ("full", "full_all"):
        assert results["ratios"][arm]["precise_optimizer_memory_ratio"] < 1
        assert results["methods"]["precise"]["n_trainable"] < results["methods"][arm]["n_trainable"]
    assert results["methods"]["full"]["n_trainable"] < results["methods"]["full_all"]["n_trainable"]
