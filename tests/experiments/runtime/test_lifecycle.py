"""experiments.runtime.lifecycle: one lifecycle for every experiment: only the main process of a launch
writes the run folder, a run that did part of its work resumes, an error outside any stage fails the
run, every run is seeded and gets its threads, progress prints one way, and the run carries the
experiment's own state."""

import json

import pytest

from experiments import edge_sweeps


def test_only_the_main_process_writes_the_run_folder(tmp_path):
    from experiments.runtime import run_experiment

    def stages(run):
        with run.stage("work"):
            run.results["found"] = 1
        run.save()

    cfg = edge_sweeps.EdgeSweepsConfig(out=str(tmp_path / "run"))
    other = run_experiment("edge_sweeps", cfg, stages, main_process=False)  # another process of the launch
    assert other["found"] == 1 and "work" in other["seconds"] and not (tmp_path / "run").exists()
    main = run_experiment("edge_sweeps", cfg, stages)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "complete" and main["found"] == 1

    def interrupted(run):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # a failing non-main process leaves the main process's folder alone
        run_experiment("edge_sweeps", cfg, interrupted, main_process=False)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "complete"


def test_a_partial_run_ends_running_and_resumes_to_complete(tmp_path):
    from experiments.runtime import RunSettings, run_experiment

    cfg = RunSettings(out=str(tmp_path / "run"))

    def first(run):
        with run.stage("first"):
            run.results["a"] = 1
        run.complete = False  # only part of the work: resumable

    partial = run_experiment("demo", cfg, first)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert partial["status"] == saved["status"] == "running" and saved["a"] == 1 and "first" in saved["seconds"]

    def rest(run):
        assert run.results["a"] == 1  # what the first command saved
        with run.stage("second"):
            run.results["b"] = 2

    done = run_experiment("demo", cfg, rest, resume=True, results=saved)
    final = json.loads((tmp_path / "run" / "results.json").read_text())
    assert final["status"] == "complete" and (final["a"], final["b"]) == (1, 2) and done["b"] == 2
    assert set(final["seconds"]) == {"first", "second"} and final["wall_seconds"] >= saved["wall_seconds"]


def test_a_resumed_run_returns_the_status_its_results_json_holds(tmp_path):
    from experiments.runtime import RunSettings, run_experiment

    cfg = RunSettings(out=str(tmp_path / "run"))

    def partly(run):
        run.complete = False

    run_experiment("demo", cfg, partly)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    done = run_experiment("demo", cfg, lambda run: None, resume=True, results=saved)
    assert done["status"] == json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "complete"


def test_an_error_outside_any_stage_fails_the_run_and_runs_are_seeded(tmp_path):
    import torch

    from experiments.runtime import RunSettings, run_experiment

    def broken(run):
        raise ValueError("no prompts")

    with pytest.raises(ValueError, match="no prompts"):
        run_experiment("demo", RunSettings(out=str(tmp_path / "bad")), broken)
    assert json.loads((tmp_path / "bad" / "results.json").read_text())["status"] == "failed: demo: ValueError: no prompts"

    def draw(run):
        run.results["draw"] = torch.rand(3).tolist()

    a, b, c = (run_experiment("demo", RunSettings(out=str(tmp_path / name), seed=seed), draw)["draw"]
               for name, seed in (("a", 7), ("b", 7), ("c", 8)))
    assert a == b != c


def test_one_progress_printer_numbers_planned_stages_and_shows_messages_and_steps(tmp_path, capsys):
    from experiments.runtime import RunSettings, run_experiment

    def stages(run):
        with run.stage("data", "never shown: a planned stage is numbered instead"):
            with run.step("building prompts"):
                pass
        with run.stage("extra", "an unplanned stage with a message"):
            pass
        with run.stage("quiet"):  # unplanned, no message: timed, not shown
            pass
        with run.stage("report"):
            pass

    results = run_experiment("demo", RunSettings(out=str(tmp_path / "run")), stages, plan=["data", "report"])
    err = capsys.readouterr().err
    assert "[1/2] data ..." in err and "      data: 0 s" in err and "[2/2] report ..." in err
    assert "building prompts ..." in err and "an unplanned stage with a message ..." in err
    assert err.count("  done in 0 s") == 2 and "never shown" not in err and "quiet" not in err
    assert set(results["seconds"]) == {"data", "extra", "quiet", "report"}  # a step is shown, not recorded


def test_the_run_carries_the_experiments_state_and_sets_threads(tmp_path):
    import dataclasses

    import torch

    from experiments.runtime import Run, RunSettings, run_experiment

    @dataclasses.dataclass
    class Counter:
        n: int = 0

    seen = {}

    def stages(run: Run[RunSettings, Counter]):
        seen["threads"] = torch.get_num_threads()
        run.state = Counter()
        for _ in range(3):
            with run.stage("count"):
                run.state.n += 1
        run.results["n"] = run.state.n

    before = torch.get_num_threads()
    torch.set_num_threads(2)  # so that --threads 1 is a change the run must make
    try:
        results = run_experiment("demo", RunSettings(out=str(tmp_path / "run"), threads=1), stages)
    finally:
        torch.set_num_threads(before)
    assert results["n"] == 3 and seen["threads"] == 1


def test_sigterm_records_the_stage_it_stopped_in_and_exits_143(tmp_path, capsys):
    """kill (SIGTERM) is an interruption like Ctrl-C: the run folder says where it stopped, not 'running'."""
    import os
    import signal
    import time

    from experiments.runtime import RunSettings, cli, run_experiment

    def stages(run):
        with run.stage("first"):
            run.results["a"] = 1
        with run.stage("long work"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        cli.run_cli(lambda argv: run_experiment("demo", RunSettings(out=str(tmp_path / "run")), stages), "demo", [])
    assert stopped.value.code == 143
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["status"].startswith("failed: long work") and "interrupted" in saved["status"] and saved["a"] == 1
    assert "terminated (SIGTERM)" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the command's only
