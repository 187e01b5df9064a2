"""finetune.checkpoints: checkpoints are verified before they touch the model, a damaged one is skipped
for the newest intact one, and a run killed for real (SIGKILL, also mid-write) resumes bit-exact.

The in-process tests in test_trainer.py interrupt with an exception, which still runs ``finally``
blocks; a kill does not, so the kill test checks that what reaches the disk is enough to resume, and
that a checkpoint cut off mid-write is ignored rather than loaded."""

import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from circuits.nodes import Head
from tests.damaged_files import refresh_manifest
from tests.tiny_models import tiny_model
from finetune.checkpoints import CheckpointError, list_checkpoints, load_tuned, save_tuned
from finetune.optim import SliceAdamW
from finetune import TrainConfig
from finetune.trainer import train
from tests.finetune.test_trainer import Interrupt, _interrupt_at


CFG = TrainConfig(lr=5e-3, batch_size=8, micro_batch_size=4, max_steps=6, checkpoint_every=2, keep_checkpoints=3,
                  progress=False)
HEADS = [Head(0, 1), Head(1, 2)]


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture
def checkpoints(sft_rows, tmp_path):
    """A precise run interrupted after step 5: checkpoints at steps 2 and 4."""
    with pytest.raises(Interrupt):
        train(tiny_model(style="gemma"), sft_rows, CFG, method="precise", heads=HEADS, out_dir=tmp_path,
              on_step=_interrupt_at(5))
    found = list_checkpoints(tmp_path)
    assert [s for s, _ in found] == [2, 4]
    return tmp_path, dict(found)


