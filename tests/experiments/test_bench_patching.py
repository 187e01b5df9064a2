"""experiments.bench_patching end to end on a tiny saved model: ratios, equal results, agreement."""

import json

from experiments import bench_patching


def test_bench_patching_writes_ratios_and_equal_results(tiny_dir, tmp_path):
    out = tmp_path / "bench"
    bench_patching.main(["--model", str(tiny_dir), "--n-prompts", "4", "--n-shots", "1", "--tl-layers", "all",
                         "--check-senders", "-1", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    assert results["speedup_activation_patch_vs_tl"] > 0 and results["speedup_path_patch_vs_tl"] > 0
    assert results["max_abs_diff_activation_patch_vs_tl"] < 1e-4
    assert results["max_abs_diff_path_fast_vs_hooks"] < 1e-4
    assert not results["tl_full_sweep_extrapolated"]
    agreement = results["attribution_rank_agreement"]
    assert agreement["vs_path_patching_all"]["n_nodes"] == 4 * 2 + 2  # 2 layers of 4 heads, 2 MLPs
    assert -1 <= agreement["vs_activation_patching_heads"]["spearman"] <= 1
    knock = results["knockout"]
    assert knock["equal_accuracies"] and knock["speedup"] > 0 and knock["n_pool"] >= 8
    assert all(knock["equal_hits_vs_hooks"].values()) and set(knock["seconds"]) == set(bench_patching.KNOCKOUT_VARIANTS)
    assert knock["n_sets"] == len(knock["sets"]) == len(knock["accuracy_per_set"]) == 1 + 4 * (1 + 3)
    assert knock["fast_stats"]["rows"] == 4 * (knock["n_sets"] - 1)  # every ablated row scored once


def test_bench_patching_knockout_only(tiny_dir, tmp_path):
    out = tmp_path / "bench"
    bench_patching.main(["--model", str(tiny_dir), "--n-prompts", "4", "--n-shots", "1", "--knockout-only",
                         "--knockout-seeds", "1", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    assert results["n_shots"] == 1 and results["knockout"]["n_sets"] == 1 + 4 * 2
    assert all(results["knockout"]["equal_hits_vs_hooks"].values())


def test_bench_patching_refuses_an_earlier_run(tiny_dir, tmp_path):
    import pytest

    from experiments.runtime.run_folder import OutputExistsError

    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        bench_patching.main(["--model", str(tiny_dir), "--out", str(tmp_path)])
    assert (tmp_path / "results.json").read_text() == "{}"


def test_bench_patching_flags_come_from_its_config_and_are_checked_when_parsed(capsys):
    import pytest

    cfg = bench_patching.cli.parse_config(bench_patching.parser, bench_patching.BenchPatchingConfig,
                                          ["--threads", "1", "--tl-layers", "0,2", "--knockout-only"])
    assert cfg.threads == 1 and cfg.tl_layers == "0,2" and cfg.knockout_only and cfg.n_prompts == 64
    assert bench_patching.tl_layer_subset(cfg.tl_layers, 18) == [0, 2]
    assert bench_patching.tl_layer_subset("4", 18) == [0, 6, 11, 17] and bench_patching.tl_layer_subset("all", 3) == [0, 1, 2]
    for bad in (["--tl-layers", "0"], ["--tl-layers", "a"], ["--threads", "-1"]):
        with pytest.raises(SystemExit):
            bench_patching.cli.parse_config(bench_patching.parser, bench_patching.BenchPatchingConfig, bad)
    assert "--tl-layers: expected 'all'" in capsys.readouterr().err
