"""Model directories on disk: the format behind ``save_model`` and the offline-model cache.

A *model directory* holds one `HookedTransformer` in a form that loads in
seconds, with no Hugging Face model and no hub:

```
model.safetensors   the TransformerLens state dict (parameters only; buffers that
                    the config determines, such as rotary tables, are rebuilt)
config.json         the HookedTransformerConfig, as JSON
tokenizer/          the tokenizer, from ``save_pretrained`` (absent if the model has none)
manifest.json       size and sha256 of every file above; written last
```

The manifest is what makes a directory trustworthy. It is written after every
other file, so a directory without one was never finished; and every load
re-checks sizes and hashes (~1 s for gemma-3-270m's 1.7 GB), so a truncated
download or a flipped byte is reported by name instead of silently producing a
subtly wrong model.

Directories are published atomically: they are built under a unique temporary
name next to their destination and renamed into place, so a reader never sees
a half-written one, and two processes building the same directory at once
cannot mix their files (the second rename loses and its copy is discarded).

The config is checked before a model is built from it (a manifest can be refreshed after an edit):
every size a whole number in a sane range, ``act_fn`` and the other options among the allowed values,
and the sizes equal to the weights' shapes in the safetensors header (`check_saved_config`,
`check_config_fits_weights`), so a damaged number is named instead of allocated.

Weights are stored with safetensors only: no pickle is ever read or written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformer_lens import HookedTransformer, HookedTransformerConfig

from circuits.arguments import check_finite_weights
from circuits.atomic_files import write_text_atomic
from circuits.errors import ToolkitError
from circuits.file_reads import load_safetensors, open_safetensors, read_json

FORMAT_NAME = "arith-circuits-model"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_DIR = "tokenizer"
MANIFEST_FILE = "manifest.json"

# Buffers TransformerLens recomputes from the config in __init__; storing them
# would only add ~40 MB of rotary tables per model and tie files to TL internals.
DERIVED_BUFFERS = ("IGNORE", "mask", "rotary_sin", "rotary_cos")


class CorruptModelDirError(ToolkitError, ValueError):
    """A model directory is incomplete or its files do not match its manifest.

    ``problems`` holds one message per problem (which file, what is wrong).
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems or [message])


class NotAModelDirError(CorruptModelDirError):
    """A folder passed as a saved model holds no model at all (no manifest, weights or config).

    A subclass of :class:`CorruptModelDirError`, so code that catches damaged model folders
    (the offline cache rebuilds them) catches this one too; its message does not advise deleting
    the folder, which may hold anything.
    """


class ModelDirExistsError(ToolkitError, FileExistsError):
    """`save_model` was asked to write where something already is (and may not be replaced)."""


# --------------------------------------------------------------------------- config


def config_to_json(cfg: HookedTransformerConfig) -> dict[str, Any]:
    """The config as a JSON-serialisable dict (dtypes become strings such as ``"float32"``)."""
    out = {}
    for key, value in cfg.to_dict().items():
        if isinstance(value, torch.dtype):
            value = str(value).removeprefix("torch.")
        elif isinstance(value, torch.device):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out


def config_from_json(
    data: dict[str, Any], *, device: str | torch.device, dtype: torch.dtype
) -> HookedTransformerConfig:
    """Rebuild a `HookedTransformerConfig` saved by `config_to_json`, for ``device`` and ``dtype``.

    Keys that are not constructor fields (values TL derives itself) are dropped,
    and ``init_weights`` is off: the weights come from the state dict.
    """
    init_fields = {f.name for f in dataclasses.fields(HookedTransformerConfig) if f.init}
    kwargs = {k: v for k, v in data.items() if k in init_fields}
    kwargs.update(device=str(device), dtype=dtype, init_weights=False, n_devices=1)
    return HookedTransformerConfig(**kwargs)


# --------------------------------------------------------------------------- manifest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def file_entries(directory: str | Path, exclude: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size", "sha256"}}`` of every file under ``directory`` but ``exclude``."""
    directory = Path(directory)
    return {
        p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.relative_to(directory).as_posix() not in exclude
    }