def _damage(path, how):
    if how == "truncated optimizer":
        data = (path / "optimizer.safetensors").read_bytes()
        (path / "optimizer.safetensors").write_bytes(data[: len(data) // 2])
    elif how == "empty weights":
        (path / "weights.safetensors").write_bytes(b"")
    elif how == "corrupt state":
        (path / "state.json").write_text("{not json")
    elif how == "flipped byte":
        data = bytearray((path / "weights.safetensors").read_bytes())
        data[-7] ^= 0x01
        (path / "weights.safetensors").write_bytes(bytes(data))
    elif how == "missing optimizer":
        (path / "optimizer.safetensors").unlink()


DAMAGE = ["truncated optimizer", "empty weights", "corrupt state", "flipped byte", "missing optimizer"]
NAMED = {"truncated optimizer": "optimizer.safetensors", "empty weights": "weights.safetensors",
         "corrupt state": "state.json", "flipped byte": "weights.safetensors",
         "missing optimizer": "optimizer.safetensors"}


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_checkpoint_is_a_checkpoint_error_and_leaves_the_model_untouched(checkpoints, how):
    _, found = checkpoints
    _damage(found[4], how)
    model = tiny_model(style="gemma")
    before = _state(model)
    optimizer = SliceAdamW([(s, p) for s, p in _slices(model)])
    with pytest.raises(CheckpointError, match=NAMED[how]):
        load_tuned(model, found[4], optimizer=optimizer)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{how}: {name} was changed by a failed load"
    assert optimizer.step_count == 0 and all(not m.any() for m in optimizer.exp_avg.values())


def _slices(model):
    from finetune.masks import apply_selection, precise_selection

    return apply_selection(model, precise_selection(model, HEADS)).parameters()


@pytest.mark.parametrize("how", DAMAGE)
def test_resume_falls_back_to_the_newest_intact_checkpoint(checkpoints, sft_rows, how):
    out, found = checkpoints
    _damage(found[4], how)
    reference = tiny_model(style="gemma")
    train(reference, sft_rows, CFG, method="precise", heads=HEADS)
    model = tiny_model(style="gemma")
    with pytest.warns(RuntimeWarning, match=f"step-00000004(.|\n)*resuming from .*step-00000002"):
        result = train(model, sft_rows, CFG, method="precise", heads=HEADS, out_dir=out)
    assert result.resumed_from == found[2]
    for name, value in reference.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), f"{how}: {name} differs from the uninterrupted run"


def test_no_intact_checkpoint_is_an_error_not_a_silent_restart(checkpoints, sft_rows):
    out, found = checkpoints
    _damage(found[4], "flipped byte")
    _damage(found[2], "corrupt state")
    with pytest.raises(CheckpointError, match="No intact checkpoint(.|\n)*step-00000004(.|\n)*step-00000002"):
        train(tiny_model(style="gemma"), sft_rows, CFG, method="precise", heads=HEADS, out_dir=out)


def test_intact_resume_gives_no_warning(checkpoints, sft_rows):
    out, _ = checkpoints
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = train(tiny_model(style="gemma"), sft_rows, CFG, method="precise", heads=HEADS, out_dir=out)
    assert result.resumed_from is not None
    manifest = json.loads((result.out_dir / "final" / "manifest.json").read_text())
    assert set(manifest["files"]) == {"weights.safetensors", "state.json"}


def test_a_checkpoint_whose_step_was_edited_is_refused(checkpoints, sft_rows):
    """state.json's step edited and the manifest refreshed: the run resumed from the wrong step without a word."""
    out, found = checkpoints
    state_file = found[4] / "state.json"
    state = json.loads(state_file.read_text())
    state["step"] = 3
    state_file.write_text(json.dumps(state))
    refresh_manifest(found[4])
    message = r"step-00000004/state\.json records step 3, but its folder step-00000004 is the checkpoint of step 4"
    with pytest.raises(CheckpointError, match=message):
        train(tiny_model(style="gemma"), sft_rows, CFG, method="precise", heads=HEADS, out_dir=out)
    model = tiny_model(style="gemma")
    before = _state(model)
    with pytest.raises(CheckpointError, match=message):
        load_tuned(model, found[4])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    state["step"], state["losses"] = 4, state["losses"][:3]  # the step restored, but a loss dropped
    state_file.write_text(json.dumps(state))
    refresh_manifest(found[4])
    with pytest.raises(CheckpointError, match=r"records 3 losses for step 4 \(one per step is written\)"):
        load_tuned(model, found[4])


def test_a_missing_path_or_a_file_is_named_not_called_damaged(checkpoints, tmp_path):
    """Both used to say 'Checkpoint <path> is damaged: ... manifest.json is missing'; nothing was damaged."""
    _, found = checkpoints
    model = tiny_model(style="gemma")
    with pytest.raises(CheckpointError, match=r"nope does not exist: pass the folder save_tuned or train wrote"):
        load_tuned(model, tmp_path / "nope")
    with pytest.raises(CheckpointError, match=r"weights\.safetensors is a file, not a checkpoint folder: pass the "
                                              r"folder save_tuned or train wrote \(the one holding manifest\.json"):
        load_tuned(model, found[4] / "weights.safetensors")


def test_rows_outside_the_model_are_refused_before_any_tensor_changes(checkpoints):
    """A sliced parameter's rows beyond the model's (an edited state.json, refreshed manifest) failed in index_copy_
    after earlier slices had already been written."""
    _, found = checkpoints
    state_file = found[4] / "state.json"
    state = json.loads(state_file.read_text())
    sliced = next(s for s in state["selection"]["slices"] if s["index"] is not None)
    sliced["index"][-1] = 10_000
    state_file.write_text(json.dumps(state))
    refresh_manifest(found[4])
    model = tiny_model(style="gemma")
    before = _state(model)
    with pytest.raises(CheckpointError, match=rf"state\.json: the rows of {sliced['name']} include \[10000\], but the "
                                              r"model's .* has rows 0\.\.\d+: the checkpoint was written for another"):
        load_tuned(model, found[4])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


HERE = Path(__file__).parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
import kill_train_script as script  # noqa: E402

sys.path.remove(str(HERE))


def _killed_run(out_dir: Path, method: str, when: str) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(HERE / "kill_train_script.py"), str(out_dir), method, when],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, f"expected a SIGKILL, got rc {done.returncode}: {done.stderr[-2000:]}"


@pytest.mark.parametrize("method,when,resumes_at", [
    ("precise", "after-step-3", 2),
    ("full", "after-step-3", 2),
    ("precise", "mid-checkpoint-4", 2),
])
def test_killed_run_resumes_bit_exact(method, when, resumes_at, tmp_path):
    _killed_run(tmp_path, method, when)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [resumes_at]
    if when.startswith("mid-checkpoint"):  # the cut-off write is left as a staging directory, never as step-4
        staging = [p.name for p in (tmp_path / "checkpoints").iterdir() if ".tmp-" in p.name]
        assert staging and all(name.startswith(".step-00000004") for name in staging)

    reference = tiny_model(style="gemma")
    train(reference, script.data(reference), script.CONFIG, method=method, heads=script.HEADS[method])

    resumed = tiny_model(style="gemma")  # a new process starts from the base weights
    result = train(resumed, script.data(resumed), script.CONFIG, method=method, heads=script.HEADS[method],
                   out_dir=tmp_path)
    assert result.resumed_from is not None and result.resumed_from.name == f"step-{resumes_at:08d}"
    assert len(result.losses) == script.CONFIG.max_steps
    after = resumed.state_dict()
    changed = 0
    base = tiny_model(style="gemma").state_dict()
    for name, value in reference.state_dict().items():
        assert torch.equal(value, after[name]), f"{method}/{when}: {name} differs from the uninterrupted run"
        changed += int(not torch.equal(value, base[name]))
    assert changed > 0  # training moved the weights: the comparison is not vacuous
    assert (tmp_path / "final" / "weights.safetensors").is_file()


