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


def test_a_stride_that_leaves_too_few_edges_is_refused_before_the_sweeps(tmp_path):
    """--stride beyond the edge count patched one edge, and the run printed 'Spearman = nan' without a word."""
    from circuits.errors import InputError

    save_model(tiny_model(style="gemma", n_layers=2, seed=5), tmp_path / "model")
    with pytest.raises(InputError, match=r"--stride 100000 patches 1 of the \d+ edges of .*model exactly; their "
                                         r"Spearman correlation with EAP-IG needs at least 3: give --stride \d+ or less"):
        edge_sweeps.main(["--model", str(tmp_path / "model"), "--stride", "100000", "--device", "cpu",
                          "--threads", "1", "--out", str(tmp_path / "run")])
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert "edge_attribution_s" not in results  # no sweep ran


def test_an_undefined_spearman_says_why_instead_of_printing_nan(capsys):
    """Equal EAP-IG scores over the patched edges gave 'Spearman(EAP-IG, exact) = nan' and NaN in results.json."""
    from types import SimpleNamespace

    from circuits.graph import Graph, GraphLayout
    from patching.edges.distributed import Shard
    from patching.edges.patch import EdgeEffects

    model = tiny_model(style="gemma", n_layers=1)
    layout = GraphLayout.of(model)
    edges = [tuple(e) for e in layout.real_edge_mask.nonzero().tolist()][:4]
    effects = EdgeEffects(layout, edges, torch.arange(8.0).reshape(4, 2), "logit", 0.0)
    graph = Graph(layout, torch.where(layout.real_edge_mask, 0.5, torch.nan))
    curve = SimpleNamespace(cpr=None, cmd=None, to_dict=lambda: {})
    times = {"edge_attribution_s": 1.0, "edge_patch_s": 1.0, "faithfulness_curve_s": 1.0}
    sweeps = edge_sweeps.Sweeps(layout, edges, graph, effects, curve, times)
    results = edge_sweeps.summarize(edge_sweeps.EdgeSweepsConfig(), Shard(), model, [0, 1], sweeps)
    assert results["spearman_eap_ig_vs_exact"] is None
    assert results["spearman_undefined"] == "the EAP-IG scores of the 4 patched edges are all equal, so they rank nothing"
    assert "Spearman(EAP-IG, exact) = undefined (the EAP-IG scores" in capsys.readouterr().out