def check_files(directory: str | Path, files: Any, manifest_name: str = MANIFEST_FILE) -> list[str]:
    """Check the files of ``directory`` against manifest entries ``files`` (from `file_entries`).

    One message per problem: an entry that is malformed or points outside ``directory``, a
    missing file, a size mismatch (truncation) or a sha256 mismatch (any changed byte).
    """
    directory = Path(directory)
    if not isinstance(files, dict):
        return [f"{manifest_name} is not a manifest (a JSON object with a 'files' object); it was replaced or damaged"]
    problems, to_hash = [], []
    root = directory.resolve()
    for name, expected in sorted(files.items()):  # cheap checks first, hashing last
        path = directory / name
        if not _confined(root, name):
            problems.append(f"{manifest_name} lists {name!r}, a path outside the directory")
        elif not (isinstance(expected, dict) and isinstance(expected.get("size"), int)
                  and isinstance(expected.get("sha256"), str)):
            problems.append(f"{manifest_name} entry for {name} lacks its size or sha256")
        elif not path.is_file():
            problems.append(f"{name} is missing")
        elif (size := path.stat().st_size) != expected["size"]:
            problems.append(f"{name} has {size} bytes, the manifest says {expected['size']} (truncated or replaced)")
        else:
            to_hash.append((name, path, expected["sha256"]))
    for name, path, sha256 in to_hash:
        if _sha256(path) != sha256:
            problems.append(f"{name} has the right size but a different sha256 (its content changed)")
    return problems


