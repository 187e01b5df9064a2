"""Task vectors over TransformerLens state dicts: sources, checks and safetensors I/O.

A *task vector* is ``τ_i = θ_i − θ_0``: what fine-tuning added to the base
weights ``θ_0`` to get expert ``θ_i`` (Ilharco et al., 2023). Every merge in this
package is a function of ``θ_0`` and the ``τ_i``.

Choices (this package is the reference implementation, so they are written down):

* **Unprocessed weights only.** TransformerLens' ``from_pretrained`` folds
  LayerNorm weights into the next matrices (the ``ln*.w``/``ln*.b`` keys vanish
  and ``cfg.normalization_type`` becomes ``"LNPre"``/``"RMSPre"``) and centres
  the writing weights. Both are per-model reparametrisations: the task vector
  of two processed models is not the processed task vector, so merging them is
  wrong. Sources are refused when the config says ``*Pre`` normalisation, when
  some sources have norm weights and others lack them, or when the output
  weights of block 0 (``attn.W_O`` and ``mlp.W_out``) are mean-centred over
  ``d_model`` (what ``center_writing_weights`` leaves). Load experts with
  ``HookedTransformer.from_pretrained_no_processing`` instead; merge, then
  process.
* **Buffers are not parameters.** ``attn.mask``, ``attn.IGNORE`` (−inf) and
  ``attn.rotary_sin``/``rotary_cos`` are skipped by the checks and the merge
  and copied from the base, so the merged state dict still loads with
  ``model.load_state_dict`` (strict).
* **Streaming.** A source is a mapping, a ``HookedTransformer`` or a
  ``.safetensors`` path opened lazily with ``safetensors.safe_open``: tensors are
  read one key at a time, so a merge holds the base tensor plus one tensor per
  expert beyond its inputs.
* **Sources.** A state dict, a ``HookedTransformer``, a ``.safetensors`` file, or a
  folder written by ``circuits.save_model`` (its ``model.safetensors`` is read; such
  a folder has no buffers, so use a model or state dict as the *base* when the
  result must load strictly). A saved-model folder is first checked against its
  manifest (sizes and sha256, :func:`circuits.model_cache.require_intact_model_dir`,
  the check ``circuits.load_model`` runs), so a changed tensor is refused as
  ``load_model`` would refuse it (:class:`circuits.model_cache.CorruptModelDirError`).
  Unreadable files (forged or cut safetensors headers included) are an
  :class:`InputError` naming the file (:mod:`circuits.file_reads`).
* **Checks before work.** :func:`check_compatible` reads every parameter once
  and rejects different key sets, shapes, dtypes and NaN/Inf values with a
  message that names the key and the source.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Union

import torch
from safetensors.torch import save_file
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from circuits.atomic_files import atomic_path, refuse_existing
from circuits.errors import InputError, InputTypeError, ToolkitError
from circuits.file_reads import load_safetensors, open_safetensors
from circuits.model_cache import require_intact_model_dir
from merging.primitives import combine
from merging.primitives import task_vectors as expert_task_vectors

BUFFER_SUFFIXES = (".mask", ".IGNORE", ".rotary_sin", ".rotary_cos")
EMBEDDING_PREFIXES = ("embed.", "pos_embed.", "ln_final.", "unembed.")

SourceLike = Union[Mapping[str, Tensor], HookedTransformer, str, os.PathLike, "StateDictSource"]


class NonFiniteMergeError(ToolkitError, ValueError):
    """A merge produced NaN/Inf values (the inputs were finite)."""


SAVED_MODEL_WEIGHTS = "model.safetensors"  # the weights file of a circuits.save_model folder


def is_buffer(key: str) -> bool:
    """Whether ``key`` names a TransformerLens buffer (not a trained parameter)."""
    return key.endswith(BUFFER_SUFFIXES)


class StateDictSource:
    """Read-only, key-by-key access to a state dict held in memory, by a model, or on disk.

    ``StateDictSource(x, name)`` accepts a mapping ``key -> Tensor``, a
    ``HookedTransformer`` (its ``state_dict()``; its config is kept for the
    processed-weights check) or a path to a ``.safetensors`` file (opened lazily:
    a tensor is read only when :meth:`get` asks for it).
    """

    def __init__(self, source: SourceLike, name: str = "state dict"):
        self.name = name
        self.cfg = None
        self._file = None
        if isinstance(source, StateDictSource):
            self.name, self.cfg, self._file, self._dict = source.name, source.cfg, source._file, source._dict
            return
        if isinstance(source, HookedTransformer):
            self.cfg = source.cfg
            self._dict = source.state_dict()
        elif isinstance(source, (str, os.PathLike)):
            self._file = _open_safetensors(Path(source), name)
            self._dict = None
        elif isinstance(source, Mapping):
            self._dict = source
        else:
            raise InputError(
                f"{name}: expected a state dict (mapping of tensors), a HookedTransformer, a .safetensors "
                f"path or a circuits.save_model folder, got {type(source).__name__}."
            )

    def keys(self) -> list[str]:
        """All keys, parameters and buffers, in the source's order."""
        return list(self._file.keys()) if self._file is not None else list(self._dict.keys())

    def param_keys(self) -> list[str]:
        """Keys of trained parameters (buffers left out)."""
        return [k for k in self.keys() if not is_buffer(k)]

    def get(self, key: str) -> Tensor:
        """The tensor stored under ``key`` (read from disk for file sources)."""
        if self._file is not None:
            return self._file.get_tensor(key)
        return self._dict[key]

    def shape(self, key: str) -> tuple[int, ...]:
        """Shape of ``key`` without reading the data for file sources."""
        if self._file is not None:
            return tuple(self._file.get_slice(key).get_shape())
        return tuple(self._dict[key].shape)

    def __contains__(self, key: str) -> bool:
        return key in (self._file.keys() if self._file is not None else self._dict)


