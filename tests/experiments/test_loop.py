"""``python -m experiments.loop`` end to end on a tiny saved model: every step scored, both shifts, one report."""

from __future__ import annotations

import json

from experiments import loop

FAST = ["--n-prompts", "60", "--circuit-prompts", "6", "--n-heads", "2", "--steps", "2", "--train-batch", "4",
        "--n-heldout", "6", "--n-bootstrap", "50", "--batch-size", "16", "--drift-tokens", "24"]


def test_the_loop_scores_every_step_and_compares_the_circuits(tiny_dir, tmp_path):
    out = tmp_path / "run"
    results = loop.main(["--model", str(tiny_dir), "--out", str(out), *FAST])
    assert list(results["steps"]) == ["base", "tuned", "second expert", "merged"]
    for step in results["steps"].values():
        assert set(step["accuracy"]) == {"heldout/+", "heldout/*"}
        assert all(e["n"] == 6 and e["low"] <= e["value"] <= e["high"] for e in step["accuracy"].values())
    assert len(results["circuit_heads"]) <= 2 and results["tuning"]["steps"] == 2
    for key in ("shift_tuned", "shift_merged"):
        shift = results[key]
        assert {"reference_curve", "transferred_curve", "changed_curve", "jaccard", "spearman", "node_mass"} <= set(shift)
    # the chain path-patches each model once: the merge's reference map is the tuned model's map
    assert results["shift_merged"]["path_patching"]["reference"] == results["shift_tuned"]["path_patching"]["changed"]
    assert results["steps"]["base"]["drift_kl"]["value"] == 0 and results["settings"]["drift_tokens"] == 24
    saved = json.loads((out / "results.json").read_text())
    assert saved["status"] == "complete"
    assert {p.stem for p in (out / "figures").iterdir()} == {"tuned_circuit_shift", "tuned_shift_curves",
                                                               "tuned_explorer", "merged_circuit_shift",
                                                               "merged_shift_curves", "merged_explorer"}
    html = (out / "report.html").read_text()
    assert "The circuit after merging" in html and html.count('class="circuit-explorer"') == 2
    assert "compare base with tuned" in html and "compare tuned with merged" in html


def test_help_answers():
    import pytest

    with pytest.raises(SystemExit) as exit:
        loop.main(["--help"])
    assert exit.value.code == 0
