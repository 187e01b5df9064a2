"""load_model / save_model contracts: nothing replaced that the toolkit did not write, bad names and devices
refused clearly, manifests that are not manifests reported, and no remote code without an explicit opt-in."""

from __future__ import annotations

import json

import pytest
import torch
from transformer_lens import HookedTransformer

from circuits import loading, model_cache as cache
from circuits.model_cache import CorruptModelDirError, ModelDirExistsError, save_model, verify_model_dir
from circuits.errors import InputError, ToolkitError
from circuits.loading import ModelNotAvailableError, RemoteCodeError, load_model
from tests.tiny_models import tiny_model


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


def test_empty_name_and_file_path_are_refused(tmp_path):
    with pytest.raises(InputError, match="name is empty"):
        load_model("", device="cpu")
    saved = save_model(tiny_model(), tmp_path / "m")
    with pytest.raises(ModelNotAvailableError, match="it is a file, not a directory"):
        load_model(saved / cache.WEIGHTS_FILE, device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a CPU-only torch")
def test_cuda_on_cpu_torch_is_a_clear_error():
    with pytest.raises(InputError, match="sees no CUDA GPU; use device='cpu' or 'auto'"):
        load_model("gemma-3-270m", device="cuda")
    with pytest.raises(InputError, match="Unknown device 'bogus'"):
        loading.resolve_device("bogus")


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


@pytest.fixture
def fake_hub(monkeypatch):
    """A reachable hub whose downloads are recorded instead of made."""
    calls = []
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(loading, "_hub_reachable", lambda timeout=3.0: True)

    def fake_from_pretrained(name, **kwargs):
        calls.append((name, kwargs))
        return tiny_model()

    monkeypatch.setattr(HookedTransformer, "from_pretrained_no_processing", staticmethod(fake_from_pretrained))
    return calls


def test_remote_code_models_are_refused_unless_allowed(fake_hub, monkeypatch):
    with pytest.raises(RemoteCodeError, match="allow_remote_code=True"):
        load_model("microsoft/phi-2", device="cpu")
    assert fake_hub == []  # nothing was downloaded or run
    load_model("microsoft/phi-2", device="cpu", allow_remote_code=True)
    assert fake_hub[-1][1].get("trust_remote_code") is True


def test_architectures_whose_tl_config_turns_remote_code_on_are_refused(fake_hub, monkeypatch):
    from transformer_lens import loading_from_pretrained as tl_loading

    monkeypatch.setattr(tl_loading, "get_pretrained_model_config",
                        lambda name, **k: type("Cfg", (), {"trust_remote_code": "Qwen" in name})())
    with pytest.raises(RemoteCodeError, match="turns remote code on"):
        load_model("Qwen/Qwen2-0.5B", device="cpu")
    assert fake_hub == []
    load_model("gpt2", device="cpu")  # an architecture without remote code loads as before
    assert fake_hub[-1][0] == "gpt2" and "trust_remote_code" not in fake_hub[-1][1]
