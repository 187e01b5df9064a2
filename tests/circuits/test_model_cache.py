"""circuits.model_cache: saved-model directories (save, round trip, manifest, corruption named, no
folder replaced that save_model did not write), on tiny random models."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from circuits import model_cache as cache
from circuits.model_cache import CorruptModelDirError, save_model, verify_model_dir, ModelDirExistsError
from circuits.loading import load_model
from tests.tiny_models import tiny_model
from circuits.errors import ToolkitError


PROMPTS = ["7 + 5 = ", "12 - 4 = 8\n3 * 3 = ", "The capital of France is"]


# --------------------------------------------------------------------------- save / load round trip


@pytest.mark.parametrize("style", ["gpt2", "llama", "gemma"])
def test_save_load_round_trip_gives_identical_logits(tmp_path, style):
    model = tiny_model(style=style, n_key_value_heads=2 if style == "llama" else None)
    path = save_model(model, tmp_path / "saved")
    again = load_model(str(path), device="cpu", dtype="float32")
    tokens = model.to_tokens(PROMPTS[:2])
    with torch.no_grad():
        assert torch.equal(model(tokens), again(tokens))
    assert again.cfg.n_key_value_heads == model.cfg.n_key_value_heads
    assert again.to_str_tokens("1 + 2") == model.to_str_tokens("1 + 2")
    assert (tmp_path / "saved" / cache.MANIFEST_FILE).is_file()


def test_save_refuses_to_overwrite_unless_asked(tmp_path):
    model = tiny_model()
    save_model(model, tmp_path / "m")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_model(model, tmp_path / "m")
    save_model(tiny_model(seed=1), tmp_path / "m", overwrite=True)
    assert not verify_model_dir(tmp_path / "m")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "staging directories left behind"


def test_processed_model_round_trips(tmp_path):
    model = load_model(save_model(tiny_model(style="llama"), tmp_path / "raw"), device="cpu", processing=True)
    again = load_model(save_model(model, tmp_path / "processed"), device="cpu")
    assert again.cfg.normalization_type == "RMSPre"
    tokens = model.to_tokens(PROMPTS[0])
    with torch.no_grad():
        assert torch.equal(model(tokens), again(tokens))


# --------------------------------------------------------------------------- manifest and corruption


@pytest.fixture
def saved(tmp_path):
    return save_model(tiny_model(), tmp_path / "saved")


def _corrupt(path, how):
    weights = path / cache.WEIGHTS_FILE
    if how == "flip":
        data = bytearray(weights.read_bytes())
        data[-10] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif how == "truncate":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif how == "delete_manifest":
        (path / cache.MANIFEST_FILE).unlink()
    elif how == "delete_file":
        (path / cache.CONFIG_FILE).unlink()


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("flip", "model.safetensors has the right size but a different sha256"),
        ("truncate", "model.safetensors has"),
        ("delete_manifest", "manifest.json is missing"),
        ("delete_file", "config.json is missing"),
    ],
)
def test_corruption_is_detected_and_named(saved, how, message):
    assert verify_model_dir(saved) == []
    _corrupt(saved, how)
    problems = verify_model_dir(saved)
    assert any(message in p for p in problems), problems
    with pytest.raises(CorruptModelDirError, match=message.split(" has")[0]):
        load_model(saved, device="cpu")


def test_manifest_lists_every_file(saved):
    manifest = json.loads((saved / cache.MANIFEST_FILE).read_text())
    assert {cache.WEIGHTS_FILE, cache.CONFIG_FILE} <= set(manifest["files"])
    assert any(name.startswith(f"{cache.TOKENIZER_DIR}/") for name in manifest["files"])


def test_no_warning_on_intact_directory(saved):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        load_model(saved, device="cpu")


def test_save_model_overwrite_refuses_a_folder_that_is_not_a_saved_model(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("precious")
    with pytest.raises(ModelDirExistsError, match="not a model directory written by circuits.save_model"):
        save_model(tiny_model(), tmp_path / "data", overwrite=True)
    assert (tmp_path / "data" / "notes.txt").read_text() == "precious"
    assert issubclass(ModelDirExistsError, (ToolkitError, FileExistsError))
    save_model(tiny_model(), tmp_path / "empty_ok")  # an empty or a saved-model folder may be replaced
    save_model(tiny_model(seed=1), tmp_path / "empty_ok", overwrite=True)
    assert verify_model_dir(tmp_path / "empty_ok") == []


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (["model.safetensors"], "is not a manifest"),
        ("drop_size", "lacks its size or sha256"),
        ("escape", "a path outside the directory"),
    ],
)
def test_malformed_manifests_are_reported(tmp_path, manifest, message):
    saved = save_model(tiny_model(), tmp_path / "m")
    path = saved / cache.MANIFEST_FILE
    data = json.loads(path.read_text())
    if manifest == "drop_size":
        del data["files"][cache.WEIGHTS_FILE]["size"]
    elif manifest == "escape":
        (tmp_path / "outside.txt").write_text("x")
        data["files"]["../outside.txt"] = {"size": 1, "sha256": "0" * 64}
    else:
        data = manifest
    path.write_text(json.dumps(data))
    problems = verify_model_dir(saved)
    assert any(message in p for p in problems), problems
    with pytest.raises(CorruptModelDirError, match=message):
        load_model(saved, device="cpu")