RESAVE_HINT = "Re-save it with merging.state_dicts.save_state_dict or circuits.save_model."


def _open_safetensors(path: Path, name: str):
    """Open ``path`` (a .safetensors file or a saved-model folder) lazily; clear errors for anything else.

    A saved-model folder (one with a manifest) must match its manifest first, as for ``circuits.load_model``.
    """
    if path.is_dir():
        if not (path / SAVED_MODEL_WEIGHTS).is_file():
            raise InputError(
                f"{name}: folder {path} has no {SAVED_MODEL_WEIGHTS}. Pass a folder written by "
                "circuits.save_model, a .safetensors file, a state dict or a HookedTransformer."
            )
        require_intact_model_dir(path)  # raises CorruptModelDirError naming every changed or missing file
        path = path / SAVED_MODEL_WEIGHTS
    if not path.is_file():
        raise InputError(f"{name}: no safetensors file or saved-model folder at {path}.")
    return open_safetensors(path, error=InputError, prefix=f"{name}: ", hint=RESAVE_HINT)


def as_sources(base: SourceLike, experts: Sequence[SourceLike]) -> tuple[StateDictSource, list[StateDictSource]]:
    """Wrap ``base`` and ``experts`` as :class:`StateDictSource` with names used in error messages."""
    if len(experts) == 0:
        raise InputError("No experts given: pass at least one fine-tuned state dict to merge.")
    return StateDictSource(base, "base"), [StateDictSource(e, f"expert {i}") for i, e in enumerate(experts)]


def _processed_reason(src: StateDictSource) -> str | None:
    """Why ``src`` looks processed (folded/centred), or None."""
    norm = getattr(src.cfg, "normalization_type", None)
    if norm in ("LNPre", "RMSPre"):
        return f"its config has normalization_type={norm!r} (LayerNorm weights folded into the next layer)"
    centred = []
    for key in ("blocks.0.attn.W_O", "blocks.0.mlp.W_out"):
        if key in src:
            w = src.get(key).float()
            if w.abs().max() > 0 and bool((w.mean(-1).abs() <= 1e-6 * w.std().clamp_min(1e-30)).all()):
                centred.append(key)
    if centred and len(centred) == sum(k in src for k in ("blocks.0.attn.W_O", "blocks.0.mlp.W_out")):
        return f"{', '.join(centred)} have zero mean over d_model (centred writing weights)"
    return None


def _norm_keys(src: StateDictSource) -> set[str]:
    return {k for k in src.param_keys() if "." in k and k.split(".")[-2].startswith("ln")}


