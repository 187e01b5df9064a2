"""experiments.edge_sweeps on one process: a saved tiny model, the results it writes (the two-process split is
checked against the plain calls in tests/patching/edges/test_distributed.py)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from circuits.graph_io import load_eap_json
from circuits.model_cache import save_model
from tests.tiny_models import tiny_model
from experiments import edge_sweeps


def test_one_process_run_writes_its_results(tmp_path):
    save_model(tiny_model(style="gemma", n_layers=2, seed=5), tmp_path / "model")
    edge_sweeps.main(["--model", str(tmp_path / "model"), "--n-prompts", "6", "--stride", "4", "--n-bootstrap", "50",
                      "--device", "cpu", "--threads", "1", "--out", str(tmp_path / "run")])
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "complete" and results["n_processes"] == 1 and results["n_prompts"] == 6
    assert results["n_edges_patched"] == -(-results["n_edges_total"] // 4)
    assert results["threads"] == 1 and results["settings"]["stride"] == 4 and results["settings"]["threads"] == 1
    assert -1 <= results["spearman_eap_ig_vs_exact"] <= 1 and len(results["curve"]["faithfulness"]) == 10
    assert results["curve"]["faithfulness"][-1]["value"] == pytest.approx(1.0, abs=1e-5)
    assert 0 < results["edge_patch_cpu_s"] and 0 < results["edge_attribution_cpu_s"]
    # the exact effects are saved, per prompt, beside an EAP-IG graph file of their means
    saved = load_file(str(tmp_path / "run" / "exact_edges.safetensors"))
    assert saved["per_prompt"].shape == (results["n_edges_patched"], 6)
    graph = load_eap_json(tmp_path / "run" / "exact_edges_eap.json")
    f, b = saved["edges"].T
    assert torch.allclose(graph.scores[f, b], saved["per_prompt"].double().mean(1).float(), atol=1e-6)
