"""experiments.runtime.run_folder: run folders refuse an earlier run unless --overwrite, never lose a file
the toolkit did not write, keep a replaced run until the new one completes, and a failing run never
looks complete; stage timers and atomic writes. The last three tests check the same through whole
experiments (precise_sft, the arithmetic pipeline) run as a user runs them."""

import json
import os
import runpy
import sys
import time
from pathlib import Path

import pytest
import torch

from experiments.runtime.run_folder import (
    OutputExistsError, StageTimer, complete_run, fail_run, prepare_run_dir, read_status, write_json_atomic,
)
from circuits.atomic_files import write_text_atomic


def _status(path):
    return json.loads((path / "results.json").read_text())["status"]


def test_prepare_run_dir_refuses_existing_run_unless_overwrite(tmp_path):
    out = prepare_run_dir(tmp_path / "run")
    complete_run(out, {"accuracy": 0.9})
    write_text_atomic(out / "report.html", "old report")
    write_text_atomic(out / "figures" / "af1.json", "{}")
    with pytest.raises(OutputExistsError, match=r"already holds a run \(complete\); pass --overwrite"):
        prepare_run_dir(out)
    assert prepare_run_dir(out, overwrite=True) == out
    # nothing stale survives an overwrite: the new folder holds only the marker and a running results.json
    assert sorted(p.name for p in out.iterdir()) == [".arith-circuits-run.json", "results.json"]
    assert json.loads((out / "results.json").read_text()) == {"status": "running"}
    # the old run was moved aside, not deleted, and goes only when the new run completes
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert (aside / "report.html").read_text() == "old report"
    complete_run(out, {"accuracy": 0.5})
    assert not aside.exists() and _status(out) == "complete"


def test_overwrite_refuses_a_folder_the_toolkit_did_not_write(tmp_path):
    (tmp_path / "thesis.tex").write_text("precious")
    with pytest.raises(OutputExistsError, match="did not write"):
        prepare_run_dir(tmp_path, overwrite=True)
    assert (tmp_path / "thesis.tex").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis.tex"]


def test_interrupted_run_with_only_empty_folders_does_not_block_a_rerun(tmp_path):
    (tmp_path / "run" / "figures").mkdir(parents=True)
    out = prepare_run_dir(tmp_path / "run")
    assert _status(out) == "running"


def test_failed_overwrite_leaves_no_complete_looking_run(tmp_path):
    out = prepare_run_dir(tmp_path / "run")
    complete_run(out, {"accuracy": 0.9})
    out = prepare_run_dir(out, overwrite=True)
    results = {"experiment": "x"}
    timer = StageTimer(run_dir=out, results=results)
    with timer.stage("data"):
        results["n"] = 3
    assert json.loads((out / "results.json").read_text())["n"] == 3  # saved stage by stage
    with pytest.raises(KeyboardInterrupt), timer.stage("patching"):
        raise KeyboardInterrupt
    assert _status(out) == "failed: patching: interrupted"
    with pytest.raises(ValueError), timer.stage("af1"):
        raise ValueError("no eval prompts")
    saved = json.loads((out / "results.json").read_text())
    assert saved["status"] == "failed: af1: ValueError: no eval prompts" and saved["n"] == 3
    assert set(saved["seconds"]) == {"data", "patching", "af1"}
    # the replaced run is kept for recovery when the new one fails
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]) == 1
    assert read_status(out).startswith("failed")


def test_overwriting_a_failed_overwrite_leaves_no_replaced_folder_once_complete(tmp_path):
    """A failed --overwrite kept the original run aside; overwriting the failed run then completed and deleted only
    the failed run: the original stayed as run.replaced-* for ever."""
    out = prepare_run_dir(tmp_path / "run")
    complete_run(out, {"accuracy": 0.9})
    write_text_atomic(out / "report.html", "the original report")
    out = prepare_run_dir(out, overwrite=True)  # this run fails: the original must stay recoverable
    fail_run(out, {"n": 1}, "patching: ValueError: boom")
    (original,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    marker = json.loads((out / ".arith-circuits-run.json").read_text())
    assert Path(marker["replaced"]).is_absolute() and Path(marker["replaced"]) == original.absolute()
    assert (original / "report.html").read_text() == "the original report" and _status(original) == "complete"
    out = prepare_run_dir(out, overwrite=True)  # overwrite the failed run
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]) == 2
    complete_run(out, {"accuracy": 0.8})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and _status(out) == "complete"


