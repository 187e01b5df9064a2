"""experiments.merge end to end on a tiny random model (the injected loader returns a tiny one)."""

import importlib
import json

import numpy as np
import pytest
import torch

from tests.tiny_models import tiny_model

MERGE = "experiments.merge"


def test_merge_experiment_writes_table_and_report(run_main, tiny_loader, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--out", str(out), "--steps", "1", "--batch-size", "4", "--micro-batch-size", "4", "--n-train", "8",
            "--n-val", "2", "--n-test", "2", "--n-samples", "2", "--cf-batch-size", "2", "--heads", "L1H0",
            "--linearity-samples", "1", "--linearity-alphas", "1.0", "--pairs", "--threads", "1"]
    run_main(MERGE, argv, tiny_loader)
    results = json.loads((out / "results.json").read_text())
    rows = {r["model"] for r in results["table"]}
    assert {"weight_average", "task_arithmetic", "ties", "dare_linear", "breadcrumbs", "consensus_ta", "della", "sce",
            "model_stock", "karcher", "tsv_m", "iso_c", "iso_cts",
            "closed form (model)", "closed form (layer)", "closed form (attn_mlp)", "closed form (head)",
            "circuit-aware (head in key layers)", "expert en_fr"} <= rows
    assert any("[add_word+mul]" in r for r in rows)
    assert results["models"]["task_arithmetic"]["config"]["lam"] in (0.5, 1.0)
    assert all(results["models"][m]["merge_seconds"] > 0 and "peak_mb" in results["models"][m] for m in ("ties", "iso_c"))
    assert (out / "report.html").is_file() and (out / "merged_best").is_dir()
    assert (out / "experts" / "mul").is_dir()
    assert results["key_heads"] == ["L1H0"] and results["key_heads_rule"]["source"] == "--heads"
    assert results["best_merge"]["name"] in results["models"] and results["settings"]["pairs"] is True
    with pytest.raises(SystemExit) as exit:  # the command line prints the error as one line, exit status 2
        run_main(MERGE, argv, tiny_loader)
    assert exit.value.code == 2 and "--overwrite" in capsys.readouterr().err


def test_merge_experiment_runs_a_mergekit_yaml(run_main, tiny_loader, tmp_path):
    from merging.state_dicts import save_state_dict

    base = tiny_model(style="gemma", n_layers=2).state_dict()
    gen = torch.Generator().manual_seed(0)
    for name in ("a", "b"):
        save_state_dict({k: v + 0.01 * torch.randn(v.shape, generator=gen) if v.is_floating_point() and
                         not k.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos")) else v
                         for k, v in base.items()}, tmp_path / f"{name}.safetensors")
    save_state_dict(base, tmp_path / "base.safetensors")
    (tmp_path / "m.yml").write_text("models:\n  - {model: a.safetensors, parameters: {weight: 0.5, density: 0.5}}\n"
                                    "  - {model: b.safetensors, parameters: {weight: 0.5}}\n"
                                    "base_model: base.safetensors\nmerge_method: ties\n")
    out = tmp_path / "run"
    run_main(MERGE, ["--config", str(tmp_path / "m.yml"), "--out", str(out)], tiny_loader)
    results = json.loads((out / "results.json").read_text())
    assert results["method"] == "ties" and results["seconds"] > 0 and (out / "merged").is_dir()


def test_merge_experiment_chooses_key_heads_by_path_patching(run_main, tiny_loader, tmp_path):
    out = tmp_path / "run"
    run_main(MERGE, ["--out", str(out), "--steps", "1", "--batch-size", "4", "--micro-batch-size", "4",
                     "--n-train", "8", "--n-val", "2", "--n-test", "2", "--n-samples", "2", "--cf-batch-size", "2",
                     "--methods", "task_arithmetic", "--levels", "layer", "--k", "1", "--n-patch", "4",
                     "--linearity-samples", "0", "--threads", "1"], tiny_loader)
    results = json.loads((out / "results.json").read_text())
    rule = results["key_heads_rule"]
    assert rule["source"] == "path_patching" and rule["combine"] == "union" and rule["ops"] == ["+", "*"]
    assert 1 <= len(results["key_heads"]) <= 2  # the top head of + and of *, once each
    assert set(results["models"]) >= {"task_arithmetic", "closed form (layer)", "circuit-aware (head in key layers)"}
    assert results["best_merge"]["name"] in {"task_arithmetic", "closed form (layer)", "circuit-aware (head in key layers)"}


