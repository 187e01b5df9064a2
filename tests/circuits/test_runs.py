import json

import pytest
import torch

from circuits.runs import OutputExistsError, StageTimer, prepare_run_dir, write_json_atomic, write_text_atomic


def test_prepare_run_dir_refuses_existing_run_unless_overwrite(tmp_path):
    out = prepare_run_dir(tmp_path / "run")
    (out / "results.json").write_text("{}")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        prepare_run_dir(out)
    assert prepare_run_dir(out, overwrite=True) == out


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
        pass
    with timer.stage("a"):
        pass
    assert set(timer.seconds) == {"a"} and timer.total >= 0
