"""experiments.learned_circuit on a tiny random model: splits, sweep, the choice on validation, test curves, stability."""

from __future__ import annotations

import json

import pytest

from experiments import learned_circuit
from experiments.learned_circuit import criterion, problem_disjoint_parts
from experiments.learned_circuit.config import LearnedCircuitConfig

SMALL = ["--n-train", "12", "--n-validation", "8", "--n-test", "8", "--steps", "3", "--learn-batch-size", "4",
         "--samples", "2", "--n-shots", "1", "--n-bootstrap", "50", "--warm-start-prompts", "4", "--threads", "1",
         "--lrs", "0.05", "0.1", "--temperatures", "1.0", "--penalties", "0", "1"]


def test_a_run_chooses_on_validation_and_reports_test_and_stability(tmp_path, tiny_dir):
    out = tmp_path / "run"  # tiny_dir's model answers with digits, so some prompts are right
    results = learned_circuit.main(SMALL + ["--model", str(tiny_dir), "--stability-seeds", "5", "--out", str(out)])
    assert results["status"] == "complete"
    rows = results["sweep"]["rows"]
    assert len(rows) == 4  # 2 lrs x 1 temperature x 2 penalties (one steps, one samples)
    best = min(rows, key=lambda r: r["criterion"])
    assert results["sweep"]["chosen"] == {k: best[k] for k in ("lr", "temperature", "faithfulness_penalty", "steps",
                                                               "samples", "batch_size", "restarts", "runs")}
    # the criterion is computed from the validation curve and the two training sets' Jaccard the row shows
    assert best["criterion"] == pytest.approx(best["cmd"]["value"] + abs(1 - best["f"]["5%"]["value"])
                                              + (1 - best["jaccard_training_sets"]["5%"]))
    assert set(results["test"]) == {"top-n", "EAP-IG-inputs", "matryoshka"}
    assert all(row["n_prompts"] == 8 for row in results["test"].values())
    assert set(results["test_minus_EAP-IG-inputs"]) == {"top-n", "matryoshka"}
    stability = results["stability"]
    assert [r["set"] for r in stability["runs"]] == [0, 1, 0] and [p["differ_in"] for p in stability["pairs"]] == \
        ["sets", "seeds", "sets"]
    assert all(0 <= p["jaccard"]["5%"] <= 1 for p in stability["pairs"]) and len(stability["core"]) == 3
    assert all(set(p["node_jaccard"]) == set(p["jaccard"]) and all(0 <= v <= 1 for v in p["node_jaccard"].values())
               for p in stability["pairs"])
    # the stability stage reuses the sweep's second-set circuit of the chosen setting: the same Jaccard
    chosen = rows.index(best)
    assert stability["pairs"][0]["jaccard"] == pytest.approx(rows[chosen]["jaccard_training_sets"])
    # every run has its own test curve; the first run is the chosen circuit, so its curve is the reported one
    assert stability["runs"][0]["test"] == results["test"]["top-n"]
    assert all(r["test"]["n_prompts"] == 8 and set(r["test"]["f"]) >= {"2%", "5%", "10%"} for r in stability["runs"])
    for (a, b), jaccard in ((p["runs"], p["jaccard"]) for p in stability["pairs"]):
        for size, shared in jaccard.items():  # another circuit at a size: its own faithfulness there
            if shared < 1:
                assert stability["runs"][a]["test"]["f"][size] != stability["runs"][b]["test"]["f"][size]
    assert results["prompts"]["sizes"]["validation"] == 8 and results["prompts"]["train_sets"] == [12, 12]
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["sweep"]["chosen"] == results["sweep"]["chosen"]
    assert (out / "report.html").exists() and (out / "learned_circuit.json").exists()


def test_steps_and_samples_are_swept_and_sweep_stability_can_be_turned_off(tmp_path, tiny_dir):
    results = learned_circuit.main(SMALL[:-8] + ["--lrs", "0.05", "--temperatures", "1.0", "--penalties", "0", "--steps", "2", "3",
                                                 "--no-sweep-stability", "--no-baselines", "--model", str(tiny_dir),
                                                 "--out", str(tmp_path / "run")])
    rows = results["sweep"]["rows"]
    assert [r["steps"] for r in rows] == [2, 3] and all("jaccard_training_sets" not in r for r in rows)
    assert all(r["criterion"] == pytest.approx(r["cmd"]["value"] + abs(1 - r["f"]["5%"]["value"])) for r in rows)
    assert set(results["test"]) == {"top-n"} and len(results["stability"]["pairs"]) == 1


