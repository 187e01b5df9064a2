"""circuits.loading: names, devices and dtypes resolved or refused clearly, the offline cache built once
and rebuilt when corrupt or stale, no remote code without an explicit opt-in (tiny random models)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformer_lens import HookedTransformer

from circuits import loading, model_cache as cache
from circuits.model_cache import NotAModelDirError, save_model, verify_model_dir
from circuits.loading import ModelNotAvailableError, OfflineModel, load_model, RemoteCodeError
from tests.tiny_models import tiny_model
from circuits.errors import InputError


PROMPTS = ["7 + 5 = ", "12 - 4 = 8\n3 * 3 = ", "The capital of France is"]


def test_load_casts_to_requested_dtype(tmp_path):
    save_model(tiny_model(), tmp_path / "m")
    model = load_model(tmp_path / "m", device="cpu", dtype="bf16")
    assert model.cfg.dtype == torch.bfloat16
    assert model.W_E.dtype == torch.bfloat16


def test_processing_keeps_log_probs(tmp_path):
    save_model(tiny_model(style="gpt2"), tmp_path / "m")
    raw = load_model(tmp_path / "m", device="cpu")
    processed = load_model(tmp_path / "m", device="cpu", processing=True)
    assert processed.cfg.normalization_type == "LNPre"
    tokens = raw.to_tokens(PROMPTS[0])
    with torch.no_grad():
        diff = (raw(tokens).log_softmax(-1) - processed(tokens).log_softmax(-1)).abs().max()
    assert diff < 1e-4


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


def test_n_devices_must_be_positive():
    with pytest.raises(ValueError, match="n_devices must be >= 1"):
        loading.load_model("gpt2", n_devices=0)


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


def test_a_config_the_hub_cannot_serve_is_a_clear_error_not_the_raw_connection_error(fake_hub, monkeypatch):
    """Behind a proxy on an offline machine, phi-1_5's config (which says it runs remote code) raised the hub's raw
    OSError, while names TransformerLens lists got the remote-code refusal without the hub."""
    from transformer_lens import loading_from_pretrained as tl_loading

    def no_connection(name, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them "
                      "in the cached files.\nCheck your internet connection.")

    monkeypatch.setattr(tl_loading, "get_pretrained_model_config", no_connection)
    with pytest.raises(ModelNotAvailableError, match=r"Cannot load 'microsoft/phi-1_5': its config could not be read "
                                                     r"from the Hugging Face hub \(OSError: We couldn't connect.*\), and "
                                                     r"the config says whether loading it runs remote code"):
        load_model("microsoft/phi-1_5", device="cpu")
    assert fake_hub == []
    with pytest.raises(RemoteCodeError, match="allow_remote_code=True"):  # listed: refused without the hub, as before
        load_model("microsoft/phi-2", device="cpu")


def test_an_empty_folder_named_like_a_model_says_that_it_shadows_the_name(tmp_path, monkeypatch):
    """It said only '... is not a saved model folder', and the user saw no reason why 'gpt2' was read as a folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()
    with pytest.raises(NotAModelDirError, match=r"gpt2 is a local folder that is not a saved model, and its path 'gpt2' "
                                                r"is also the name of a TransformerLens model: the folder shadows the "
                                                r"model name\. To load the hub model, run from another directory"):
        load_model("gpt2", device="cpu")
    (tmp_path / "my-run").mkdir()  # not a model name: the plain message
    with pytest.raises(NotAModelDirError, match=r"my-run is not a saved model folder"):
        load_model("my-run", device="cpu")
