"""experiments.measure_edges end to end on a tiny saved model: strided exact patching and the baseline curve."""

import json

from circuits.graph import GraphLayout
from circuits.loading import load_model
from experiments import measure_edges


def test_measure_edges_times_strided_patching_and_writes_the_baseline_curve(tiny_dir, tmp_path):
    out = tmp_path / "edges"
    results = measure_edges.main(["--model", str(tiny_dir), "--n-prompts", "2", "--n-shots", "1", "--stride", "7",
                                  "--n-bootstrap", "50", "--threads", "1", "--out", str(out)])
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(results))
    n_edges = GraphLayout.of(load_model(str(tiny_dir))).n_edges
    patched = results["edge_patch"]
    assert results["n_edges_total"] == n_edges and patched["n_edges"] == len(range(0, n_edges, 7))
    assert patched["extrapolated"] and abs(patched["all_edges_wall_s"] - patched["wall_s"] * n_edges / patched["n_edges"]) < 1e-6
    assert len(patched["top_edges"]) == min(20, patched["n_edges"])
    curve = results["curve"]
    assert len(curve["faithfulness"]) == 10 and abs(curve["faithfulness"][-1]["value"] - 1) < 1e-4
    assert results["settings"]["stride"] == 7


def test_measure_edges_records_a_ctrl_c_as_failed_in_its_stage(tmp_path):
    import pytest

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    out = tmp_path / "edges"
    with pytest.raises(KeyboardInterrupt):
        measure_edges.main(["--model", "gemma-3-270m", "--out", str(out)], loader=interrupted)
    assert json.loads((out / "results.json").read_text())["status"] == "failed: load model: interrupted"
