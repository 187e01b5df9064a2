"""``python -m experiments.circuit --task``: ioi, greater-than and a prompt-pair file end to end on a tiny model, and
the flag's checks before any model loads."""

from __future__ import annotations

import json

import pytest

from circuits.errors import InputError
from circuits.pair_tasks import PairFileError
from experiments import circuit as circuit_experiment

FAST = ["--n-prompts", "16", "--circuit-prompts", "8", "--n-bootstrap", "50", "--batch-size", "16"]


@pytest.mark.parametrize("task, metric", [("ioi", "logit_diff"), ("greater-than", "prob_diff")])
def test_classic_tasks_run_with_their_metric(tiny_dir, tmp_path, task, metric):
    out = tmp_path / task
    results = circuit_experiment.main(["--model", str(tiny_dir), "--out", str(out), "--task", task,
                                       "--method", "EAP-IG-inputs", *FAST])
    saved = json.loads((out / "results.json").read_text())
    assert saved["experiment"] == f"circuit-{task}" and saved["task"]["metric"] == metric
    assert saved["edge_circuit"]["metric"] == metric and saved["task"]["n_solved"] == saved["n_kept"]
    assert results["edge_circuit"]["curve_heldout"]["faithfulness"][-1]["value"] == pytest.approx(1.0, abs=1e-4)
    assert (out / "edge_circuit" / "mib" / f"{task}_tiny").is_dir()


def test_the_default_learned_circuit_runs_on_a_classic_task(tiny_dir, tmp_path):
    out = tmp_path / "learned"
    results = circuit_experiment.main(["--model", str(tiny_dir), "--out", str(out), "--task", "ioi",
                                       "--learn-steps", "2", "--learn-samples", "2", *FAST])
    stage = results["edge_circuit"]
    assert stage["method"] == "top-n" and stage["metric"] == "logit_diff"
    assert "key heads and head classes" not in results["seconds"]  # operand heads are arithmetic's


def test_a_pair_file_runs_with_methods(tiny_dir, tmp_path):
    rows = [f"ab{i}=,cd{i}=,{(i + 1) % 10},{(i + 5) % 10}" for i in range(10)]
    path = tmp_path / "my_pairs.csv"
    path.write_text("clean,corrupted,answer,distractor\n" + "\n".join(rows) + "\n")
    out = tmp_path / "run"
    results = circuit_experiment.main(["--model", str(tiny_dir), "--out", str(out), "--task", str(path),
                                       "--methods", "EAP-IG-inputs", "--stability-sets", "0", *FAST])
    assert results["experiment"] == "circuit-my_pairs" and results["task"]["metric"] == "logit_diff"
    assert "EAP-IG-inputs" in json.dumps(results["comparison"])


def test_task_flag_checks_before_the_model_loads(tmp_path):
    assert circuit_experiment.parse_config(["--task", "division"]).op == "/"
    with pytest.raises(InputError, match="name two operations"):
        circuit_experiment.parse_config(["--task", "addition", "--op", "-"])
    with pytest.raises(InputError, match="Unknown task 'iio'"):
        circuit_experiment.parse_config(["--task", "iio"])
    with pytest.raises(InputError, match="--templates compares arithmetic prompt families"):
        circuit_experiment.parse_config(["--task", "ioi", "--templates", "equation", "question"])
    bad = tmp_path / "bad.csv"
    bad.write_text("clean,corrupted,answer\nab,cd,x\n")
    with pytest.raises(PairFileError, match=r"missing column\(s\) distractor"):
        circuit_experiment.parse_config(["--task", str(bad)])
