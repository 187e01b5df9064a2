"""Run folders of the experiments: --overwrite never loses data, and a failing run never looks complete."""

import json
import runpy
import sys

import pytest

from circuits.runs import complete_run, prepare_run_dir


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
