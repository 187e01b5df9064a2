"""experiments.numbers end to end on a tiny saved model."""

import json

from experiments import numbers as numbers_experiment

ARGS = ["--n-numbers", "100", "--operand-max", "20", "--per-result", "1", "--n-shuffles", "20",
        "--patch-layers", "0", "1", "--n-pairs", "8", "--top-neurons", "12", "--batch-size", "32"]


def test_numbers_experiment_writes_results(tiny_dir, tmp_path):
    out = tmp_path / "run"
    numbers_experiment.main(["--model", str(tiny_dir), *ARGS, "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    assert len(results["numbers"]) == 2 * 3 and len(results["sums"]) == 2 * 3
    first = results["numbers"]["L0.resid_post"]
    assert first["spectrum"]["n_numbers"] == 100 and len(first["spectrum"]["power"]) == 50
    assert first["helix"]["r2_train"] <= first["helix"]["pca_r2_train"] + 1e-9  # PCA is the in-sample optimum
    assert set(first["probes"]) == {"2", "5", "10"}
    assert results["token_vectors"]["embed"]["numbers"] == [0, 9]
    assert len(results["frequency_filter"]["rows"]) == 6  # low, mid, high for MLPs and attention
    heur = results["heuristic_neurons"]
    assert heur["top_k"] == 12 and abs(sum(c["fraction"] for c in heur["census"].values()) - 1) < 1e-9
    assert any(r["type"] == "all top neurons" for r in heur["knockout"])
    rows = results["subspace_patching"]["rows"]
    if results["subspace_patching"]["n_pairs"]:  # the random model may answer too few prompts for pairs
        assert [r["layer"] for r in rows] == [0, 1]
        last = rows[-1]["whole"]["value"]  # the whole last residual is the counterfactual's: everything moves
        assert abs(last - 1) < 1e-3
    assert (out / "report.html").is_file() and (out / "figures.html").is_file()