def check_compatible(
    base: StateDictSource,
    experts: Sequence[StateDictSource],
    *,
    check_finite: bool = True,
    progress: bool = False,
) -> list[str]:
    """Check that ``experts`` are fine-tuned copies of ``base``; return the parameter keys to merge.

    Raises :class:`InputError` naming the offending source and key when an expert has
    missing or extra keys, a different shape or dtype (a different
    architecture), NaN/Inf values, or when any source has processed weights.
    """
    processed_hint = (
        "Merge unprocessed weights: load models with HookedTransformer.from_pretrained_no_processing "
        "(or the toolkit's circuits.load_model), merge, then process the merged model."
    )
    for src in (base, *experts):
        reason = _processed_reason(src)
        if reason:
            raise InputError(f"{src.name} has processed weights: {reason}. {processed_hint}")
    keys = base.param_keys()
    if not keys:
        raise InputError("base has no parameters to merge.")
    base_norms = _norm_keys(base)
    for src in experts:
        other = src.param_keys()
        missing, extra = sorted(set(keys) - set(other)), sorted(set(other) - set(keys))
        if missing or extra:
            msg = f"{src.name} does not have the base's parameters"
            if missing:
                msg += f"; missing {len(missing)} keys, e.g. {missing[:5]}"
            if extra:
                msg += f"; extra {len(extra)} keys, e.g. {extra[:5]}"
            if base_norms ^ _norm_keys(src):
                msg += f". Norm weights differ: one side looks processed (folded LayerNorm). {processed_hint}"
            else:
                msg += ". Experts must be fine-tuned copies of the base (same architecture)."
            raise InputError(msg)
        for key in keys:
            if src.shape(key) != base.shape(key):
                raise InputError(
                    f"{src.name} has a different architecture: {key} has shape {src.shape(key)}, "
                    f"the base has {base.shape(key)}. Experts must be fine-tuned copies of the base."
                )
    bar = tqdm(keys, desc="checking weights", disable=not progress)
    for key in bar:
        ref = base.get(key)
        if not ref.is_floating_point():
            raise InputError(f"base: {key} has non-float dtype {ref.dtype}; only float weights can be merged.")
        for src in (base, *experts):
            t = ref if src is base else src.get(key)
            if t.dtype != ref.dtype:
                raise InputError(
                    f"{src.name}: {key} has dtype {t.dtype}, the base has {ref.dtype}. "
                    "Cast all models to one dtype before merging."
                )
            # fast path: one float64 reduction, no mask allocation; NaN/Inf anywhere make the sum non-finite
            if check_finite and not bool(torch.isfinite(t.sum(dtype=torch.float64))) and not bool(torch.isfinite(t).all()):
                n_bad = int((~torch.isfinite(t)).sum())
                raise InputError(
                    f"{src.name}: {key} has {n_bad} NaN/Inf values; a diverged fine-tune cannot be merged."
                )
    return keys


def iter_task_vectors(
    base: SourceLike, experts: Sequence[SourceLike], *, check: bool = True
) -> Iterator[tuple[str, Tensor, list[Tensor]]]:
    """Yield ``(key, θ0[key], [τ_i[key] for each expert])`` one parameter at a time (buffers skipped)."""
    b, es = as_sources(base, experts)
    keys = check_compatible(b, es) if check else b.param_keys()
    for key in keys:
        ref = b.get(key)
        yield key, ref, [e.get(key) - ref for e in es]


def task_vector(base: SourceLike, expert: SourceLike, *, check: bool = True) -> dict[str, Tensor]:
    """``τ = θ_expert − θ_base`` for every parameter, in memory (buffers left out)."""
    return {k: tvs[0] for k, _, tvs in iter_task_vectors(base, [expert], check=check)}


def combine_experts(base: Tensor, experts: Sequence[Tensor], coefficients: Sequence[float]) -> Tensor:
    """``θ0 + Σ_i c_i (θ_i − θ0)`` for one tensor, computed in float32 (float64 for float64), in ``θ0``'s dtype."""
    return combine(base, expert_task_vectors(base, experts), [float(c) for c in coefficients])


def _independent_cpu_tensors(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Contiguous CPU copies of the values, no two sharing memory; a value that is not a tensor is refused by key."""
    out: dict[str, Tensor] = {}
    storages: set[int] = set()
    for k, v in state_dict.items():
        if not isinstance(v, Tensor):
            raise InputTypeError(
                f"state_dict[{k!r}] is a {type(v).__name__}, not a tensor: save_state_dict writes torch tensors "
                "only; convert it (e.g. torch.as_tensor(value)) or leave the key out."
            )
        t = v.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr and ptr in storages:  # shares memory with an earlier entry: safetensors would refuse the pair
            t = t.clone()
            ptr = t.untyped_storage().data_ptr()
        storages.add(ptr)
        out[k] = t
    return out


def save_state_dict(
    state_dict: Mapping[str, Tensor], path: str | os.PathLike, metadata: Mapping[str, str] | None = None, *,
    overwrite: bool = False,
) -> Path:
    """Write ``state_dict`` to ``path`` as safetensors atomically (temp file, then ``os.replace``).

    An existing file is replaced only with ``overwrite=True``. Every value must be a
    tensor; tensors that share memory (tied weights, a view of another entry) are
    saved as independent copies, since safetensors stores no aliasing.
    """
    path = refuse_existing(path, overwrite)
    tensors = _independent_cpu_tensors(state_dict)  # before the folder is made: a bad value leaves nothing behind
    with atomic_path(path) as tmp:  # makes the parent folders, or says in one line why it cannot
        save_file(tensors, str(tmp), metadata=dict(metadata) if metadata else None)
    return Path(path)


def load_state_dict(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """Read a safetensors state dict fully into memory (use :class:`StateDictSource` to read lazily).

    A forged, cut or foreign file is an :class:`InputError` naming it.
    """
    return load_safetensors(path, device=str(device), error=InputError, hint=RESAVE_HINT)
