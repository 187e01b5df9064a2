"""``python -m experiments.circuit --methods ...`` end to end on a tiny saved model: one row, one curve per method."""

from __future__ import annotations

import json

from experiments import circuit as circuit_experiment

FAST = ["--n-prompts", "60", "--circuit-prompts", "8", "--top-k", "0", "--n-bootstrap", "50", "--batch-size", "16",
        "--learn-steps", "3", "--learn-batch-size", "4", "--bootstrap-resamples", "2"]


def test_every_method_gets_a_row_a_curve_and_a_place_in_the_report(tiny_dir, tmp_path):
    methods = ["EAP", "EAP-IG-inputs", "matryoshka", "ensemble", "ilp", "positional"]
    out = tmp_path / "run"
    results = circuit_experiment.main(["--model", str(tiny_dir), "--out", str(out), *FAST, "--methods", *methods])
    comparison = results["comparison"]
    assert [r["method"] for r in comparison["rows"]] == methods and set(comparison["curves"]) == set(methods)
    for row in comparison["rows"]:
        assert row["n_heldout"] == comparison["n_heldout"] and row["seconds"] >= 0
        assert {"cpr", "cmd", "f@5%", "smallest_fraction"} <= set(row)
    assert comparison["curves"]["positional"]["heldout"]["spans"][0] == "bos"
    assert comparison["rows"][methods.index("ensemble")]["members"][:2] == ["EAP", "EAP-IG-inputs"]
    saved = json.loads((out / "results.json").read_text())
    assert saved["status"] == "complete" and saved["comparison"]["rows"] == json.loads(json.dumps(comparison["rows"]))
    assert (out / "figures" / "comparison_curves.json").exists()
    assert "Circuit methods side by side" in (out / "report.html").read_text()
