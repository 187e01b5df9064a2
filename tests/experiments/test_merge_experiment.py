"""experiments.merge end to end on a tiny random model (the loader is swapped for a tiny one)."""

import json
import runpy
import sys

import pytest
import torch

import circuits.loading
from tests.tiny_models import tiny_model


@pytest.fixture
def tiny_loader(monkeypatch):
    monkeypatch.setattr(circuits.loading, "load_model", lambda *a, **k: tiny_model(style="gemma", n_layers=2))
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _run(argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["experiments.merge", *argv])
    runpy.run_module("experiments.merge", run_name="__main__")


def test_merge_experiment_writes_table_and_report(tiny_loader, monkeypatch, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--out", str(out), "--steps", "1", "--batch-size", "4", "--micro-batch-size", "4", "--n-train", "8",
            "--n-val", "2", "--n-test", "2", "--n-samples", "2", "--cf-batch-size", "2", "--heads", "L1H0",
            "--linearity-samples", "1", "--linearity-alphas", "1.0", "--pairs", "--threads", "1"]
    _run(argv, monkeypatch)
    results = json.loads((out / "results.json").read_text())
    rows = {r["model"] for r in results["table"]}
    assert {"weight_average", "task_arithmetic", "ties", "dare_linear", "breadcrumbs", "consensus_ta", "della", "sce",
            "model_stock", "karcher", "tsv_m", "iso_c", "iso_cts",
            "closed form (model)", "closed form (layer)", "closed form (attn_mlp)", "closed form (head)",
            "circuit-aware (head in key layers)", "expert en_fr"} <= rows
    assert any("[add_word+mul]" in r for r in rows)
    assert results["models"]["task_arithmetic"]["config"]["lam"] in (0.5, 1.0)
    assert all(results["models"][m]["merge_seconds"] > 0 and "peak_mb" in results["models"][m] for m in ("ties", "iso_c"))
    assert (out / "report.html").is_file() and (out / "merged_best").is_dir()
    assert (out / "experts" / "mul").is_dir()
    assert results["key_heads"] == ["L1H0"] and results["key_heads_rule"]["source"] == "--heads"
    assert results["best_merge"]["name"] in results["models"] and results["settings"]["pairs"] is True
    with pytest.raises(SystemExit) as exit:  # the command line prints the error as one line, exit status 2
        _run(argv, monkeypatch)
    assert exit.value.code == 2 and "--overwrite" in capsys.readouterr().err


def test_merge_experiment_runs_a_mergekit_yaml(tiny_loader, monkeypatch, tmp_path):
    from merging import save_state_dict

    base = tiny_model(style="gemma", n_layers=2).state_dict()
    gen = torch.Generator().manual_seed(0)
    for name in ("a", "b"):
        save_state_dict({k: v + 0.01 * torch.randn(v.shape, generator=gen) if v.is_floating_point() and
                         not k.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos")) else v
                         for k, v in base.items()}, tmp_path / f"{name}.safetensors")
    save_state_dict(base, tmp_path / "base.safetensors")
    (tmp_path / "m.yml").write_text("models:\n  - {model: a.safetensors, parameters: {weight: 0.5, density: 0.5}}\n"
                                    "  - {model: b.safetensors, parameters: {weight: 0.5}}\n"
                                    "base_model: base.safetensors\nmerge_method: ties\n")
    out = tmp_path / "run"
    _run(["--config", str(tmp_path / "m.yml"), "--out", str(out)], monkeypatch)
    results = json.loads((out / "results.json").read_text())
    assert results["method"] == "ties" and results["seconds"] > 0 and (out / "merged").is_dir()


def test_merge_experiment_chooses_key_heads_by_path_patching(tiny_loader, monkeypatch, tmp_path):
    out = tmp_path / "run"
    _run(["--out", str(out), "--steps", "1", "--batch-size", "4", "--micro-batch-size", "4", "--n-train", "8",
          "--n-val", "2", "--n-test", "2", "--n-samples", "2", "--cf-batch-size", "2", "--methods", "task_arithmetic",
          "--levels", "layer", "--k", "1", "--n-patch", "4", "--linearity-samples", "0", "--threads", "1"], monkeypatch)
    results = json.loads((out / "results.json").read_text())
    rule = results["key_heads_rule"]
    assert rule["source"] == "path_patching" and rule["combine"] == "union" and rule["ops"] == ["+", "*"]
    assert 1 <= len(results["key_heads"]) <= 2  # the top head of + and of *, once each
    assert set(results["models"]) >= {"task_arithmetic", "closed form (layer)", "circuit-aware (head in key layers)"}
    assert results["best_merge"]["name"] in {"task_arithmetic", "closed form (layer)", "circuit-aware (head in key layers)"}
