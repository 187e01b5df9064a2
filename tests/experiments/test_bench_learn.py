"""experiments.bench_learn end to end on a tiny random model: every arm timed per step, the whole default run,
the profile of the default step."""

import json

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bench_learn_times_every_arm_and_the_whole_default(run_main, tiny_loader, tmp_path):
    from experiments.bench_learn import arms
    from patching.edges.learn import DEFAULT_CIRCUIT

    run_main("experiments.bench_learn", ["--out", str(tmp_path), "--n-prompts", "8", "--steps", "3", "--rounds", "2",
                                         "--warm-start-prompts", "4", "--n-shots", "1", "--profile-steps", "2",
                                         "--consensus-runs", "0"],
             tiny_loader)
    results = json.loads((tmp_path / "results.json").read_text())
    labels = list(arms())
    assert list(results["arms"]) == labels and labels[-1].startswith("default")
    for row in results["arms"].values():
        assert len(row["seconds_per_step_all"]) == 2 * 2  # two rounds of three steps, each run's first left out
        assert row["seconds_per_step_median"] > 0
    assert results["arms"][labels[0]]["speedup_over_first"] == pytest.approx(1.0)
    whole = results["whole_default"]
    assert whole["steps"] == DEFAULT_CIRCUIT.steps and whole["seconds"] >= whole["learn_seconds"] > 0
    assert whole["meets_goal"] == (whole["seconds"] <= 60.0)
    # the profile: each of the hooks' parts recorded (> 0, so their ranges and the backward node exist under those
    # names), and with the rest they add up to the profiled steps; the operator table is written
    profile = results["profile"]
    assert profile["steps"] == 2 and profile["seconds"] > 0
    hooks = ["senders, forward", "receivers, forward", "receivers, backward"]
    assert list(profile["shares"])[:3] == hooks and all(profile["seconds_by_part"][part] > 0 for part in hooks)
    assert sum(profile["seconds_by_part"].values()) == pytest.approx(profile["seconds"])
    assert sum(profile["shares"].values()) == pytest.approx(1.0)
    assert "aten::" in (tmp_path / "profile.txt").read_text()


def test_bench_learn_only_profile_needs_profile_steps():
    """--only-profile alone would run nothing: refused before the model loads."""
    from circuits.errors import InputError
    from experiments.bench_learn import BenchLearnConfig

    with pytest.raises(InputError, match="--only-profile needs --profile-steps"):
        BenchLearnConfig(only_profile=True)


def test_bench_learn_times_the_consensus_runs_step_for_step(run_main, tiny_loader, tmp_path):
    from experiments.bench_learn import CONSENSUS_ARMS

    run_main("experiments.bench_learn", ["--out", str(tmp_path), "--n-prompts", "12", "--steps", "3", "--rounds", "1",
                                         "--n-shots", "1", "--only-consensus", "--consensus-runs", "2"], tiny_loader)
    results = json.loads((tmp_path / "results.json").read_text())
    assert "arms" not in results and "whole_default" not in results
    consensus = results["consensus"]
    assert consensus["runs"] == 2 and list(consensus["seconds_per_step_all"]) == list(CONSENSUS_ARMS)
    assert all(len(t) == 2 and min(t) > 0 for t in consensus["seconds_per_step_all"].values())  # first step left out
    median = consensus["seconds_per_step_median"]
    assert consensus["together_vs_apart"] == pytest.approx(median[CONSENSUS_ARMS[2]] / median[CONSENSUS_ARMS[1]])
    with pytest.raises(Exception, match="--only-consensus needs"):
        from experiments.bench_learn import BenchLearnConfig
        BenchLearnConfig(only_consensus=True, consensus_runs=0)


def test_bench_learn_needs_two_steps_a_run():
    """--steps 1 left no step to time and ended in 'no median for empty data'."""
    from circuits.errors import InputError
    from experiments.bench_learn import BenchLearnConfig

    with pytest.raises(InputError, match="--steps 1: each timed run's first step is left out"):
        BenchLearnConfig(steps=1)
