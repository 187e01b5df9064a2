"""experiments.bench_circuits end to end on a tiny saved model (the EAP-IG arm runs only where it is importable), on
its arithmetic prompts and on a prompt-pair file (``--task``)."""

import json

import pytest

from circuits.errors import InputError
from experiments import bench_circuits
from experiments.bench_circuits import eap_ig_arm as _eap_ig_arm
from experiments.bench_circuits.config import BenchCircuitsConfig
from experiments.runtime import cli


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


def _pair_file(tmp_path, rows):
    path = tmp_path / "my_pairs.csv"
    path.write_text("clean,corrupted,answer,distractor\n" + "\n".join(rows) + "\n")
    return path


def _gpt2_style(name, **kwargs):
    """A model loader: the tiny gpt2-style model (no norm after attention, so hannamw/EAP-IG's head scores are ours
    too and every edge compares; tests/circuits/test_pair_tasks.py compares the same model)."""
    from tests.tiny_models import tiny_model

    return tiny_model(style="gpt2", n_layers=2, seed=3)


def test_a_pair_file_is_benchmarked_by_its_own_metric_beside_eap_ig(tmp_path):
    """``--task <file>``: its pairs of one token length, every arm scoring them by their logit difference; where
    hannamw/EAP-IG is importable, its edge scores on the same pairs with the same metric equal ours."""
    import torch

    from circuits.pair_tasks import read_pairs

    rows = [f"ab{i}=,cd{i}=,{(i + 1) % 10},{(i + 5) % 10}" for i in range(6)]  # one token length
    rows += ["xyz0=,zwq0=,1,2", "ab=,abcd=,3,4"]  # another length; a twin cut to fit: both left out
    path = _pair_file(tmp_path, rows)
    out = tmp_path / "bench_pairs"
    bench_circuits.main(["--model", "tiny-gpt2-style", "--task", str(path), "--n-prompts", "8", "--ig-steps", "2",
                         "--exact-edges", "20", "--compare-per-stratum", "0", "--acdc-receivers", "2",
                         "--acdc-objective", "metric", "--acdc-threshold", "0.001", "--no-auto-circuit",
                         "--out", str(out)], loader=_gpt2_style)
    results = json.loads((out / "results.json").read_text())
    task, n_tokens = results["task"], results["n_tokens"]
    assert results["status"] == "complete" and results["settings"]["task"] == str(path) and results["op"] is None
    assert task["name"] == "my_pairs" and task["kind"] == "file"
    assert results["metric"] == task["metric"] == results["curve"]["metric"] == "logit_diff"
    assert task["n_rows"] == 8 and task["n_cf_cut"] == 1 and task["n_kept"] == results["n_prompts"] == 6
    assert task["n_tokens"] == n_tokens and task["token_lengths"] == {str(n_tokens): 6, str(n_tokens + 1): 1}
    model = _gpt2_style("")  # the model's own metric is the logit difference of the six pairs
    kept = read_pairs(path, model).rows.select(range(6))
    with torch.no_grad():
        end = model(torch.tensor(kept["tokens"]))[:, -1]
    answers, alts = torch.tensor([a[0] for a in kept["answer_token_ids"]]), torch.tensor(kept["alt_token_id"])
    by_hand = float((end.gather(1, answers[:, None]) - end.gather(1, alts[:, None])).mean())
    assert results["model_metric"]["reference"] == pytest.approx(by_hand, abs=1e-5)
    assert results["curve"]["full_metric"]["value"] == pytest.approx(by_hand, abs=1e-4)
    acdc = results["acdc"]  # the plain loop scores the same metric: the same circuit
    assert acdc["same_circuit"] and acdc["max_abs_damage_diff"] < 1e-4
    if _eap_ig_arm.eap_ig_missing():
        assert results["eap_ig_arm"].startswith("hannamw/EAP-IG is not importable")
        return
    for method in ("eap_ig_inputs", "eap"):  # the tolerance of the pair-file comparison in test_pair_tasks.py
        assert results[f"agreement_{method}"]["max_rel_diff_all_edges"] < 1e-4
    assert results["curve_eap_ig"]["full_metric"] == pytest.approx(by_hand, abs=1e-4)


def test_a_pair_task_refuses_the_arithmetic_flags_before_the_model_loads(tmp_path):
    """``--op`` and ``--n-shots`` shape arithmetic prompts: beside a pair task they are refused as the flags are
    read; an operation's name sets ``--op``."""

    def loader(name, **kwargs):
        raise AssertionError("the model loaded")

    out = ["--model", "never-loaded", "--out", str(tmp_path / "refused")]
    with pytest.raises(InputError, match=r"--n-shots 3 sets the solved examples before arithmetic prompts, and "
                                         r"--task ioi brings its own prompt pairs: drop --n-shots"):
        bench_circuits.main(["--task", "ioi", "--n-shots", "3", *out], loader=loader)
    with pytest.raises(InputError, match=r"--op - picks arithmetic prompts, and --task ioi brings its own prompt"):
        bench_circuits.main(["--task", "ioi", "--op", "-", *out], loader=loader)
    assert not (tmp_path / "refused").exists()
    assert cli.parse_config(bench_circuits.parser, BenchCircuitsConfig, ["--task", "division"]).op == "/"


def test_a_pair_file_without_pairs_of_one_length_is_refused(tiny_dir, tmp_path):
    path = _pair_file(tmp_path, ["ab=,abcd=,3,4", "xy=,x=,5,6"])  # one twin cut, one padded
    with pytest.raises(InputError, match=r"none of its 2 pairs has a corrupted prompt of its clean prompt's token "
                                         r"length"):
        bench_circuits.main(["--model", str(tiny_dir), "--task", str(path), "--out", str(tmp_path / "r")])