PAPER_REGIME = ["--steps", "2", "--batch-size", "4", "--micro-batch-size", "4", "--n-train", "8", "--n-val", "2",
                "--n-test", "3", "--n-shots", "0", "--n-samples", "2", "--cf-batch-size", "2", "--levels",
                "attn_mlp,model", "--methods", "weight_average,task_arithmetic,ties", "--cf-seeds", "2",
                "--cf-positions", "all,answer", "--no-circuit-aware", "--mul-operands", "2,5", "--max-number", "40",
                "--n-test-numbers", "3", "--n-val-numbers", "2", "--linearity-samples", "0", "--no-save-best", "--no-base-test",
                "--late-methods", "ties", "--threads", "1"]


def test_paper_regime_options_seeds_positions_and_paired_intervals(run_main, tiny_loader, tmp_path, capsys):
    out = tmp_path / "run"
    # an unreachable validation target: every expert trains all --steps, checked after each step
    run_main(MERGE, ["--out", str(out), "--target-gain", "1.0", "--check-every", "1", *PAPER_REGIME], tiny_loader)
    results = json.loads((out / "results.json").read_text())
    models = results["models"]
    for t in ("add_word", "mul", "en_fr"):
        expert = models[f"expert {t}"]
        assert expert["steps"] == 2 and [c["step"] for c in expert["val_checks"]] == [1, 2]
        assert expert["target_met"] is False and list(expert["test"]["tasks"]) == [t]  # scored on its own task
        bar = results["expert_bar"][t]
        assert set(bar["val_exact"]) == {"base", f"expert {t}", "weight_average"} and bar["n_val"] == 2
    names = [f"closed form (attn_mlp{pos}, seed {s})" for pos in ("", ", answer-side") for s in (0, 1)]
    assert set(names) | {"closed form (model)"} <= set(models) and "key_heads" not in results
    alphas = lambda n: models[n]["alphas"]["L1.attn"]  # noqa: E731
    assert alphas(names[0]) != alphas(names[1])  # other samples, other fit
    assert alphas(names[0]) != alphas(names[2])  # answer-side positions only, other fit
    test = models["task_arithmetic"]["test"]
    assert test["pooled"]["n"] == 9 and len(test["tasks"]["mul"]["exact_hits"]) == 3
    assert test["tasks"]["mul"]["exact_ci"]["interval"] == "wilson"
    all_tokens = results["comparisons"]["all"]
    assert all_tokens["models"] == names[:2] and len(all_tokens["seed_accuracies"]) == 2
    diff = all_tokens["minus"]["task_arithmetic"]["seed_mean"]
    assert diff["n"] == 9 and diff["interval"] == "bootstrap" and diff["low"] <= diff["value"] <= diff["high"]
    assert set(all_tokens["minus"]) == {"task_arithmetic", "weight_average", "ties"}
    assert "answer" in results["comparisons"] and "task arithmetic: difference" in results["verdict"]
    assert (out / "experts" / "mul.train.json").is_file() and not (out / "merged_best").exists()  # --no-save-best
    assert models["base"]["test"] is None and "base" not in {r["model"] for r in results["table"]}  # --no-base-test
    order = list(models)  # seed-major closed form; --late-methods after it
    assert order.index("task_arithmetic") < order.index(names[0]) < order.index(names[2]) < order.index(names[1])
    assert order.index("closed form (model)") < order.index(names[1]) < order.index("ties")

    capsys.readouterr()
    run_main(MERGE, ["--markdown", str(out)], tiny_loader)
    table = capsys.readouterr().out
    assert "| closed-form attn/MLP merge beats task arithmetic | 51.05 vs 48.24" in table
    assert "| task_arithmetic ({'lam':" in table and "| add_word |" in table and "n = 9 |" in table

    # resume: the experts are loaded from --experts-dir (with what their training recorded), not retrained
    again = tmp_path / "again"
    run_main(MERGE, ["--out", str(again), "--experts-dir", str(out / "experts"), *PAPER_REGIME], tiny_loader)
    loaded = json.loads((again / "results.json").read_text())["models"]["expert mul"]
    assert loaded["loaded_from"].endswith("mul") and loaded["steps"] == 2


