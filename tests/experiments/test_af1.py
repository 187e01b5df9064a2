"""experiments.af1 end to end on a tiny saved model, including a format the model never answers."""

import json

from experiments import af1 as af1_experiment
from patching.all_for_one import AF1Runner
from patching.all_for_one.runner import NoEvalPromptsError

ARGS = ["--n-prompts", "30", "--operand-max", "5", "--batch-size", "16"]


def test_af1_experiment_writes_results(tiny_dir, tmp_path):
    out = tmp_path / "run"
    af1_experiment.main(["--model", str(tiny_dir), *ARGS, "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    search = results["search"]
    assert 0 <= search["l_wait"] <= results["n_layers"] and 0 <= search["faithfulness"] <= 1
    assert len(results["per_template"]) == 5  # formats this random model never answers are rows with n_eval 0
    held = results["held_out_selection"]
    assert "skipped" in held or not set(held["selection_prompts"]) & set(held["report_prompts"])
    assert "resid_pre" in results["layer_convention"] and results["paper"]["l_wait_ours"] == 15
    assert results["means"] == "cross-fit" and results["cama_fallback_fraction"] == results["cama_counts"]["fallback_fraction"]
    counts = results["search_counts"]
    assert sum(c["n_eval_correct"] for c in counts.values()) == search["n_eval"]
    assert all(c["n_one_token"] <= c["n_prompts"] for c in counts.values())
    for rule in held.get("rules", {}).values():
        assert rule["held_out_faithfulness"]["n"] == len(held["report_prompts"])
    for rule in held.get("cross_fit", {}).values():  # both halves' held-out scores pooled: every eval prompt once
        assert rule["pooled_faithfulness"]["n"] == search["n_eval"] and None not in rule["prompt_cells"]
    assert (out / "report.html").is_file() and (out / "heatmap.html").is_file()


def test_a_format_without_correct_prompts_is_reported_not_fatal(tiny_dir, tmp_path, monkeypatch):
    real = AF1Runner.cross_fitted.__func__
    calls = []

    def cross_fitted(cls, model, data, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first of the authors' formats, after the grid search
            raise NoEvalPromptsError("AF1 needs at least one evaluation prompt (none were answered correctly?).")
        return real(cls, model, data, *args, **kwargs)

    monkeypatch.setattr(AF1Runner, "cross_fitted", classmethod(cross_fitted))
    out = tmp_path / "run"
    af1_experiment.main(["--model", str(tiny_dir), *ARGS, "--out", str(out)])
    rows = json.loads((out / "results.json").read_text())["per_template"]
    assert rows[0]["n_eval"] == 0 and "answered correctly" in rows[0]["skipped"]
    assert all("faithfulness" in r for r in rows if r["n_eval"]) and any(r["n_eval"] for r in rows)


def test_af1_experiment_split_means(tiny_dir, tmp_path):
    out = tmp_path / "run"
    results = af1_experiment.main(["--model", str(tiny_dir), *ARGS, "--means", "split", "--no-authors", "--out", str(out)])
    assert results["means"] == "split" and results["n_folds"] is None
    assert all(c["n_one_token"] == c["n_prompts"] for c in results["search_counts"].values())


def test_af1_isolation_variants_are_paired(tiny_dir, tmp_path):
    out = tmp_path / "run"
    results = af1_experiment.main(["--model", str(tiny_dir), *ARGS, "--isolate", "1,1", "0,2", "--out", str(out)])
    iso = results["isolation"]
    assert set(iso["variants"]) == {"main", "abp_only", "others_full_peek", "five_folds", "all_fallback"}
    main = iso["variants"]["main"]["cells"]["1,1"]
    assert main["minus_main"]["value"] == 0 and main["faithfulness"]["n"] == iso["n_eval"]
    assert iso["variants"]["all_fallback"]["fallback_fraction"] > 0 == iso["variants"]["main"]["fallback_fraction"]
    assert json.loads((out / "results.json").read_text())["isolation"]["cells"] == [[1, 1], [0, 2]]


def test_af1_isolation_rejects_bad_cells(tiny_dir, tmp_path):
    import pytest

    with pytest.raises(ValueError, match="W,T"):
        af1_experiment.main(["--model", str(tiny_dir), *ARGS, "--isolate", "7-6", "--out", str(tmp_path / "a")])
    with pytest.raises(ValueError, match="at most n_layers"):
        af1_experiment.main(["--model", str(tiny_dir), *ARGS, "--isolate", "1,5", "--out", str(tmp_path / "b")])


def test_one_fold_of_cross_fitted_means_is_refused_when_the_flags_are_parsed():
    """--n-folds 1 passed the flag check and failed in cross_fit_folds only after the model had loaded."""
    import pytest

    from circuits.errors import InputError

    with pytest.raises(InputError, match=r"--n-folds 1 with --means cross-fit: .* needs --n-folds 2 or more "
                                         r"\(or --means split\)"):
        af1_experiment.AF1ExperimentConfig(n_folds=1)
    assert af1_experiment.AF1ExperimentConfig(n_folds=1, means="split").n_folds == 1  # unused by split means