def write_manifest(directory: str | Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record size and sha256 of every file in ``directory`` in its manifest (call this last)."""
    directory = Path(directory)
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        **(extra or {}),
        "files": file_entries(directory, exclude=(MANIFEST_FILE,)),
    }
    write_text_atomic(directory / MANIFEST_FILE, json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def read_manifest(directory: str | Path) -> dict[str, Any] | None:
    """The manifest of ``directory``, or None when it is missing or unreadable."""
    try:
        return json.loads((Path(directory) / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested deeper than the parser follows
        return None


def _confined(root: Path, name: str) -> bool:
    """``name`` is a relative path that stays inside ``root`` (no absolute paths, ``..`` or symlinks out)."""
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        return False
    return (root / name).resolve().is_relative_to(root)


def verify_model_dir(directory: str | Path) -> list[str]:
    """Check ``directory`` against its manifest; return one message per problem (empty: intact).

    Detects a missing or unreadable manifest, an unknown format version,
    missing files, size mismatches (truncation) and sha256 mismatches (any
    changed byte). Files not listed in the manifest are ignored.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return [f"{directory} is not a directory"]
    manifest = read_manifest(directory)
    if manifest is None:
        return [f"{MANIFEST_FILE} is missing or unreadable (the directory was never completed, or not by save_model)"]
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files", {}), dict):
        return [f"{MANIFEST_FILE} is not a manifest (a JSON object with a 'files' object); it was replaced or damaged"]
    if manifest.get("format") != FORMAT_NAME or manifest.get("format_version") != FORMAT_VERSION:
        return [
            f"{MANIFEST_FILE} declares format {manifest.get('format')!r} version "
            f"{manifest.get('format_version')!r}; this version reads {FORMAT_NAME!r} version {FORMAT_VERSION}"
        ]
    problems = []
    files = manifest.get("files", {})
    for required in (WEIGHTS_FILE, CONFIG_FILE):
        if required not in files:
            problems.append(f"{MANIFEST_FILE} does not list {required}")
    problems += check_files(directory, files)
    return problems


# --------------------------------------------------------------------------- save / load


def _chmod_by_umask(path: Path, mode: int) -> None:
    """Give ``path`` the permissions a plain ``open``/``mkdir`` would have (``mode`` less the umask)."""
    umask = os.umask(0o022)  # reading the umask means setting it; restore at once
    os.umask(umask)
    os.chmod(path, mode & ~umask)


def _state_dict_for_saving(model: HookedTransformer) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, value in model.state_dict().items():
        if key.rsplit(".", 1)[-1] in DERIVED_BUFFERS:
            continue
        tensor = value.detach().to("cpu").contiguous()
        # safetensors refuses tensors that share storage; copy the rare shared one.
        if tensor.untyped_storage().data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        tensors[key] = tensor
    return tensors


def write_model_files(model: HookedTransformer, directory: Path) -> None:
    """Write weights, config and tokenizer of ``model`` into the existing empty ``directory``."""
    weights = directory / WEIGHTS_FILE
    save_file(_state_dict_for_saving(model), str(weights), metadata={"format": FORMAT_NAME})
    _chmod_by_umask(weights, 0o666)  # safetensors creates its file private (0600)
    (directory / CONFIG_FILE).write_text(json.dumps(config_to_json(model.cfg), indent=2), encoding="utf-8")
    if model.tokenizer is not None:
        model.tokenizer.save_pretrained(str(directory / TOKENIZER_DIR))


@contextlib.contextmanager
def staging_dir(destination: Path) -> Iterator[Path]:
    """A fresh temporary directory next to ``destination``, removed on exit unless published."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{destination.name}.tmp-", dir=destination.parent))
    _chmod_by_umask(tmp, 0o777)  # mkdtemp makes it private (0700)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish_dir(staged: Path, destination: Path) -> None:
    """Move the finished ``staged`` directory to ``destination``, replacing what is there.

    An existing destination is first renamed aside (a rename is atomic), so at
    every moment ``destination`` is either the old complete directory, absent,
    or the new complete one.
    """
    aside = None
    if destination.exists():
        aside = destination.with_name(f".{destination.name}.old-{uuid.uuid4().hex}")
        os.replace(destination, aside)
    os.replace(staged, destination)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _is_replaceable(destination: Path) -> bool:
    """Only an empty folder or a model directory the toolkit wrote (its manifest says so) may be replaced."""
    if not destination.is_dir() or destination.is_symlink():
        return False
    manifest = read_manifest(destination)
    return not any(destination.iterdir()) or (isinstance(manifest, dict) and manifest.get("format") == FORMAT_NAME)


def save_model(model: HookedTransformer, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Save ``model`` (weights, config, tokenizer, manifest) as a model directory at ``path``.

    ``circuits.load_model(path)`` reloads it. Use this for fine-tuned or merged
    models. The directory is written atomically; an existing one is replaced
    only with ``overwrite=True``. Returns the directory's path.
    """
    destination = Path(path).expanduser()
    check_finite_weights(model)  # load_model would refuse the folder; refuse to write it
    if destination.exists() and not overwrite:
        raise ModelDirExistsError(f"{destination} already exists; pass overwrite=True to replace it.")
    if destination.exists() and not _is_replaceable(destination):
        raise ModelDirExistsError(
            f"{destination} is not a model directory written by circuits.save_model (no {MANIFEST_FILE} of format "
            f"{FORMAT_NAME!r}), so overwrite=True will not replace it: choose another path or move it away yourself."
        )
    with staging_dir(destination) as staged:
        write_model_files(model, staged)
        write_manifest(staged)
        publish_dir(staged, destination)
    return destination


def _load_tokenizer(path: Path) -> Any:
    """Load a saved tokenizer the way TransformerLens wants it: with ``add_bos_token=True``.

    ``save_pretrained`` does not record ``add_bos_token``, and TL's ``set_tokenizer``
    reloads any tokenizer that lacks it, which for gemma's 262k vocabulary
    costs ~4 s; asking for it here makes that reload a no-op.
    """
    from transformers import AutoTokenizer  # slow import, only needed here

    settings = read_json(path / "tokenizer_config.json", "a tokenizer's settings", error=CorruptModelDirError,
                         hint="Save the model again (circuits.save_model).")
    if isinstance(settings, dict) and settings.get("bos_token") is not None:
        try:
            return AutoTokenizer.from_pretrained(str(path), add_bos_token=True)
        except ValueError:  # tokenizers that cannot express a BOS template; TL falls back likewise
            pass
    return AutoTokenizer.from_pretrained(str(path))


def load_model_dir(
    directory: str | Path,
    *,
    device: str | torch.device,
    dtype: torch.dtype,
    verify: bool = True,
    expected: dict[str, Any] | None = None,
) -> HookedTransformer:
    """Build the `HookedTransformer` stored in ``directory`` (see the module docstring).

    With ``verify`` (the default) the files are checked against the manifest,
    and the manifest against ``expected`` (key -> value, e.g. the weights'
    source); `CorruptModelDirError` names every problem found. Hashing runs in a
    thread while the tokenizer and weights load (hashlib and torch release the
    GIL), so verification costs little wall time; no model is returned before it
    has passed.
    """
    directory = Path(directory)
    check_is_model_dir(directory)
    if not verify:
        return _build_model(directory, device, dtype)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-model-dir") as pool:
        pending = pool.submit(_problems, directory, expected or {})
        try:
            model = _build_model(directory, device, dtype)
        except Exception as err:
            # A damaged file often breaks loading first; report the damage, not the symptom.
            if problems := pending.result():
                raise CorruptModelDirError(_corrupt_message(directory, problems), problems) from err
            raise
        if problems := pending.result():
            raise CorruptModelDirError(_corrupt_message(directory, problems), problems)
    return model


def check_is_model_dir(directory: str | Path) -> None:
    """Raise :class:`NotAModelDirError` when ``directory`` holds none of a saved model's files.

    Such a folder was never a model (a parent folder, a run folder, a typo): its message says so and,
    when a subfolder holds a saved model, names it, instead of calling the folder damaged.
    """
    directory = Path(directory)
    if not directory.is_dir() or any((directory / name).exists() for name in (MANIFEST_FILE, WEIGHTS_FILE, CONFIG_FILE)):
        return
    inside = sorted(p.parent.name for p in directory.glob(f"*/{MANIFEST_FILE}"))
    where = f" ({', '.join(inside[:3])} inside it {'is' if len(inside) == 1 else 'are'})" if inside else ""
    raise NotAModelDirError(
        f"{directory} is not a saved model folder: it holds none of {MANIFEST_FILE}, {WEIGHTS_FILE}, {CONFIG_FILE}"
        f"{where}. Pass the folder circuits.save_model wrote (the one holding {MANIFEST_FILE}) or a model name.",
        [f"{directory} is not a saved model folder"],
    )


def require_intact_model_dir(directory: str | Path, expected: dict[str, Any] | None = None) -> None:
    """Raise :class:`CorruptModelDirError` unless ``directory`` is a model folder that matches its manifest.

    The check `load_model_dir` runs (sizes and sha256 of every file, the manifest's format, ``expected``
    manifest entries), for readers that take the weights without building a model (``merging``).
    """
    directory = Path(directory)
    check_is_model_dir(directory)
    if problems := _problems(directory, expected or {}):
        raise CorruptModelDirError(_corrupt_message(directory, problems), problems)


def _problems(directory: Path, expected: dict[str, Any]) -> list[str]:
    problems = verify_model_dir(directory)
    if not problems:
        manifest = read_manifest(directory) or {}
        problems = [
            f"{MANIFEST_FILE} records {key} {manifest.get(key)!r}, expected {value!r}"
            for key, value in expected.items()
            if manifest.get(key) != value
        ]
    return problems


def _corrupt_message(directory: Path, problems: list[str]) -> str:
    if not (directory / MANIFEST_FILE).is_file():
        # save_model publishes a folder only with its manifest, so this one was never a complete saved model
        # (a Hugging Face folder, a copy by hand): deleting it may lose what is not the toolkit's.
        return (f"The folder {directory} is not a model directory written by circuits.save_model: "
                f"{'; '.join(problems)}. Load the model by its name (or from where it came), then save it with "
                "circuits.save_model and load that folder.")
    return (
        f"The model directory {directory} is not intact: {'; '.join(problems)}. "
        "Save the model again (circuits.save_model) or delete the directory."
    )


# --------------------------------------------------------------------------- config checks (before any allocation)

#: The largest size a config may give (vocabulary, widths, context): beyond it the file is damaged, not a model.
MAX_SIZE = 2**31 - 1
_SIZES = ("n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab")
_OPTIONAL_SIZES = ("d_mlp", "n_key_value_heads", "rotary_dim", "window_size", "num_experts", "experts_per_token")
_OPTIONS = {"normalization_type": (None, "LN", "LNPre", "RMS", "RMSPre"),
            "positional_embedding_type": ("standard", "rotary", "shortformer", "alibi", "relative_positional_bias"),
            "attention_dir": ("causal", "bidirectional")}
_RESAVE = "Save the model again (circuits.save_model)."


def check_saved_config(data: dict[str, Any], source: str | Path) -> None:
    """Raise :class:`CorruptModelDirError` naming ``source`` unless every field TransformerLens builds a model from is
    sane: sizes whole numbers in 1..:data:`MAX_SIZE`, ``act_fn`` and the other options among the allowed values,
    flags true or false. TransformerLens would otherwise allocate what a damaged number asks for, or fail an
    assertion that names no file."""
    from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS

    def refuse(key: str, wanted: str) -> None:
        raise CorruptModelDirError(f"{source}: {key} is {data.get(key)!r}; {wanted}. {_RESAVE}",
                                   [f"{CONFIG_FILE}: {key} is {data.get(key)!r}"])

    def is_size(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_SIZE

    for key in _SIZES:
        if not is_size(data.get(key)):
            refuse(key, f"a saved config gives a whole number in 1..{MAX_SIZE}")
    for key in _OPTIONAL_SIZES:
        if data.get(key) is not None and not is_size(data[key]):
            refuse(key, f"it must be null or a whole number in 1..{MAX_SIZE}")
    if data.get("d_vocab_out", -1) != -1 and not is_size(data["d_vocab_out"]):
        refuse("d_vocab_out", f"it must be -1 (same as d_vocab) or a whole number in 1..{MAX_SIZE}")
    attn_only = data.get("attn_only", False)
    if not attn_only and data.get("act_fn") not in SUPPORTED_ACTIVATIONS:
        refuse("act_fn", f"it must be one of {sorted(SUPPORTED_ACTIVATIONS)}")
    for key, allowed in _OPTIONS.items():
        if key in data and data[key] not in allowed:
            refuse(key, f"it must be one of {list(allowed)}")
    flags = {f.name for f in dataclasses.fields(HookedTransformerConfig) if isinstance(f.default, bool)}
    for key in sorted(flags & data.keys()):
        if not isinstance(data[key], bool):
            refuse(key, "it must be true or false")


def _expected_shapes(data: dict[str, Any], key: str) -> tuple[tuple[int, ...], str] | None:
    """The shape ``config`` implies for the TransformerLens weight ``key`` (and its dimensions' names), if it implies one."""
    d_model, d_head, n_heads, d_mlp = data["d_model"], data["d_head"], data["n_heads"], data.get("d_mlp")
    n_kv = data.get("n_key_value_heads") or n_heads
    d_vocab_out = data["d_vocab"] if data.get("d_vocab_out", -1) == -1 else data["d_vocab_out"]
    name = key.split(".", 2)[-1] if key.startswith("blocks.") else key
    table = {
        "embed.W_E": ((data["d_vocab"], d_model), "d_vocab, d_model"),
        "unembed.W_U": ((d_model, d_vocab_out), "d_model, d_vocab_out"),
        "pos_embed.W_pos": ((data["n_ctx"], d_model), "n_ctx, d_model"),
        "attn.W_Q": ((n_heads, d_model, d_head), "n_heads, d_model, d_head"),
        "attn.W_K": ((n_heads, d_model, d_head), "n_heads, d_model, d_head"),
        "attn.W_V": ((n_heads, d_model, d_head), "n_heads, d_model, d_head"),
        "attn._W_K": ((n_kv, d_model, d_head), "n_key_value_heads, d_model, d_head"),
        "attn._W_V": ((n_kv, d_model, d_head), "n_key_value_heads, d_model, d_head"),
        "attn.W_O": ((n_heads, d_head, d_model), "n_heads, d_head, d_model"),
        "mlp.W_in": ((d_model, d_mlp), "d_model, d_mlp"),
        "mlp.W_gate": ((d_model, d_mlp), "d_model, d_mlp"),
        "mlp.W_out": ((d_mlp, d_model), "d_mlp, d_model"),
    }
    return table.get(name)


def check_config_fits_weights(data: dict[str, Any], config_file: Path, weights_file: Path) -> None:
    """Raise :class:`CorruptModelDirError` unless the sizes of ``data`` (a checked config) are those of the weights
    in ``weights_file``'s header: the layers, the embedding, every attention and MLP matrix. Only the header is
    read, so a damaged config is named before a model of its sizes is allocated."""
    header = open_safetensors(weights_file, error=CorruptModelDirError, hint=_RESAVE)
    shapes = {key: tuple(header.get_slice(key).get_shape()) for key in header.keys()}
    layers = {int(key.split(".")[1]) for key in shapes if key.startswith("blocks.") and key.split(".")[1].isdigit()}
    if layers != set(range(data["n_layers"])):
        raise CorruptModelDirError(
            f"{config_file} gives n_layers {data['n_layers']}, but {weights_file} holds the blocks "
            f"{sorted(layers)[:3]}{'...' if len(layers) > 3 else ''} ({len(layers)} layers): the config does not fit "
            f"the weights. {_RESAVE}", [f"{CONFIG_FILE} does not fit {WEIGHTS_FILE}"])
    if "embed.W_E" not in shapes:
        raise CorruptModelDirError(f"{weights_file} holds no embed.W_E: it is not a TransformerLens model's state "
                                   f"dict. {_RESAVE}", [f"{WEIGHTS_FILE} holds no embed.W_E"])
    for key, shape in shapes.items():
        expected = _expected_shapes(data, key)
        if expected is not None and shape != expected[0]:
            raise CorruptModelDirError(
                f"{config_file} implies {key} of shape {expected[0]} ({expected[1]}), but {weights_file} holds one of "
                f"shape {shape}: the config does not fit the weights. {_RESAVE}",
                [f"{CONFIG_FILE} does not fit {WEIGHTS_FILE}"])


def _build_model(directory: Path, device: str | torch.device, dtype: torch.dtype) -> HookedTransformer:
    data = read_json(directory / CONFIG_FILE, "a HookedTransformerConfig saved as JSON", error=CorruptModelDirError,
                     hint="Save the model again (circuits.save_model).")
    if not isinstance(data, dict):
        raise CorruptModelDirError(f"{directory / CONFIG_FILE} holds a JSON {type(data).__name__}, not a config object. "
                                   "Save the model again (circuits.save_model).")
    check_saved_config(data, directory / CONFIG_FILE)
    check_config_fits_weights(data, directory / CONFIG_FILE, directory / WEIGHTS_FILE)
    tokenizer = None
    if (directory / TOKENIZER_DIR).is_dir():
        tokenizer = _load_tokenizer(directory / TOKENIZER_DIR)
    else:
        # Without a tokenizer, TL would fetch cfg.tokenizer_name from the hub.
        data["tokenizer_name"] = None
    cfg = config_from_json(data, device=device, dtype=dtype)
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=True)
    if model.tokenizer is not None:
        # TL 3.9's to_str_tokens has a transformers-4 special case for tokenizers
        # whose name_or_path contains "gemma" that breaks under transformers 5; a
        # neutral name keeps it off (TL reads name_or_path nowhere else).
        model.tokenizer.name_or_path = f"arith-circuits:{TOKENIZER_DIR}"
    state_dict = {
        key: value.to(device=cfg.device, dtype=cfg.dtype if value.is_floating_point() else value.dtype)
        for key, value in load_safetensors(directory / WEIGHTS_FILE, error=CorruptModelDirError,
                                           hint="Save the model again (circuits.save_model).").items()
    }
    # A manifest refreshed after an edit passes the sha256 check; NaN/Inf weights would then give silent
    # nonsense (attention zeroes NaN patterns). One float64 sum per tensor finds them (NaN/Inf make it non-finite).
    broken = [key for key, value in state_dict.items()
              if value.is_floating_point() and not torch.isfinite(value.sum(dtype=torch.float64))
              and not bool(torch.isfinite(value).all())]
    if broken:
        raise CorruptModelDirError(
            f"{directory / WEIGHTS_FILE} holds NaN or Inf values in {len(broken)} tensors ({', '.join(broken[:5])}). "
            "Save the model again from a model with finite weights (circuits.save_model).",
            [f"{WEIGHTS_FILE} holds NaN or Inf values"],
        )
    # assign=True adopts the loaded tensors instead of copying them into the
    # freshly allocated parameters: 1.7 GB less memory traffic for gemma. The
    # tensors are private to this process (safetensors maps files copy-on-write),
    # so training them never writes to the file.
    missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    missing = [k for k in missing if k.rsplit(".", 1)[-1] not in DERIVED_BUFFERS]
    if missing or unexpected:
        raise CorruptModelDirError(
            f"{directory / WEIGHTS_FILE} does not fit {CONFIG_FILE}: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}. Was it written by another version of the toolkit?",
            [f"{WEIGHTS_FILE} does not fit {CONFIG_FILE}"],
        )
    return model