def test_experts_stop_once_the_validation_target_is_met(run_main, tiny_loader, monkeypatch, tmp_path):
    experts = importlib.import_module("experiments.merge.experts")
    real = experts.answer_accuracy

    def validated(model, data, batch_size=16, *, per_prompt=False):  # the training check sees a met target
        out = real(model, data, batch_size, per_prompt=per_prompt)
        return out if per_prompt else {**out, "exact": 1.0}

    monkeypatch.setattr(experts, "answer_accuracy", validated)
    out = tmp_path / "run"
    run_main(MERGE, ["--out", str(out), "--target-gain", "0.5", "--check-every", "1", *PAPER_REGIME[2:]]
             + ["--steps", "5"], tiny_loader)
    expert = json.loads((out / "results.json").read_text())["models"]["expert add_word"]
    assert expert["steps"] == 1 and expert["target_met"] is True and len(expert["losses"]) == 1


def test_padded_rows_mark_the_positions_that_predict_answer_tokens():
    from experiments.merge.experts import padded_rows

    model = tiny_model(style="gemma", n_layers=1)
    rows = [{"input_ids": [2, 5, 6, 7, 8], "n_prompt": 3}, {"input_ids": [2, 9, 10], "n_prompt": 2}]
    tokens, attention, answer = padded_rows(rows, model)
    assert tokens.tolist()[1][:3] == [2, 9, 10] and attention.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    # row 0: prompt 2,5,6 -> positions 2 and 3 predict the answer tokens 7 and 8; row 1: position 1 predicts 10
    assert answer.tolist() == [[0, 0, 1, 1, 0], [0, 1, 0, 0, 0]]


@pytest.mark.parametrize("flag,value,match", [("--cf-positions", "prompt", "--cf-positions 'prompt': give 'all'"),
                                              ("--mul-operands", "9,2", "--mul-operands '9,2': give 'lo,hi'")])
def test_bad_paper_regime_flags_are_clear_errors(run_main, tiny_loader, tmp_path, capsys, flag, value, match):
    from circuits.errors import InputError
    from experiments.merge import MergeConfig, run

    field = flag[2:].replace("-", "_")
    with pytest.raises(InputError, match=match):  # checked before anything is loaded or written
        run(MergeConfig(out=str(tmp_path / "run"), **{field: value}), loader=tiny_loader)
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit) as exit:  # the command line prints it as one line, exit status 2
        run_main(MERGE, ["--out", str(tmp_path / "run"), flag, value, "--threads", "1"], tiny_loader)
    assert exit.value.code == 2 and flag in capsys.readouterr().err


def test_a_bad_mergekit_yaml_fails_the_run(run_main, tiny_loader, tmp_path, capsys):
    (tmp_path / "bad.yml").write_text("merge_method: no_such_method\n")
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit:  # one line on the command line, exit status 2
        run_main(MERGE, ["--config", str(tmp_path / "bad.yml"), "--out", str(out)], tiny_loader)
    assert exit.value.code == 2 and "error:" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text())["status"].startswith("failed: merge: ")


