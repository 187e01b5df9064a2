"""experiments.variables end to end on a tiny random model (the injected loader), and its flags."""

import json

import pytest
import torch

from circuits.errors import InputError, TaskDataError
from experiments import variables as variables_experiment
from experiments.variables import config as variables_config

ARGS = ["--task", "+", "--scoring", "first", "--n-prompts", "160", "--n-shots", "1", "--n-pairs", "24",
        "--n-controls", "4", "--ks", "2", "8", "--das-ks", "2", "8", "--das-steps", "2", "3", "--variables", "a", "ones",
        "--nodes", "L1H0", "MLP1", "--featurizers", "das", "dbm", "pca", "random"]


@pytest.fixture
def digit_loader(tiny_loader):
    """tiny_loader's model with the digits' logits raised, so it answers some prompts right (with digits)."""

    def load(name, **kw):
        model = tiny_loader(name, **kw)
        digits = [model.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
        with torch.no_grad():
            model.unembed.b_U[digits] += 20.0
        return model

    return load


def test_variables_experiment_writes_results_and_report(digit_loader, tmp_path):
    out = tmp_path / "run"
    results = variables_experiment.main([*ARGS, "--out", str(out)], loader=digit_loader)
    saved = json.loads((out / "results.json").read_text())
    assert results["status"] == saved["status"] == "complete"
    assert saved["variables"] == ["a", "ones"] and set(saved["sweep"]) == {"a", "ones"}
    sweep = saved["sweep"]["a"]
    # every position of the problem, then END with the answer positions after it
    assert sweep["layers"] == [0, 1] and len(sweep["iia"]) == 2 and len(sweep["iia"][0]) == len(saved["positions"]) + 1
    assert sweep["positions"] == [*saved["positions"], "end+answer"]
    assert "end" in saved["positions"] and "a" in saved["positions"]
    for variable in ("a", "ones"):
        best = saved["featurizers"][variable]["best"]
        assert {"full", "das", "dbm", "pca", "random", "verdict", "location"} <= set(best)
        assert best["random"]["k"] == best["das"]["k"]  # the null has DAS's k
        assert best["das"]["steps"] in (2, 3) and best["dbm"]["steps"] == 3  # chosen on validation; DBM: the largest
        assert 0 <= best["das"]["test"]["low"] <= best["das"]["test"]["value"] <= best["das"]["test"]["high"] <= 1
    assert {(r["variable"], r["node"]) for r in saved["circuit"]["rows"]} == {
        (v, n) for v in ("a", "ones") for n in ("L1H0", "MLP1")}
    assert set(saved["seconds"]) >= set(variables_experiment.PLAN)
    html = (out / "report.html").read_text()
    assert "What this run found" in html and "DAS at the best full-vector locations" in html
    # 24 pairs leave 6 test pairs a variable: the run says up front that they cannot resolve 0.2, in the report too
    assert saved["power_notice"].startswith("--n-pairs 24 leaves about 6 test pairs a variable") and \
        "The power of this run" in html


def test_the_power_notice_names_the_pairs_that_resolve_the_decisive_difference():
    from circuits.stats import resolvable_difference, wilson_interval

    notice = variables_experiment.power_notice(variables_config.VariablesConfig(n_pairs=64))
    # 16 test pairs against a null of 0.03 (0 of 16, Wilson upper bound 0.19): 7 of 16 is the first count whose
    # lower bound (0.23) clears it, an excess of 7/16 - 0.03 = 0.41
    assert wilson_interval(6, 16)[0] < wilson_interval(0, 16)[1] < wilson_interval(7, 16)[0]
    assert "resolve only differences of 0.41 above" in notice and "--n-pairs 256" in notice
    # 256 pairs leave 64 test pairs, which resolve 0.16 <= 0.2: no notice
    assert resolvable_difference(64, 0.03) <= 0.2
    assert variables_experiment.power_notice(variables_config.VariablesConfig(n_pairs=256)) is None


def test_no_answer_span_sweeps_the_problems_positions_only(digit_loader, tmp_path):
    saved = variables_experiment.main([*ARGS, "--no-answer-span", "--featurizers", "pca", "--out", str(tmp_path / "r")],
                                      loader=digit_loader)
    assert saved["sweep"]["a"]["positions"] == list(saved["positions"])
    assert all(not s["best"]["location"]["through_answer"] for s in saved["featurizers"].values())


def test_a_model_that_answers_nothing_fails_with_what_to_do(tiny_loader, tmp_path):
    with pytest.raises(TaskDataError, match=r"Only 0 counterfactual pairs for variable 'a' of 'addition' from the 0 of "
                                            r"40 prompts the model answers correctly"):
        variables_experiment.main(["--task", "+", "--n-prompts", "40", "--variables", "a", "--out", str(tmp_path / "r")],
                                  loader=tiny_loader)
    assert json.loads((tmp_path / "r" / "results.json").read_text())["status"].startswith("failed: pairs")


def test_bad_flags_are_refused_when_parsed(tmp_path):
    with pytest.raises(InputError, match=r"--split 0.5 0.5 0.5: give three positive fractions"):
        variables_experiment.main(["--split", "0.5", "0.5", "0.5", "--out", str(tmp_path / "a")])
    with pytest.raises(InputError, match=r"--nodes and --circuit both name the circuit's nodes"):
        variables_experiment.main(["--nodes", "L0H0", "--circuit", "x.json", "--out", str(tmp_path / "b")])
    with pytest.raises(InputError, match=r"--split nan nan nan: give three positive fractions"):
        variables_experiment.main(["--split", "nan", "nan", "nan", "--out", str(tmp_path / "e")])
    with pytest.raises(InputError):  # a node name no model has: refused when parsed, not after the sweep
        variables_experiment.main(["--nodes", "Head3", "--out", str(tmp_path / "f")])
    assert not (tmp_path / "e").exists() and not (tmp_path / "f").exists()


def test_pair_settings_refuse_a_nan_split():
    from patching.variables.causal_models import PairSettings

    with pytest.raises(InputError, match="split must be three positive fractions"):
        PairSettings(split=(float("nan"),) * 3)


def test_the_circuit_of_a_run_folder_is_tested_node_by_node(digit_loader, tmp_path):
    """--circuit takes the run folder of experiments.circuit or the main job: its edge_circuit/circuit.json."""
    from circuits.graph import Graph
    from circuits.graph_io import save_eap_json
    from circuits.graph_selection import select_top_n

    model = digit_loader("tiny")
    scores = Graph.from_model(model)
    scores.scores[scores.layout.real_edge_mask] = torch.rand(scores.layout.n_edges, generator=torch.Generator().manual_seed(0))
    folder = tmp_path / "circuit-run"
    save_eap_json(select_top_n(scores, 60), folder / "edge_circuit" / "circuit.json", d_model=model.cfg.d_model)
    argv = [a for a in ARGS if a not in ("--nodes", "L1H0", "MLP1")] + ["--featurizers", "pca", "--variables", "a"]
    saved = variables_experiment.main([*argv, "--circuit", str(folder), "--out", str(tmp_path / "r")],
                                      loader=digit_loader)
    nodes = {r["node"] for r in saved["circuit"]["rows"]}
    assert nodes and saved["circuit"]["nodes_from"] == str(folder)
    with pytest.raises(InputError, match=r"the folder holds no edge_circuit/circuit.json"):
        variables_experiment.main(["--circuit", str(tmp_path), "--out", str(tmp_path / "c")])
    with pytest.raises(InputError, match=r"no such file or folder"):
        variables_experiment.main(["--circuit", str(tmp_path / "nothing.json"), "--out", str(tmp_path / "d")])


def test_a_new_featurizer_record_is_a_flag_choice_and_a_report_column_with_no_other_edit(monkeypatch):
    from experiments.variables.report import featurizer_caption, featurizer_rows
    from patching.variables import catalogue

    svd = catalogue.FeaturizerRecord("svd", "SVD", "the top-k right singular vectors", "a record added by this test",
                                     "patching.variables.svd:fit_svd", chooses=("k",))
    assert variables_config.featurizer_choices({**catalogue.FEATURIZERS, "svd": svd}) == (
        "das", "dbm", "pca", "random", "svd")  # the full vector always runs, so it is no choice
    assert variables_config.FEATURIZERS == variables_config.featurizer_choices()
    assert variables_config.TASKS == tuple(catalogue.CAUSAL_MODELS)

    monkeypatch.setitem(catalogue.FEATURIZERS, "svd", svd)
    estimate = {"value": 0.5, "low": 0.25, "high": 0.75, "n": 8}
    location = {"layer": 1, "position_label": "end"}
    results = {"featurizers": {"a": {"locations": [{"location": location, "full": {"test": estimate, "k": 32},
                                                      "svd": {"test": estimate, "k": 4, "steps": None}}]}}}
    row, = featurizer_rows(results)
    assert row["full vector (k)"] == "0.50 [0.25, 0.75] (n=8), k=32"
    assert row["SVD (k)"] == "0.50 [0.25, 0.75] (n=8), k=4"
    assert featurizer_caption().startswith("DAS, PCA and SVD choose k on the validation pairs; "
                                           "the random subspace (null) has DAS's k. Controls keep the variable")


@pytest.mark.integration
def test_gemma_one_digit_addition_finds_the_variables_it_is_given(gemma, tmp_path):
    """gemma-3-270m, one-digit addition with small settings (about a minute on a 2-core CPU): every stage runs on the
    real tokenizer and every IIA is a proportion. (gemma-3-270m answers almost none of MIB's two-digit prompts.)"""
    out = tmp_path / "run"
    results = variables_experiment.main(
        ["--task", "+", "--variables", "a", "result", "--n-prompts", "96", "--n-pairs", "24", "--n-controls", "4",
         "--layers", "6", "17", "--ks", "16", "--das-steps", "4", "--featurizers", "das", "random", "--nodes", "MLP17",
         "--out", str(out)],
        loader=lambda name, **kw: gemma)
    assert results["status"] == "complete"
    assert set(results["featurizers"]) == {"a", "result"}
    for variable, sweep in results["sweep"].items():
        assert all(0 <= cell["value"] <= 1 for row in sweep["iia"] for cell in row), variable
    # the last layer's residual at END and the answer positions is all the answer is read from, and the source,
    # fed its own answer, answers it right: every result pair takes the source's result there, two-token sums too
    result = results["sweep"]["result"]
    assert result["iia"][result["layers"].index(17)][result["positions"].index("end+answer")]["value"] == 1.0
    assert (out / "report.html").is_file()
