"""experiments.bench_circuits end to end on a tiny saved model (the EAP-IG arm runs only where it is importable)."""

import json

from experiments import _eap_ig_arm, bench_circuits


def test_bench_circuits_writes_times_curve_and_rank_agreement(tiny_dir, tmp_path, capsys):
    out = tmp_path / "bench"
    bench_circuits.main(["--model", str(tiny_dir), "--n-prompts", "4", "--n-shots", "1", "--ig-steps", "2",
                         "--exact-edges", "40", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    seconds = results["seconds"]
    assert seconds["edge_attribution_eap_ig_inputs"] > 0 and seconds["faithfulness_curve"] > 0
    curve = results["curve"]
    assert len(curve["faithfulness"]) == 10 and curve["n_prompts"] == 4
    assert abs(curve["faithfulness"][-1]["value"] - 1) < 1e-4  # every edge kept: the model itself
    assert curve["cpr"]["low"] <= curve["cpr"]["value"] <= curve["cpr"]["high"]
    rank = results["spearman_vs_exact"]
    assert rank["n_edges"] == 40 and -1 <= rank["eap_ig_inputs"] <= 1
    printed = capsys.readouterr().out
    assert "faithfulness curve" in printed
    if _eap_ig_arm.eap_ig_missing():
        assert "EAP-IG arm skipped" in printed and results["eap_ig_arm"].startswith("hannamw/EAP-IG is not importable")
    else:  # tiny gemma-style model: non-head senders agree exactly, head senders follow different conventions
        assert results["agreement_eap_ig_inputs"]["max_rel_diff_non_head_senders"] < 1e-4
        assert results["speedup_attribution"] > 0
