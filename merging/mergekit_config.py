"""Run a mergekit merge YAML with this package's methods on TransformerLens state dicts.

``load_mergekit_config("merge.yml").run()`` reads a mergekit 0.1.5 configuration::

    models:
      - model: experts/add          # a circuits.save_model folder or a .safetensors file
        parameters: {weight: 0.6, density: 0.5}
      - model: experts/mul
        parameters: {weight: 0.4, density: 0.3}
    base_model: base.safetensors
    merge_method: ties
    parameters: {normalize: true, lambda: 1.0}
    dtype: float32

and merges with :func:`merging.merge`. Model names resolve through the
``models=`` mapping given to :func:`load_mergekit_config` (name -> state dict,
model or path), else as paths relative to the YAML's folder (nothing is
downloaded). Methods: every mergekit name in :data:`merging.methods.MERGEKIT_NAMES`
(``linear`` is our ``weight_average``) and this package's own names
(``consensus_ta``, ``tsv_m``, ``iso_c``, ``iso_cts``).

Parameters keep mergekit's meaning and defaults: ``weight`` per model
(required, as mergekit, for ``linear`` and the task-arithmetic family),
``density`` / ``gamma`` / ``epsilon`` per model or global (a model's value wins),
``lambda`` (our ``lam``), ``normalize``, ``rescale`` and the method's own options
(``select_topk``, ``filter_wise``, ``max_iter``, ``tol``...). ``int8_mask`` is
accepted and has no effect (it only changes mergekit's mask dtype). ``dtype``
casts the inputs, ``out_dtype`` (default ``dtype``) the result. Unknown
methods, unknown parameters, gradients (lists), filtered parameters, ``slices``
and ``modules`` are :class:`circuits.errors.InputError` s.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from torch import Tensor

from circuits.errors import InputError
from merging.merge import merge
from merging.methods import MERGEKIT_NAMES, REGISTRY
from merging.methods.generalized import TaskArithmeticConfig
from merging.state_dicts import SourceLike, StateDictSource

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float64": torch.float64}
TOP_LEVEL = {"models", "base_model", "merge_method", "parameters", "dtype", "out_dtype", "tokenizer_source"}
PER_MODEL = ("density", "gamma", "epsilon")  # mergekit's per-model (NON_BASE) parameters besides weight
RENAMED = {"lambda": "lam"}
IGNORED = {"int8_mask"}
ALL_INPUTS = {"weight_average", "karcher"}  # mergekit merges every input, the base included when listed


class _Cast(Mapping):
    """A lazily cast view of a source: floating tensors read in ``dtype``."""

    def __init__(self, src: StateDictSource, dtype: torch.dtype):
        self.src, self.dtype = src, dtype

    def __getitem__(self, key: str) -> Tensor:
        t = self.src.get(key)
        return t.to(self.dtype) if t.is_floating_point() else t

    def __iter__(self):
        return iter(self.src.keys())

    def __len__(self) -> int:
        return len(self.src.keys())


@dataclass
class MergePlan:
    """A parsed mergekit config: method, our config, per-expert weights and the sources."""

    method: str
    config: object
    base: StateDictSource
    experts: list[StateDictSource]
    expert_names: list[str]
    weights: list[float] | None = None
    dtype: torch.dtype | None = None
    out_dtype: torch.dtype | None = None
    notes: list[str] = field(default_factory=list)

    def run(self, *, device: str | torch.device = "cpu", progress: bool = True, lines=None) -> dict[str, Tensor]:
        """Merge as configured; tensors cast to ``out_dtype`` (or ``dtype``) when the config names one."""
        cast = (lambda s: _Cast(s, self.dtype)) if self.dtype is not None else (lambda s: s)
        merged = merge(self.method, cast(self.base), [cast(e) for e in self.experts], self.config,
                       weights=self.weights, lines=lines, device=device, progress=progress)
        out = self.out_dtype or self.dtype
        if out is not None:
            merged = {k: v.to(out) if v.is_floating_point() else v for k, v in merged.items()}
        return merged


def _scalar(value, where: str):
    if isinstance(value, (list, dict)):
        raise InputError(
            f"{where}: gradients (lists) and filtered parameters are not supported here; give one number."
        )
    return value


def _resolve(name, models: Mapping[str, SourceLike] | None, folder: Path, label: str) -> StateDictSource:
    if not isinstance(name, str):
        raise InputError(f"{label}: model references must be strings (a path or a name in models=), got {name!r}.")
    if models is not None and name in models:
        return StateDictSource(models[name], label)
    path = Path(name) if os.path.isabs(name) else folder / name
    if path.exists():
        return StateDictSource(path, label)
    raise InputError(
        f"{label}: cannot resolve model {name!r}: no file or folder at {path}. Give a circuits.save_model folder "
        "or a .safetensors path (relative to the YAML), or pass models={name: state_dict_or_model}."
    )


def load_mergekit_config(path: str | os.PathLike, *, models: Mapping[str, SourceLike] | None = None) -> MergePlan:
    """Parse the mergekit YAML at ``path`` into a :class:`MergePlan` (call ``.run()`` to merge)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise InputError(f"Cannot read mergekit config {path}: {err}") from err
    if not isinstance(raw, dict):
        raise InputError(f"{path}: a mergekit config is a YAML mapping with models, merge_method, ...")
    unknown = set(raw) - TOP_LEVEL
    if unknown:
        raise InputError(f"{path}: unsupported keys {sorted(unknown)} (slices, modules and tokenizer "
                         f"surgery are not implemented); supported: {sorted(TOP_LEVEL)}.")
    if raw.get("tokenizer_source") not in (None, "base"):
        raise InputError(f"{path}: tokenizer_source {raw['tokenizer_source']!r}: experts must share the base's "
                         "vocabulary here; use tokenizer_source: base or leave it out.")
    given = raw.get("merge_method")
    method = MERGEKIT_NAMES.get(given, given)
    if method not in REGISTRY or REGISTRY[method].needs_data:
        raise InputError(f"{path}: merge_method {given!r} is not implemented here; use one of "
                         f"{sorted(MERGEKIT_NAMES)} (mergekit names) or {sorted(set(REGISTRY) - set(MERGEKIT_NAMES.values()) - {'closed_form'})}.")
    record = REGISTRY[method]
    entries = raw.get("models") or []
    if not entries or not all(isinstance(e, dict) and "model" in e for e in entries):
        raise InputError(f"{path}: 'models' must be a list of {{model: ..., parameters: {{...}}}} entries.")
    folder = path.parent
    base_name = raw.get("base_model")
    entries_wo_base = [e for e in entries if e["model"] != base_name]
    base_listed = len(entries_wo_base) < len(entries)
    config_fields = {f.name for f in dataclasses.fields(record.config)}
    is_gta = issubclass(record.config, TaskArithmeticConfig)
    takes_weight = is_gta or method in ("weight_average", "consensus_ta", "tsv_m", "iso_c", "iso_cts")

    if method in ALL_INPUTS:
        if method == "weight_average" and base_name is not None and not base_listed:
            raise InputError(f"{path}: linear with base_model: list the base among models (with its weight), "
                             "as mergekit merges it as one more input.")
        inputs = entries
        structural = base_name if base_name is not None else entries[0]["model"]
    else:
        if base_name is None:
            raise InputError(f"{path}: {given} needs base_model (the task vectors are taken against it).")
        inputs, structural = entries_wo_base, base_name
    if not inputs:
        raise InputError(f"{path}: no models to merge besides the base.")

    settings: dict = {}
    for key, value in (raw.get("parameters") or {}).items():
        name = RENAMED.get(key, key)
        if key in IGNORED:
            continue
        if key == "weight":
            raise InputError(f"{path}: weight is a per-model parameter: put it under each model's parameters.")
        if name not in config_fields:
            raise InputError(f"{path}: unknown parameter {key!r} for {given}; accepted: "
                             f"{sorted(_mergekit_names(config_fields))}.")
        settings[name] = _scalar(value, f"{path}: parameters.{key}")
    weights, per_model = [], {k: [] for k in PER_MODEL if k in config_fields}
    for e in inputs:
        params = dict(e.get("parameters") or {})
        label = f"{path}: model {e['model']!r}"
        if "weight" in params:
            if not takes_weight:
                raise InputError(f"{label}: {given} takes no per-model weight (unknown parameter 'weight').")
            weights.append(float(_scalar(params.pop("weight"), label + " weight")))
        elif is_gta or method == "weight_average":
            raise InputError(f"{label}: missing parameter 'weight' (mergekit requires it for {given}).")
        for k in per_model:
            per_model[k].append(float(_scalar(params.pop(k), label + " " + k)) if k in params else None)
        unknown_model = set(params) - IGNORED
        if unknown_model:
            raise InputError(f"{label}: unknown per-model parameters {sorted(unknown_model)}; accepted: "
                             f"{['weight', *per_model]}.")
    for k, values in per_model.items():
        if any(v is not None for v in values):
            default = settings.get(k, getattr(record.config(), k))
            settings[k] = tuple(default if v is None else v for v in values)
    if method == "karcher" and base_name is not None and not base_listed:
        settings["include_base"] = True
    config = record.config(**settings)
    names = [e["model"] for e in inputs]
    base_src = _resolve(structural, models, folder, "base")
    experts = [_resolve(n, models, folder, f"model {n!r}") for n in names]
    dtype = _dtype(raw.get("dtype"), path, "dtype")
    out_dtype = _dtype(raw.get("out_dtype"), path, "out_dtype")
    return MergePlan(method, config, base_src, experts, names, weights or None, dtype, out_dtype)


def _mergekit_names(fields: set[str]) -> set[str]:
    back = {v: k for k, v in RENAMED.items()}
    return {back.get(f, f) for f in fields} | {"weight"} | IGNORED


def _dtype(name, path: Path, what: str) -> torch.dtype | None:
    if name is None:
        return None
    if name not in DTYPES:
        raise InputError(f"{path}: {what} {name!r} is not one of {sorted(DTYPES)}.")
    return DTYPES[name]
