"""Checkpoints are verified before they touch the model; training refuses settings and losses that are not finite."""

import json
import warnings

import pytest
import torch

from circuits.errors import InputError
from circuits.nodes import Head
from tests.tiny_models import tiny_model
from finetune.checkpoints import CheckpointError, list_checkpoints, load_tuned
from finetune.optim import SliceAdamW
from finetune.trainer import NonFiniteLossError, TrainConfig, train
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


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("lr", float("nan"), "lr must be a finite number > 0"),
        ("lr", float("inf"), "lr must be a finite number > 0"),
        ("lr", -1e-3, "lr must be a finite number > 0"),
        ("lr", 0.0, "lr must be a finite number > 0"),
        ("betas", (1.0, 0.999), r"beta1 must lie in \[0, 1\)"),
        ("betas", (0.9, -0.1), r"beta2 must lie in \[0, 1\)"),
        ("betas", (0.9, float("nan")), r"beta2 must lie in \[0, 1\)"),
        ("eps", 0.0, "eps must be a finite number > 0"),
        ("warmup_ratio", 2.0, r"warmup_ratio must lie in \[0, 1\]"),
    ],
)
def test_bad_optimizer_settings_are_refused(field, value, message):
    with pytest.raises(InputError, match=message):
        TrainConfig(**{field: value})


def test_slice_adamw_refuses_betas_of_one():
    model = tiny_model(style="gemma")
    with pytest.raises(InputError, match=r"beta1 must lie in \[0, 1\)"):
        SliceAdamW(list(_slices(model)), betas=(1.0, 0.999))


def test_non_finite_loss_stops_training_without_final_weights(sft_rows, tmp_path):
    model = tiny_model(style="gemma")
    with torch.no_grad():
        model.unembed.W_U[0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match="Step 1: the loss is nan"):
        train(model, sft_rows, CFG, method="full", out_dir=tmp_path)
    assert not (tmp_path / "final").exists()
