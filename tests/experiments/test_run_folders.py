"""Run folders of the experiments: --overwrite never loses data, and a failing run never looks complete."""

import json
import runpy
import sys

import pytest

from experiments.runtime.run_folder import complete_run, prepare_run_dir


def _run(module, argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", [module, *argv])
    runpy.run_module(module, run_name="__main__")


def test_precise_sft_overwrite_with_a_bad_model_deletes_nothing(monkeypatch, tmp_path):
    out = prepare_run_dir(tmp_path / "run")
    (out / "runs").mkdir()
    (out / "runs" / "weights.safetensors").write_bytes(b"trained for hours")
    complete_run(out, {"accuracy": 0.9})
    with pytest.raises((ValueError, LookupError, SystemExit)):  # the model name is refused
        _run("experiments.precise_sft", ["--out", str(out), "--overwrite", "--model", "bogus-model-name"], monkeypatch)
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert (aside / "runs" / "weights.safetensors").read_bytes() == b"trained for hours"
    assert json.loads((aside / "results.json").read_text())["status"] == "complete"
    assert json.loads((out / "results.json").read_text())["status"] != "complete"


def test_precise_sft_overwrite_refuses_a_folder_the_toolkit_did_not_write(monkeypatch, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises((FileExistsError, SystemExit)):
        _run("experiments.precise_sft", ["--out", str(tmp_path), "--overwrite", "--model", "bogus-model-name"],
             monkeypatch)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


FAST = ["--n-prompts", "60", "--top-k", "2", "--knockout-prompts", "6", "--knockout-ks", "1,2",
        "--knockout-seeds", "1", "--transfer-prompts", "6", "--af1-stride", "1", "--af1-prompts", "30",
        "--batch-size", "16", "--circuit-prompts", "0"]


def test_a_failing_last_stage_keeps_earlier_results_and_nothing_stale(tiny_dir, tmp_path, monkeypatch):
    from experiments import arithmetic as _arithmetic
    from experiments.arithmetic import stages as _arithmetic_stages
    from patching.all_for_one.search import NoEvalPromptsError

    out = tmp_path / "run"
    _arithmetic.main("+", ["--model", str(tiny_dir), "--out", str(out), *FAST])
    assert json.loads((out / "results.json").read_text())["status"] == "complete"
    assert (out / "figures" / "path_patching.json").is_file() and (out / "report.html").is_file()

    def no_eval_prompts(model, cfg):
        raise NoEvalPromptsError("the model answers none of the AF1 prompts")

    monkeypatch.setattr(_arithmetic_stages, "_af1_grid", no_eval_prompts)  # the AF1 stage's grid builder
    with pytest.raises(NoEvalPromptsError):
        _arithmetic.main("+", ["--model", str(tiny_dir), "--out", str(out), "--overwrite", *FAST])
    saved = json.loads((out / "results.json").read_text())
    assert saved["status"].startswith("failed: AF1 grid: NoEvalPromptsError: the model answers none")
    assert len(saved["key_heads"]) == 2 and saved["knockout"]["ks"] == [1, 2]  # earlier stages kept
    assert "logit_lens" in saved and "AF1 grid" in saved["seconds"]
    # nothing of the old complete run is left looking current: no report, no figures
    assert not (out / "report.html").exists() and not (out / "figures").exists()
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert json.loads((aside / "results.json").read_text())["status"] == "complete"