def test_saving_tuned_weights_never_replaces_a_folder_it_did_not_write(tmp_path):
    """save_tuned on a user's folder deleted its files (it replaced any existing folder)."""
    from finetune.masks import precise_selection

    model = tiny_model()
    selection = precise_selection(model, [Head(0, 0)])
    mine = tmp_path / "my_folder"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("notes")
    (mine / "sub" / "data.csv").write_text("1,2")
    with pytest.raises(CheckpointError, match=r"my_folder exists and is not a tuned-weights or checkpoint folder "
                                              r"written by the toolkit .* so it is not replaced"):
        save_tuned(model, selection, mine)
    assert (mine / "notes.txt").read_text() == "notes" and (mine / "sub" / "data.csv").read_text() == "1,2"
    ours = save_tuned(model, selection, tmp_path / "tuned")
    save_tuned(model, selection, ours)  # its own folder is replaced (checkpoints are rewritten)
    (tmp_path / "empty").mkdir()
    save_tuned(model, selection, tmp_path / "empty")
    assert (tmp_path / "empty" / "state.json").is_file()


def test_replacing_a_toolkit_folder_never_deletes_files_added_to_it(tmp_path):
    """save_tuned replaced a folder it had written together with the files a user put there since."""
    from finetune.masks import precise_selection

    model = tiny_model()
    selection = precise_selection(model, [Head(0, 0)])
    ours = save_tuned(model, selection, tmp_path / "tuned")
    (ours / "my_notes.txt").write_text("mine")
    (ours / "extra").mkdir()
    with pytest.raises(CheckpointError, match=r"tuned holds files the toolkit did not write: extra/, my_notes.txt; "
                                              r"move them or choose another folder"):
        save_tuned(model, selection, ours)
    assert (ours / "my_notes.txt").read_text() == "mine" and (ours / "extra").is_dir()
    (ours / "my_notes.txt").unlink()
    (ours / "extra").rmdir()
    save_tuned(model, selection, ours)  # only its own files again: replaced as before
    # a manifest of the toolkit's format that lists nothing does not make the folder's files the toolkit's
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / "manifest.json").write_text(json.dumps({"format": "arith-circuits-tuned", "files": {}}))
    (forged / "notes.txt").write_text("notes")
    with pytest.raises(CheckpointError, match=r"forged holds files the toolkit did not write: notes.txt; move them"):
        save_tuned(model, selection, forged)
    assert (forged / "notes.txt").read_text() == "notes"


def test_pruning_leaves_step_folders_the_toolkit_did_not_write(tmp_path):
    """prune_checkpoints deleted any step-<N> folder with a state.json, a user's own included."""
    from finetune.checkpoints import checkpoint_dir, prune_checkpoints
    from finetune.masks import precise_selection

    model = tiny_model()
    selection = precise_selection(model, [Head(0, 0)])
    mine = checkpoint_dir(tmp_path, 0)
    mine.mkdir(parents=True)
    (mine / "state.json").write_text("{}")
    (mine / "results.txt").write_text("my results")
    for step in (1, 2, 3, 4):
        save_tuned(model, selection, checkpoint_dir(tmp_path, step), state={"step": step})
    (checkpoint_dir(tmp_path, 4) / "notes.txt").write_text("notes")
    with pytest.warns(RuntimeWarning, match=r"Not pruning step-00000000 \(no manifest.json of format "
                                            r"'arith-circuits-tuned'\), step-00000004 \(holds files the toolkit did "
                                            r"not write: notes.txt\) under .*checkpoints: the toolkit did not write "
                                            r"them, so they are left as they are; move them out of"):
        prune_checkpoints(tmp_path, keep=1)
    assert (mine / "results.txt").read_text() == "my results" and (mine / "state.json").is_file()
    assert (checkpoint_dir(tmp_path, 4) / "notes.txt").is_file()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [0, 3, 4]  # the newest toolkit checkpoint is kept
