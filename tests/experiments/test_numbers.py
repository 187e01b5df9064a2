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


def test_patch_layers_the_model_lacks_and_overlapping_bands_are_refused(tiny_dir, tmp_path):
    """--patch-layers 0 7 on a 2-layer model patched layer 0, skipped 7 and ended complete; overlapping bands
    filtered the same frequencies twice and left the mid control band empty, also complete."""
    import pytest

    from circuits.errors import InputError

    def no_model(*args, **kwargs):
        pytest.fail("the model was loaded")

    with pytest.raises(InputError, match=r"--high-max-period 25 is not below --low-min-period 20: the low band .* and "
                                         r"the high band .* would share frequencies"):
        numbers_experiment.main(["--model", str(tiny_dir), "--high-max-period", "25", "--out", str(tmp_path / "a")],
                                loader=no_model)
    assert not (tmp_path / "a").exists()
    out = tmp_path / "b"
    with pytest.raises(InputError, match=r"--patch-layers 0 7: \[7\] is not a layer of .*tiny, which has layers 0\.\.1\."):
        numbers_experiment.main(["--model", str(tiny_dir), *ARGS[:8], "--patch-layers", "0", "7", "--out", str(out)])
    saved = json.loads((out / "results.json").read_text())
    assert saved["status"].startswith("failed: numbers: InputError") and set(saved["seconds"]) == {"load model"}
    with pytest.raises(InputError, match=r"--patch-layers patches resid_post, which --components attn_out leaves out"):
        numbers_experiment.main(["--model", str(tiny_dir), "--components", "attn_out", "--patch-layers", "1",
                                 "--out", str(tmp_path / "c")])


def test_too_few_numbers_are_refused_when_the_flags_are_parsed(tiny_dir, tmp_path, capsys):
    """--n-numbers 3 failed only after the model loaded, in a message about h[n, d] that never named the flag."""
    import pytest

    from circuits.errors import InputError
    from experiments.runtime import cli

    def no_model(*args, **kwargs):
        pytest.fail("the model was loaded")

    argv = ["--model", str(tiny_dir), *ARGS[2:], "--n-numbers", "3", "--out", str(tmp_path / "a")]
    with pytest.raises(SystemExit) as exit_info:
        cli.run_cli(lambda a: numbers_experiment.main(a, loader=no_model), "numbers", argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert err.startswith("python -m experiments.numbers: error: --n-numbers must be at least 12, got 3: the helix "
                          "fit needs more numbers than its 9 basis functions once 20% are held out for testing. Give "
                          "--n-numbers 12 or more")
    assert not (tmp_path / "a").exists()
    with pytest.raises(InputError, match=r"^--n-numbers must be at least 12, got 11: "):  # 11 failed in fit_helix
        numbers_experiment.NumbersConfig(n_numbers=11)
    assert numbers_experiment.NumbersConfig(n_numbers=12).n_numbers == 12  # 12 runs end to end


def test_too_few_sum_prompts_are_refused_when_the_flags_are_parsed(tiny_dir, tmp_path, capsys):
    """--operand-max 5 --per-result 1 failed in fit_helix only after the model had loaded and the sums run."""
    import pytest

    from circuits.errors import InputError
    from experiments.runtime import cli

    def no_model(*args, **kwargs):
        pytest.fail("the model was loaded")

    argv = ["--model", str(tiny_dir), "--operand-max", "5", "--per-result", "1", "--out", str(tmp_path / "a")]
    with pytest.raises(SystemExit) as exit_info:
        cli.run_cli(lambda a: numbers_experiment.main(a, loader=no_model), "numbers", argv)
    assert exit_info.value.code == 2 and not (tmp_path / "a").exists()
    assert "--operand-max 5 with --per-result 1 leaves as few as 9 sum prompts" in capsys.readouterr().err
    with pytest.raises(InputError, match=r"^--operand-max 5 with --per-result 1 leaves as few as 9 sum prompts to fit "
                                         r"the helix on .* Give --operand-max 6 or more \(with --per-result 1\)"):
        numbers_experiment.NumbersConfig(operand_max=5, per_result=1)
    with pytest.raises(InputError, match=r"^--operand-max 0 with --per-result 3 .* Give --operand-max 3 or more"):
        numbers_experiment.NumbersConfig(operand_max=0, per_result=3)
    assert numbers_experiment.NumbersConfig(operand_max=3, per_result=4).operand_max == 3  # 12 prompts: it runs