def test_a_copied_run_folder_never_deletes_the_original_outputs_kept_run(tmp_path):
    """R/a completes; R/a --overwrite fails and keeps the first run as R/a.replaced-*; R/a is copied to R/b; R/b
    --overwrite completes. It followed the copied marker to R/a.replaced-* and deleted the only copy of the first
    run: a run may delete only what was moved aside from its own output."""
    import shutil

    a = prepare_run_dir(tmp_path / "a")
    complete_run(a, {"accuracy": 0.9})
    a = prepare_run_dir(a, overwrite=True)
    fail_run(a, {}, "merge: ValueError: boom")
    (kept,) = [p for p in tmp_path.iterdir() if p.name.startswith("a.replaced-")]
    b = tmp_path / "b"
    shutil.copytree(a, b)
    b = prepare_run_dir(b, overwrite=True)
    complete_run(b, {"accuracy": 0.8})
    assert kept.is_dir() and _status(kept) == "complete"  # the first run of a is still there
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["a", "b", kept.name])


def test_an_unwritable_out_is_one_line_not_a_permission_traceback(tmp_path, monkeypatch, capsys):
    """An --out that cannot be created was a PermissionError traceback."""
    from experiments import arithmetic as _arithmetic
    from experiments.runtime import cli
    from experiments.runtime.run_folder import OutputNotWritableError

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.access(locked, os.W_OK):  # root ignores the mode: refuse the way the kernel would refuse a user
        real_mkdir = Path.mkdir

        def mkdir(self, *args, **kwargs):
            if locked in self.parents:
                raise PermissionError(13, "Permission denied", str(self))
            return real_mkdir(self, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", mkdir)
    try:
        with pytest.raises(OutputNotWritableError, match=r"Cannot write the output folder .*locked/run: Permission "
                                                         r"denied .*Choose an --out you can write to"):
            prepare_run_dir(locked / "run")

        def no_model(*args, **kwargs):
            pytest.fail("the model was loaded")

        with pytest.raises(SystemExit) as exit:
            cli.run_cli(lambda a: _arithmetic.main("+", a, loader=no_model), "addition",
                        ["--out", str(locked / "run" / "deeper")])
        assert exit.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("\n") == 1 and "error: Cannot write the output folder" in err
        assert issubclass(OutputNotWritableError, PermissionError)
    finally:
        locked.chmod(0o755)


def test_an_out_whose_parent_cannot_hold_folders_is_one_line():
    """An --out inside /proc (ENOENT on mkdir) was a FileNotFoundError traceback."""
    from experiments.runtime.run_folder import OutputNotWritableError

    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    with pytest.raises(OutputNotWritableError, match=r"Cannot write the output folder /proc/arith-circuits-run"):
        prepare_run_dir(Path("/proc/arith-circuits-run"))


def test_atomic_writes_leave_no_partial_file_on_error(tmp_path):
    target = tmp_path / "results.json"
    write_json_atomic(target, {"a": torch.tensor([1.0, float("nan")]), "b": (1, 2)})
    assert json.loads(target.read_text()) == {"a": [1.0, None], "b": [1, 2]}

    class Boom:
        def __str__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_json_atomic(target, {"bad": Boom()})
    assert json.loads(target.read_text())["b"] == [1, 2]  # old file intact
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temp file left
    write_text_atomic(tmp_path / "x.txt", "hi")
    assert (tmp_path / "x.txt").read_text() == "hi"


def test_stage_timer_accumulates():
    timer = StageTimer()
    with timer.stage("a"):
        time.sleep(0.03)
    with timer.stage("a"):
        time.sleep(0.03)
    with timer.stage("b"):
        time.sleep(0.02)
    assert set(timer.seconds) == {"a", "b"}
    assert 0.06 <= timer.seconds["a"] < 1.0 and 0.02 <= timer.seconds["b"] < 1.0
    assert timer.total == pytest.approx(timer.seconds["a"] + timer.seconds["b"], abs=0.011)


def _run(module, argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", [module, *argv])
    runpy.run_module(module, run_name="__main__")


def test_precise_sft_overwrite_with_a_bad_model_deletes_nothing(monkeypatch, tmp_path):
    out = prepare_run_dir(tmp_path / "run")
    (out / "runs").mkdir()
    (out / "runs" / "weights.safetensors").write_bytes(b"trained for hours")
    complete_run(out, {"accuracy": 0.9})
    with pytest.raises((ValueError, LookupError, SystemExit)):  # the model name is refused
        _run("experiments.precise_sft", ["--out", str(out), "--overwrite", "--model", "bogus-model-name"], monkeypatch)
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert (aside / "runs" / "weights.safetensors").read_bytes() == b"trained for hours"
    assert json.loads((aside / "results.json").read_text())["status"] == "complete"
    assert json.loads((out / "results.json").read_text())["status"] != "complete"


def test_precise_sft_overwrite_refuses_a_folder_the_toolkit_did_not_write(monkeypatch, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises((FileExistsError, SystemExit)):
        _run("experiments.precise_sft", ["--out", str(tmp_path), "--overwrite", "--model", "bogus-model-name"],
             monkeypatch)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


FAST = ["--n-prompts", "60", "--top-k", "2", "--knockout-prompts", "6", "--knockout-ks", "1,2",
        "--knockout-seeds", "1", "--transfer-prompts", "6", "--af1-stride", "1", "--af1-prompts", "30",
        "--batch-size", "16", "--circuit-prompts", "0"]


def test_a_failing_last_stage_keeps_earlier_results_and_nothing_stale(tiny_dir, tmp_path, monkeypatch):
    from experiments import arithmetic as _arithmetic
    from experiments.arithmetic import stages as _arithmetic_stages
    from patching.all_for_one.runner import NoEvalPromptsError

    out = tmp_path / "run"
    _arithmetic.main("+", ["--model", str(tiny_dir), "--out", str(out), *FAST])
    assert json.loads((out / "results.json").read_text())["status"] == "complete"
    assert (out / "figures" / "path_patching.json").is_file() and (out / "report.html").is_file()

    def no_eval_prompts(model, cfg):
        raise NoEvalPromptsError("the model answers none of the AF1 prompts")

    monkeypatch.setattr(_arithmetic_stages, "_af1_grid", no_eval_prompts)  # the AF1 stage's grid builder
    with pytest.raises(NoEvalPromptsError):
        _arithmetic.main("+", ["--model", str(tiny_dir), "--out", str(out), "--overwrite", *FAST])
    saved = json.loads((out / "results.json").read_text())
    assert saved["status"].startswith("failed: AF1 grid: NoEvalPromptsError: the model answers none")
    assert len(saved["key_heads"]) == 2 and saved["knockout"]["ks"] == [1, 2]  # earlier stages kept
    assert "logit_lens" in saved and "AF1 grid" in saved["seconds"]
    # nothing of the old complete run is left looking current: no report, no figures
    assert not (out / "report.html").exists() and not (out / "figures").exists()
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert json.loads((aside / "results.json").read_text())["status"] == "complete"


def test_a_foreign_folder_is_refused_without_suggesting_overwrite(tmp_path):
    """--overwrite never replaces a folder the toolkit did not write, so the message must not suggest it."""
    (tmp_path / "notes.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match="holds files this toolkit did not write") as info:
            prepare_run_dir(tmp_path, overwrite=overwrite)
        assert "pass --overwrite" not in str(info.value)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_planned_stages_print_their_number_and_time(capsys):
    from experiments.runtime.run_folder import StageTimer

    timer = StageTimer(plan=["load model", "data", "report"])
    with timer.stage("data"):
        pass
    with timer.stage("unplanned"):  # a sub-step of a stage: timed, not numbered
        pass
    err = capsys.readouterr().err
    assert "[2/3] data ..." in err and "data: 0 s" in err and "unplanned" not in err
    assert "data" in timer.table() and "total" in timer.table()