def test_consensus_settings_are_swept_beside_one_run_and_a_chosen_consensus_is_reported(tmp_path, tiny_dir):
    results = learned_circuit.main(SMALL[:-8] + ["--lrs", "0.05", "--temperatures", "1.0", "--penalties", "0",
                                                 "--steps", "2", "--consensus-runs", "1", "2", "--no-baselines",
                                                 "--stability-weight", "1000", "--model", str(tiny_dir),
                                                 "--out", str(tmp_path / "run")])
    rows = results["sweep"]["rows"]
    assert [(r["runs"], r.get("resampling")) for r in rows] == [(1, None), (2, "half")]
    # a huge stability weight makes the choice the setting whose two training sets agree most
    best = max(rows, key=lambda r: (r["jaccard_training_sets"]["5%"], -r["criterion"]))
    assert results["sweep"]["chosen"]["runs"] == best["runs"]
    label = "top-n" if best["runs"] == 1 else "consensus of 2 top-n"
    assert set(results["test"]) == {label}
    # the stability stage reuses the chosen setting's second-set circuit, consensus or not
    assert results["stability"]["pairs"][0]["jaccard"] == pytest.approx(best["jaccard_training_sets"])


def test_equal_cost_gives_each_consensus_run_its_share_of_the_steps():
    grid = LearnedCircuitConfig(consensus_runs=(1, 4), steps=(100, 10), penalties=(1.0,), equal_cost=True).grid()
    assert [(s["runs"], s["steps"]) for s in grid] == [(1, 100), (4, 25), (1, 10), (4, 2)]
    assert [s["steps"] for s in LearnedCircuitConfig(consensus_runs=(1, 4), penalties=(1.0,)).grid()] == [100, 100]


def test_the_consensus_sweep_refuses_restarts_and_other_methods():
    from circuits.errors import InputError

    with pytest.raises(InputError, match="counts learned top-n runs, each learned once"):
        LearnedCircuitConfig(consensus_runs=(1, 4), restarts=(2,))
    with pytest.raises(InputError, match="use --method top-n and --restarts 1"):
        LearnedCircuitConfig(consensus_runs=(4,), method="matryoshka")


def test_training_parts_share_no_problem_and_have_one_size():
    from datasets import Dataset

    rows = [{"template_id": f"t{i % 3}", "a": str(i % 5), "b": str(i % 7), "x": i} for i in range(90)]
    parts = problem_disjoint_parts(Dataset.from_list(rows), 3, seed=1)
    keys = [{(r["template_id"], r["a"], r["b"]) for r in p} for p in parts]
    assert len({len(p) for p in parts}) == 1
    assert not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2])


def test_the_criterion_counts_area_and_the_goal_size():
    class _Estimate:
        def __init__(self, value):
            self.value = value

    class _Curve:
        fractions = [0.01, 0.05, 0.1]
        faithfulness = [_Estimate(0.2), _Estimate(1.3), _Estimate(1.0)]
        cmd = _Estimate(0.1)

    assert criterion(_Curve()) == pytest.approx(0.1 + 0.3)  # overshoot at 5 % counts as undershoot would
    assert criterion(_Curve(), 0.4, 0.5) == pytest.approx(0.1 + 0.3 + 0.5 * 0.6)


def test_bad_flags_are_refused_before_the_model_loads(tiny_loader, run_main, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_main("experiments.learned_circuit", ["--penalties", "-1"], tiny_loader)
    assert exit_info.value.code == 2 and "penalty weight" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--stability-weight -0.5: a weight is a finite number >= 0"):
        LearnedCircuitConfig(stability_weight=-0.5)
    with pytest.raises(ValueError, match="--stability-weight nan: a weight is a finite number >= 0"):
        LearnedCircuitConfig(stability_weight=float("nan"))
    with pytest.raises(ValueError, match="stability-seeds"):
        LearnedCircuitConfig(seed=3, stability_seeds=(3,))


def test_a_training_split_that_takes_every_prompt_says_so(tmp_path, tiny_dir):
    """--n-train 100000 ended in 'The dataset is empty: nothing to batch.', the cause only in an earlier warning."""
    from circuits.errors import TaskDataError

    with pytest.raises(TaskDataError, match=r"lower --n-train \(or --stability-sets\) so that validation"):
        learned_circuit.main(SMALL + ["--model", str(tiny_dir), "--n-train", "100000", "--out", str(tmp_path / "r")])
