"""experiments.bench_circuits end to end on a tiny saved model (the EAP-IG arm runs only where it is importable)."""

import json

import pytest

from experiments import bench_circuits
from experiments.bench_circuits import eap_ig_arm as _eap_ig_arm


def test_bench_circuits_writes_times_curve_and_rank_agreement(tiny_dir, tmp_path, capsys):
    from safetensors.torch import load_file

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
    scores = load_file(str(out / "edge_scores.safetensors"))
    assert scores["ours_eap_ig_inputs"].shape == scores["ours_eap"].shape
    assert ("eap_ig_tool_eap_ig_inputs" in scores) == (not _eap_ig_arm.eap_ig_missing())
    assert results["settings"]["ig_steps"] == 2 and results["settings"]["exact_edges"] == "40"
    fast_vs_hook = results["edge_patch_fast_vs_hook_path"]
    assert fast_vs_hook["speedup"] > 0 and fast_vs_hook["max_abs_diff"] <= 1e-4 * max(1.0, fast_vs_hook["max_abs_effect"])


def test_bench_circuits_all_edges_saves_the_exact_effects(tiny_dir, tmp_path):
    from safetensors.torch import load_file

    from circuits.graph_io import load_eap_json

    out = tmp_path / "bench_all"
    bench_circuits.main(["--model", str(tiny_dir), "--n-prompts", "3", "--n-shots", "1", "--ig-steps", "1",
                         "--exact-edges", "all", "--compare-per-stratum", "1", "--no-curve", "--no-eap-ig",
                         "--time-prefix-rotary", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    # the fast path's prefix keys rotated once vs at every call (tiny gemma-style model: rotary): the same effects
    once = results["exact_prefix_rotary_once"]
    assert once["n_edges"] == results["n_edges"] and once["max_abs_diff"] == 0.0 and once["speedup_cpu"] > 0
    n_edges = results["n_edges"]
    rank = results["spearman_vs_exact"]
    assert rank["n_edges"] == n_edges and rank["n_top_1pct"] >= 3 and -1 <= rank["eap_top_1pct"] <= 1
    saved = load_file(str(out / "exact_edges.safetensors"))
    assert saved["per_prompt"].shape == (n_edges, 3) and saved["edges"].shape == (n_edges, 2)
    graph = load_eap_json(out / "exact_edges_eap.json")
    f, b = saved["edges"][:, 0], saved["edges"][:, 1]
    assert abs(float(graph.scores[f, b].double().sum() - saved["per_prompt"].mean(1).sum())) < 1e-3
    top = max(results["exact_largest_effects"].values(), key=abs)
    assert abs(abs(top) - float(graph.scores[f, b].abs().max())) < 1e-6


def test_bench_circuits_rejects_a_bad_edge_count(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_circuits.main(["--exact-edges", "some"])
    assert exit_info.value.code == 2 and "expected 'all' or an integer >= 0" in capsys.readouterr().err


def test_bench_circuits_without_attribution_times_exact_patching_only(tiny_dir, tmp_path):
    out = tmp_path / "exact_only"
    results = bench_circuits.main(["--model", str(tiny_dir), "--n-prompts", "3", "--n-shots", "1", "--no-attribution",
                                   "--exact-edges", "12", "--time-prefix-rotary", "--compare-per-stratum", "0",
                                   "--out", str(out)])
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(results))
    assert "edge_attribution_eap" not in results["seconds"] and "spearman_vs_exact" not in results
    assert "curve" not in results and results["exact_progress"]["n_edges_done"] == 12
    assert results["exact_prefix_rotary_once"]["max_abs_diff"] == 0.0
    assert results["seconds"]["edge_patch_cpu"] > 0 and results["seconds"]["edge_patch_rotary_every_call_cpu"] > 0


def test_bench_circuits_records_a_failing_stage_and_keeps_the_earlier_ones(tiny_dir, tmp_path):
    from circuits.loading import load_model

    def broken_model(name, **kwargs):  # the injected loader: a model whose forward pass raises
        model = load_model(name, **kwargs)

        def forward(*args, **kwargs):
            raise KeyError("broken")

        model.forward = forward
        return model

    out = tmp_path / "failing"
    with pytest.raises(KeyError):
        bench_circuits.main(["--model", str(tiny_dir), "--n-prompts", "3", "--n-shots", "1", "--no-attribution",
                             "--exact-edges", "0", "--compare-per-stratum", "0", "--out", str(out)], loader=broken_model)
    saved = json.loads((out / "results.json").read_text())
    assert saved["status"] == "failed: model metrics: KeyError: 'broken'" and "load model" in saved["seconds"]
    assert saved["n_prompts"] == 3  # the earlier stages' results are kept


def test_the_head_edge_verdict_and_the_learned_mask_timing(tiny_dir, tmp_path):
    out = tmp_path / "bench"
    results = bench_circuits.main(["--model", str(tiny_dir), "--n-prompts", "4", "--n-shots", "1", "--ig-steps", "2",
                                   "--exact-edges", "0", "--compare-per-stratum", "0", "--no-curve", "--no-eap-ig",
                                   "--head-edges", "30", "--learn-steps", "2", "--out", str(out)])
    verdict = results["head_edge_verdict"]
    assert verdict["n_edges"] == 30
    assert set(verdict["comparisons"]) == {f"{c} vs exact {n}" for c in ("frozen", "pre-norm", "recompute")
                                           for n in ("frozen", "recompute")}
    for row in verdict["comparisons"].values():
        assert -1 <= row["spearman"]["value"] <= 1 and 0 <= row["top_1pct_overlap"] <= 1
    learned = results["learned_mask"]
    assert learned["steps"] == 2 and learned["seconds_per_step"] > 0 and learned["peak_rss_mb"] > 0


def test_a_peer_timing_that_did_not_run_reads_not_run_with_the_reason(tmp_path, capsys):
    """The table printed 'nan' in hannamw/EAP-IG's column when its arm was skipped, without saying why."""
    from types import SimpleNamespace

    timer = SimpleNamespace(seconds={"edge_attribution_eap_ig_inputs": 2.0, "faithfulness_curve": 3.0})
    run = SimpleNamespace(timer=timer, out=tmp_path, results={"eap_ig_arm": "skipped by --no-eap-ig"})
    bench_circuits.print_table(run)
    printed = capsys.readouterr().out
    assert "nan" not in printed and printed.count("not run") == 3
    assert "(hannamw/EAP-IG not run: skipped by --no-eap-ig)" in printed


@pytest.mark.parametrize("objective", ["kl", "metric"])
def test_bench_circuits_times_acdc_beside_the_plain_edge_by_edge_loop(tiny_dir, tmp_path, capsys, objective):
    from experiments.bench_circuits import acdc_arm

    out = tmp_path / "bench_acdc"
    bench_circuits.main(["--model", str(tiny_dir), "--n-prompts", "4", "--n-shots", "1", "--no-attribution",
                         "--exact-edges", "0", "--compare-per-stratum", "0", "--acdc-receivers", "6",
                         "--acdc-threshold", "0.001", "--acdc-objective", objective, "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    acdc = results["acdc"]
    assert acdc["objective"] == objective
    assert acdc["n_receivers"] == 6 and acdc["n_tested"] == acdc["plain_n_tested"] > 0
    assert acdc["same_circuit"] and acdc["max_abs_damage_diff"] < 1e-4
    assert acdc["speedup_wall"] > 0 and results["seconds"]["acdc_plain_loop"] > 0
    if objective == "metric":  # auto-circuit's ACDC has no other objective than the KL
        assert "measures the KL only" in acdc["auto_circuit"]
    elif acdc_arm.auto_circuit_missing():
        assert acdc["auto_circuit"].startswith("auto-circuit is not importable")
    if isinstance(acdc["auto_circuit"], str):
        assert "auto-circuit arm skipped" in capsys.readouterr().out


def test_bench_circuits_can_time_acdc_without_the_plain_loop(tiny_dir, tmp_path, capsys):
    out = tmp_path / "bench_acdc"
    bench_circuits.main(["--model", str(tiny_dir), "--n-prompts", "4", "--n-shots", "1", "--no-attribution",
                         "--exact-edges", "0", "--compare-per-stratum", "0", "--acdc-receivers", "2",
                         "--no-plain-acdc", "--no-auto-circuit", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    assert results["acdc"]["plain_loop"] == "skipped by --no-plain-acdc" and results["acdc"]["n_tested"] > 0
    assert "acdc_plain_loop" not in results["seconds"]
    assert "this toolkit (s)" not in capsys.readouterr().out  # no attribution, so no table of it
