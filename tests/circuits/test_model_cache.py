"""circuits.model_cache: saved-model directories (save, round trip, manifest, corruption named, no
folder replaced that save_model did not write), on tiny random models."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from circuits import model_cache as cache
from circuits.model_cache import CorruptModelDirError, NotAModelDirError, save_model, verify_model_dir, ModelDirExistsError
from circuits.loading import load_model
from tests.damaged_files import forge_safetensors_header, refresh_manifest
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


def test_forged_weights_header_is_named_even_with_a_refreshed_manifest(saved):
    """A forged safetensors header was a raw SafetensorError naming no file once the manifest was recomputed."""
    forge_safetensors_header(saved / cache.WEIGHTS_FILE)
    refresh_manifest(saved)
    assert verify_model_dir(saved) == []  # the manifest now agrees: only the reader can notice
    with pytest.raises(CorruptModelDirError, match=r"model\.safetensors is not a readable safetensors file "
                                                   r"\(.*header.*\)\. Save the model again \(circuits\.save_model\)"):
        load_model(saved, device="cpu")
    (saved / cache.CONFIG_FILE).write_bytes(b"\xff\xfe not json")
    refresh_manifest(saved)
    with pytest.raises(CorruptModelDirError, match=r"config\.json is not a text file"):
        load_model(saved, device="cpu")


def test_a_folder_that_was_never_a_model_is_not_called_damaged(tmp_path):
    """A plain folder was "not intact ... or delete the directory": advice to delete someone's files."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "notes.txt").write_text("precious")
    with pytest.raises(NotAModelDirError, match=r"results is not a saved model folder: it holds none of manifest\.json, "
                                                r"model\.safetensors, config\.json\. Pass the folder circuits\.save_model "
                                                r"wrote") as err:
        load_model(tmp_path / "results", device="cpu")
    assert "delete" not in str(err.value) and isinstance(err.value, CorruptModelDirError)
    save_model(tiny_model(), tmp_path / "parent" / "tiny")  # a parent folder: its saved model is named
    with pytest.raises(NotAModelDirError, match=r"\(tiny inside it is\)"):
        load_model(tmp_path / "parent", device="cpu")
    # model files without a manifest (a Hugging Face folder, a copy by hand): not a save_model folder, kept
    hf = tmp_path / "hf"
    save_model(tiny_model(), hf)
    (hf / cache.MANIFEST_FILE).unlink()
    with pytest.raises(CorruptModelDirError, match=r"hf is not a model directory written by circuits\.save_model: "
                                                   r"manifest\.json is missing") as err:
        load_model(hf, device="cpu")
    assert "delete" not in str(err.value)
    assert (tmp_path / "results" / "notes.txt").read_text() == "precious"


def test_nan_weights_are_refused_even_with_a_refreshed_manifest(saved):
    """NaN weights passed every check once the manifest was recomputed, and attention hid them (NaN patterns -> 0)."""
    from safetensors.torch import load_file, save_file

    weights = saved / cache.WEIGHTS_FILE
    tensors = load_file(str(weights))
    key = next(k for k in tensors if k.endswith("attn.W_Q"))
    tensors[key].view(-1)[0] = float("nan")
    save_file(tensors, str(weights))
    refresh_manifest(saved)
    assert verify_model_dir(saved) == []
    with pytest.raises(CorruptModelDirError, match=rf"holds NaN or Inf values in 1 tensors \({key}\)"):
        load_model(saved, device="cpu")


def test_a_model_with_nan_weights_is_not_saved(tmp_path):
    from circuits.errors import InputError

    model = tiny_model(n_layers=1)
    with torch.no_grad():
        model.blocks[0].attn.W_Q[0, 0, 0] = float("nan")  # load_model would refuse the folder it wrote
    with pytest.raises(InputError, match=r"NaN or Inf weights in 1 tensors \(blocks\.0\.attn\.W_Q\)"):
        save_model(model, tmp_path / "m")
    assert not (tmp_path / "m").exists()


def _edit_config(saved, **changes):
    config = json.loads((saved / cache.CONFIG_FILE).read_text())
    config.update(changes)
    (saved / cache.CONFIG_FILE).write_text(json.dumps(config))
    refresh_manifest(saved)  # only the reader can notice


@pytest.mark.parametrize(("changes", "message"), [
    # a raw allocator error naming no file, before the config was checked
    ({"d_vocab": 10**12}, r"config\.json: d_vocab is 1000000000000; a saved config gives a whole number in "
                          r"1\.\.2147483647\. Save the model again"),
    # TransformerLens' raw AssertionError naming no file
    ({"act_fn": "__import__('os').system('true')"}, r"config\.json: act_fn is \"__import__\('os'\).*\"; it must be "
                                                    r"one of \[.*'gelu_new'.*\]"),
    ({"n_heads": "4"}, r"config\.json: n_heads is '4'; a saved config gives a whole number"),
    ({"gated_mlp": "false"}, r"config\.json: gated_mlp is 'false'; it must be true or false"),
    ({"normalization_type": "BatchNorm"}, r"normalization_type is 'BatchNorm'; it must be one of \[None, 'LN'"),
    # sane numbers that do not fit the weights: named before a model of those sizes is allocated
    ({"d_vocab": 50_000}, r"config\.json implies embed\.W_E of shape \(50000, 32\) \(d_vocab, d_model\), but "
                          r".*model\.safetensors holds one of shape \(\d+, 32\): the config does not fit the weights"),
    ({"n_layers": 7}, r"config\.json gives n_layers 7, but .*model\.safetensors holds the blocks \[0, 1\] \(2 layers\)"),
    ({"d_mlp": 4096}, r"implies blocks\.0\.mlp\.W_in of shape \(32, 4096\) \(d_model, d_mlp\)"),
])
def test_a_config_is_checked_against_its_weights_before_the_model_is_built(saved, changes, message):
    _edit_config(saved, **changes)
    assert verify_model_dir(saved) == []
    with pytest.raises(CorruptModelDirError, match=message):
        load_model(saved, device="cpu")