def _answering_model(name, **kw):
    """A tiny gemma-style model whose digit logits are raised, so that it answers some prompts right."""
    model = tiny_model(style="gemma", n_layers=2, n_ctx=1024)
    digits = [model.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    with torch.no_grad():
        model.unembed.b_U[digits] += 20.0
    return model


def test_the_circuit_column_looks_at_each_experts_circuit_inside_every_merge(run_main, tmp_path):
    out = tmp_path / "run"
    argv = ["--out", str(out), "--steps", "1", "--batch-size", "4", "--micro-batch-size", "4", "--n-train", "8",
            "--n-val", "2", "--n-test", "4", "--n-samples", "2", "--cf-batch-size", "2", "--heads", "L1H0",
            "--linearity-samples", "0", "--no-save-best", "--methods", "task_arithmetic,ties,weight_average",
            "--levels", "attn_mlp", "--circuit-prompts", "6", "--threads", "1"]
    run_main(MERGE, argv, _answering_model)
    column = json.loads((out / "results.json").read_text())["circuit_column"]
    assert set(column["tasks"]) == {"add_word", "mul"}
    looked_at = [t for t in column["tasks"].values() if "skipped" not in t]
    assert looked_at, column
    for task in looked_at:
        assert {"task_arithmetic", "ties", "weight_average"} <= set(task["methods"])
        for row in task["methods"].values():
            assert {"preserved_cpr", "own_cpr", "jaccard", "spearman", "accuracy", "cpr_change"} <= set(row)
            change = row["cpr_change"]  # paired over the same prompts: the merge's CPR minus the expert's
            assert change["value"] == pytest.approx(row["preserved_cpr"]["value"] - task["expert_cpr"]["value"],
                                                    rel=1e-6, abs=1e-9)
            assert row["kept"] == ("kept" if change["high"] >= 0 else "lost")
        versus = task["submodule_vs_baselines"]
        assert set(versus) == {f"{a} minus {b}" for a in ("closed form (attn_mlp)", "circuit-aware (head in key layers)")
                               for b in ("task_arithmetic", "ties", "weight_average")}
        d = versus["closed form (attn_mlp) minus ties"]
        methods = task["methods"]
        assert d["preserved_cpr_difference"]["value"] == pytest.approx(
            methods["closed form (attn_mlp)"]["preserved_cpr"]["value"] - methods["ties"]["preserved_cpr"]["value"],
            rel=1e-6, abs=1e-9)
        assert d["accuracy_difference"]["low"] <= d["accuracy_difference"]["value"] <= d["accuracy_difference"]["high"]
        for key in ("preservation_predicts_accuracy", "full_metric_predicts_accuracy"):
            rank = task[key]
            assert "skipped" in rank or "undefined" in rank or rank["n_resamples"] == 0 or rank["low"] <= rank["high"]
        for name, row in methods.items():  # the full-run metric is the mean of the table's full-run column
            table = np.asarray(task["preserved_tables"][name])
            assert row["full_metric"]["value"] == pytest.approx(table[:, len(task["fractions"])].mean(), rel=1e-6)
    assert "circuits inside the merges" in (out / "report.html").read_text()
    from experiments.merge.stats import markdown_summary

    text = markdown_summary(json.loads((out / "results.json").read_text()), ("add_word", "mul", "en_fr"))
    assert "The circuit column:" in text and "| closed form (attn_mlp) minus ties |" in text


def test_the_full_run_metric_ranks_merges_by_the_full_column_of_their_tables():
    import types

    from experiments.merge.circuit_column import PREDICTORS, _full_metric, _rank_correlation

    # three merges, four prompts, one fraction point: columns circuit, full, empty; accuracies rise with the full run
    hits = {n: {"test": {"tasks": {"+": {"exact_hits": h}}}}
            for n, h in zip("abc", ([1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]))}
    run = types.SimpleNamespace(results={"models": hits}, cfg=types.SimpleNamespace(seed=0))
    rows = {n: {"full_metric": {"value": full}, "_curve": {"table": [[0.0, full + p, 0.0] for p in range(4)]}}
            for n, full in zip("abc", (5.0, 7.0, 6.0))}
    full_metric = next(p for p in PREDICTORS if p.row_key == "full_metric")
    rank = _rank_correlation(run, "+", rows, 200, full_metric)
    assert rank["spearman"] == pytest.approx(0.5)  # ranks (1, 3, 2) against (1, 2, 3)
    assert _full_metric(rows["b"]["_curve"], np.array([0, 0, 3, 3])) == pytest.approx(7.0 + 1.5)
    assert -1 <= rank["low"] <= rank["high"] <= 1 and rank["n_resamples"] > 0


def test_a_rank_correlation_over_equal_accuracies_is_undefined_not_a_warning():
    import types
    import warnings

    from experiments.merge.circuit_column import _rank_correlation

    hits = {n: {"test": {"tasks": {"+": {"exact_hits": [1, 0, 1, 1]}}}} for n in ("a", "b", "c")}
    run = types.SimpleNamespace(results={"models": hits}, cfg=types.SimpleNamespace(seed=0))
    rows = {n: {"preserved_cpr": {"value": v}} for n, v in zip(("a", "b", "c"), (0.2, 0.5, 0.9))}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rank = _rank_correlation(run, "+", rows, n_bootstrap=10)
    assert rank["undefined"] == "accuracy equal across the 3 merged models" and rank["spearman"] != rank["spearman"]


def test_config_and_markdown_together_are_refused_when_the_flags_are_parsed(tiny_loader, run_main, tmp_path, capsys):
    """--markdown won silently over --config; with the results of a --config run it ended in KeyError: 'models'."""
    from circuits.errors import InputError
    from experiments.merge import MergeConfig

    with pytest.raises(InputError, match=r"--config m\.yml runs a mergekit YAML and --markdown .* prints the tables of "
                                         r"an earlier run: give one of them"):
        MergeConfig(config="m.yml", markdown=str(tmp_path))
    with pytest.raises(SystemExit) as exit:
        run_main("experiments.merge", ["--config", "m.yml", "--markdown", str(tmp_path)], tiny_loader)
    assert exit.value.code == 2 and "give one of them" in capsys.readouterr().err
    (tmp_path / "results.json").write_text(json.dumps({"status": "failed: merge: boom", "settings": {}}))
    with pytest.raises(SystemExit) as exit:
        run_main("experiments.merge", ["--markdown", str(tmp_path)], tiny_loader)
    assert exit.value.code == 2
    assert "holds no 'models' table: it is not the results of a merge experiment run" in capsys.readouterr().err


def test_a_yaml_of_another_architecture_is_refused_before_the_merge(tmp_path):
    """The merge ran first, then loading failed listing buffers (attn.mask, rotary tables) as the missing keys."""
    from merging.state_dicts import save_state_dict

    three_layers = tiny_model(style="gemma", n_layers=3).state_dict()
    for name in ("a", "base"):
        save_state_dict(three_layers, tmp_path / f"{name}.safetensors")
    (tmp_path / "m.yml").write_text("models:\n  - {model: a.safetensors, parameters: {weight: 1.0}}\n"
                                    "base_model: base.safetensors\nmerge_method: task_arithmetic\n")
    from circuits.errors import InputError
    from experiments.merge import main

    out = tmp_path / "run"
    with pytest.raises(InputError, match=r"m\.yml: its models do not have the architecture of --model .*: the base "
                                         r"\(base\) has \d+ parameters it lacks, e\.g\. \['blocks\.2\..*\]\. Give "
                                         r"--model the architecture of the YAML's models \(nothing was merged\)") as err:
        main(["--config", str(tmp_path / "m.yml"), "--out", str(out)],
             loader=lambda name, **kw: tiny_model(style="gemma", n_layers=2))
    assert "mask" not in str(err.value) and "rotary" not in str(err.value)
    assert json.loads((out / "results.json").read_text())["status"].startswith("failed: merge: ")


@pytest.mark.parametrize("flags,match", [
    # a KeyError after the experts were trained
    ({"methods": "ties,tie"}, r"--methods ties,tie: \['tie'\] is not among weight_average,.*give a comma-separated subset"),
    # silently never run
    ({"methods": "ties", "late_methods": "della"}, r"--late-methods della: \['della'\] is not among ties"),
    ({"levels": "attn-mlp"}, r"--levels attn-mlp: \['attn-mlp'\] is not among model,layer,attn_mlp,head"),
    # ExpertTaskConfig's error after the base model had loaded
    ({"max_number": 12}, r"--max-number 12 leaves -2 en_fr training numbers after --n-test-numbers 9 and "
                         r"--n-val-numbers 6, but --n-shots 1 needs 2: give --max-number 16 or more"),
])
def test_flags_that_depend_on_each_other_are_checked_when_parsed(flags, match):
    from circuits.errors import InputError
    from experiments.merge import MergeConfig

    with pytest.raises(InputError, match=match):
        MergeConfig(**flags)


def test_a_method_that_merges_fewer_experts_than_the_tasks_is_refused_when_the_flags_are_parsed():
    """slerp interpolates two models; the comparison merges three experts: refused before any expert trains."""
    from circuits.errors import InputError
    from experiments.merge.config import DEFAULT_METHODS, MergeConfig

    assert "slerp" not in DEFAULT_METHODS and "multislerp" in DEFAULT_METHODS
    assert {"ram", "ramplus_tl", "wudi"} <= set(DEFAULT_METHODS)
    assert not {"arcee_fusion", "passthrough"} & set(DEFAULT_METHODS)  # base and one model; one model
    with pytest.raises(InputError, match=r"--methods ties,slerp: slerp merges at most 1 expert\(s\), and this "
                                         r"comparison merges the 3 experts add_word, mul, en_fr"):
        MergeConfig(methods="ties,slerp")
    with pytest.raises(InputError, match=r"arcee_fusion merges at most 1 expert\(s\), passthrough merges at most 1 "
                                         r"expert\(s\), .*leave them out"):
        MergeConfig(methods="arcee_fusion,ram,passthrough")
