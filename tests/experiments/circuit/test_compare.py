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


def test_stability_of_each_method_over_disjoint_prompt_sets(tiny_dir, tmp_path):
    out = tmp_path / "run"
    results = circuit_experiment.main(["--model", str(tiny_dir), "--out", str(out), *FAST,
                                       "--methods", "EAP", "EAP-IG-inputs", "ensemble", "--stability-sets", "2"])
    saved = json.loads((out / "results.json").read_text())["stability"]
    assert list(saved) == ["EAP", "EAP-IG-inputs", "ensemble"] and saved == json.loads(json.dumps(results["stability"]))
    assert "skipped" in saved["ensemble"]
    for name in ("EAP", "EAP-IG-inputs"):
        entry = saved[name]
        assert entry["method"] == name and entry["runs"] == [{"set": 0, "seed": 0}, {"set": 1, "seed": 0}]
        assert entry["n_per_set"] == 4 and entry["n_heldout"] == 4 and entry["fractions"] == [0.02, 0.05, 0.1]
        assert [j["fraction"] for j in entry["jaccard"]] == entry["fractions"]
        for j in entry["jaccard"]:
            assert j["n_pairs"] == 1 and (j["mean"] is None or 0.0 <= j["min"] <= j["mean"] <= j["max"] <= 1.0)
        assert entry["spearman"]["n_pairs"] == 1
        for core, sizes in zip(entry["core"], zip(*entry["circuit_edges"])):
            assert core["n_edges"] <= sum(sizes) and core["f"]["n"] == 4  # at least half of 2 runs: the union
    assert "Stability of each method" in (out / "report.html").read_text()


def test_too_few_correct_prompts_for_stability_is_said_before_the_comparison(tiny_dir, tmp_path, caplog):
    results = circuit_experiment.main(["--model", str(tiny_dir), "--out", str(tmp_path / "run"), *FAST,
                                       "--methods", "EAP", "--stability-sets", "6", "--n-prompts", "60"])
    assert "stability" not in results and "needs 28 correct prompts" in results["stability_skipped"]
    assert "needs 28 correct prompts" in caplog.text and "rows" in results["comparison"]


def test_acdc_eap_gp_and_ceap_run_beside_the_others_with_their_time_and_stability(tiny_dir, tmp_path):
    out = tmp_path / "run"
    methods = ["EAP-IG-inputs", "ACDC", "EAP-GP", "CEAP"]
    results = circuit_experiment.main(["--model", str(tiny_dir), "--out", str(out), *FAST, "--methods", *methods,
                                       "--acdc-threshold", "0.001", "--stability-sets", "2"])
    rows = {r["method"]: r for r in results["comparison"]["rows"]}
    assert list(rows) == methods and all(rows[m]["seconds"] >= 0 and rows[m]["cpu_seconds"] > 0 for m in methods)
    acdc = rows["ACDC"]["acdc"]
    assert acdc["threshold"] == 0.001 and acdc["objective"] == "kl" and acdc["n_tested"] == acdc["n_edges"]
    assert 0 <= acdc["n_edges_kept"] <= acdc["n_edges"] and "minus_EAP-IG-inputs" in rows["ACDC"]
    stability = results["stability"]
    for name in methods:
        assert stability[name]["method"] == name and "skipped" not in stability[name]
        assert stability[name]["runs"] == [{"set": 0, "seed": 0}, {"set": 1, "seed": 0}]
