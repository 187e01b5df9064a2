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
(``consensus_ta``, ``tsv_m``, ``iso_c``, ``iso_cts``, ``wudi``).

What each method takes is declared next to it, on its registry record
(``REGISTRY[name].mergekit_spec``, a :class:`merging.methods.mergekit_spec.MergekitSpec`), as
mergekit keeps it on each method: its parameters (YAML key, config field, type,
per model or global) and its input rules (needs ``base_model``; takes, or
requires, a per-model ``weight``; what an unlisted base means). This loader is
generic over those declarations. Parameters keep mergekit's meaning and
defaults: ``weight`` per model, ``density`` / ``gamma`` / ``epsilon`` per model
or global (a model's value wins), ``lambda`` (our ``lam``), ``normalize``,
``rescale`` and the method's own options (``select_topk``, ``filter_wise``,
``max_iter``, ``tol``, slerp's required ``t``...). ``int8_mask`` (it only changes mergekit's mask dtype) is
accepted with no effect where mergekit 0.1.5 declares it (the task-arithmetic family and ``sce``) and by this
package's own methods; the methods that do not declare it in mergekit either (``slerp``, ``nuslerp``,
``multislerp``, ``nearswap``, ``arcee_fusion``, ``ram``, ``ramplus_tl``, ``passthrough``) refuse it as an
unknown parameter. ``dtype`` casts the inputs, ``out_dtype``
(default ``dtype``) the result. Unknown methods, unknown parameters, values of
the wrong type (``normalize: 'no'``), ``modules``, duplicated keys and absurdly deep nesting are
:class:`circuits.errors.InputError` s. Gradients (lists over the layers) and filtered values
(``- filter: self_attn``) are resolved for each tensor as mergekit resolves them
(:mod:`merging.mergekit_settings`).

``slices:`` (mergekit's layer ranges, used by ``passthrough`` to stack layers) is read
when it keeps the architecture: one slice whose sources each take every layer
(``layer_range: [0, n_layers]``) is the same as listing those sources under ``models:``;
other slices change the layer count or move layers, and are refused, saying so.
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
from merging.apply import merge
from merging.lines import n_layers_of
from merging.methods import MERGEKIT_NAMES, REGISTRY
from merging.mergekit_settings import TensorSetting, hf_name, layer_position, read_setting, resolved
from merging.methods.mergekit_spec import MergekitSpec, read_value
from merging.state_dicts import SourceLike, StateDictSource

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float64": torch.float64}
TOP_LEVEL = {"models", "slices", "base_model", "merge_method", "parameters", "dtype", "out_dtype", "tokenizer_source"}
MAX_DEPTH = 32  # YAML nesting refused beyond this (a mergekit config is a handful of levels deep)


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key, first: int, again: int):
        super().__init__(f"duplicate key {key!r}")
        self.key, self.first, self.again = key, first, again


class _TooDeep(yaml.YAMLError):
    def __init__(self, line: int):
        super().__init__(f"nesting deeper than {MAX_DEPTH}")
        self.line = line


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated in one mapping and nesting deeper than ``MAX_DEPTH``.

    PyYAML keeps the last of repeated keys without a word, and composes nested
    nodes recursively (a deep enough file is a ``RecursionError``).
    """

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooDeep(self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}  # key -> line of its first occurrence
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    hash(key)
                except TypeError:  # an unhashable key: SafeLoader refuses it itself
                    continue
                if key in seen:
                    raise _DuplicateKey(key, seen[key], line)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path):
    """The YAML document at ``path`` (:class:`StrictLoader`), or an :class:`InputError` naming the file."""
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=StrictLoader)  # noqa: S506 (a SafeLoader)
    except _DuplicateKey as err:
        raise InputError(f"{path}: duplicate key {err.key!r} (lines {err.first} and {err.again}); YAML would keep "
                         "only the last value without a word: remove one.") from None
    except _TooDeep as err:
        raise InputError(f"{path}: the YAML nests deeper than {MAX_DEPTH} levels (line {err.line}); a mergekit "
                         "config is a few levels deep (models, their parameters, a value).") from None
    except RecursionError:
        raise InputError(f"{path}: the YAML nests deeper than Python's recursion limit; a mergekit "
                         "config is a few levels deep (models, their parameters, a value).") from None
    except UnicodeDecodeError:
        raise InputError(f"{path} is not a text file (not UTF-8): a mergekit config is a YAML text file.") from None
    except (OSError, yaml.YAMLError) as err:
        raise InputError(f"Cannot read mergekit config {path}: {err}") from err


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
    #: where a parameter varies by tensor (gradients, filters): each tensor's (config, weights)
    per_tensor: dict | None = None

    def run(self, *, device: str | torch.device = "cpu", progress: bool = True, lines=None) -> dict[str, Tensor]:
        """Merge as configured; tensors cast to ``out_dtype`` (or ``dtype``) when the config names one."""
        cast = (lambda s: _Cast(s, self.dtype)) if self.dtype is not None else (lambda s: s)
        config_for = None if self.per_tensor is None else self.per_tensor.get
        merged = merge(self.method, cast(self.base), [cast(e) for e in self.experts], self.config,
                       weights=self.weights, lines=lines, device=device, progress=progress, config_for=config_for)
        out = self.out_dtype or self.dtype
        if out is not None:
            merged = {k: v.to(out) if v.is_floating_point() else v for k, v in merged.items()}
        return merged


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


def _global_settings(spec: MergekitSpec, params, path: Path, given: str) -> dict:
    """Config field -> value from the YAML's global ``parameters:`` (checked against the declarations)."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InputError(f"{path}: 'parameters' must be a mapping of parameter names to values.")
    settings = {}
    for key, value in params.items():
        if key == "weight":
            raise InputError(f"{path}: weight is a per-model parameter: put it under each model's parameters.")
        param = spec.parameter(key)
        if param is None:
            raise InputError(f"{path}: unknown parameter {key!r} for {given}; accepted: {spec.accepted()}.")
        value = read_setting(value, param.read, f"{path}: parameters.{key}")
        if not param.ignored:
            settings[param.field] = value
    return settings


def _per_model_values(spec: MergekitSpec, inputs: list[dict], path: Path, given: str):
    """``(weights, {per-expert parameter: [value or None per input]})`` from each model's ``parameters``."""
    per_expert = spec.per_expert()
    weights, per_model = [], {p: [] for p in per_expert}
    for e in inputs:
        params = e.get("parameters") or {}
        label = f"{path}: model {e['model']!r}"
        if not isinstance(params, dict):
            raise InputError(f"{label}: parameters must be a mapping of parameter names to values.")
        params = dict(params)
        if "weight" in params:
            if not spec.takes_weights:
                raise InputError(f"{label}: {given} takes no per-model weight (unknown parameter 'weight').")
            weights.append(read_setting(params.pop("weight"), lambda v, w: read_value(v, float, "weight", w),
                                        label + " weight"))
        elif spec.needs_weights:
            raise InputError(f"{label}: missing parameter 'weight' (mergekit requires it for {given}).")
        for p in per_expert:
            per_model[p].append(read_setting(params.pop(p.name), p.read, f"{label} {p.name}")
                                if p.name in params else None)
        for k in spec.ignored() & set(params):
            read_setting(params.pop(k), spec.parameter(k).read, f"{label} {k}")
        if params:
            accepted = (["weight"] if spec.takes_weights else []) + [p.name for p in per_expert]
            raise InputError(f"{label}: unknown per-model parameters {sorted(params, key=str)}; "
                             f"accepted: {accepted}.")
    return weights, per_model


def _entries_from_slices(slices, path: Path, models: Mapping[str, SourceLike] | None) -> list[dict]:
    """The ``models:`` entries a ``slices:`` list stands for: one slice whose sources each take every layer.

    A slice of fewer layers, or several slices stacked, makes a model of another depth (or layers of
    several models at new places), which no TransformerLens config of the experts' architecture loads.
    """
    how = ("give one slice whose sources each take every layer (layer_range: [0, n_layers]), or list the "
           "models under models:")
    if not isinstance(slices, list) or not slices or not all(isinstance(s, dict) for s in slices):
        raise InputError(f"{path}: slices must be a list of {{sources: [...]}} entries; {how}.")
    if len(slices) > 1:
        raise InputError(f"{path}: {len(slices)} slices; stacking layer ranges changes the layer count (or moves "
                         f"layers), and the result would not load into the experts' architecture: {how}.")
    extra = set(slices[0]) - {"sources"}
    if extra:
        raise InputError(f"{path}: slices[0]: {sorted(extra, key=str)} not supported here; give base_model and "
                         "parameters at the top level.")
    sources = slices[0].get("sources")
    if not sources or not all(isinstance(s, dict) and "model" in s for s in sources):
        raise InputError(f"{path}: slices[0].sources must be a list of {{model: ..., layer_range: [0, n]}} entries.")
    entries = []
    for source in sources:
        unknown = set(source) - {"model", "layer_range", "parameters"}
        if unknown:
            raise InputError(f"{path}: slices[0] source {source['model']!r}: unknown keys {sorted(unknown, key=str)}; "
                             "a source has model, layer_range and parameters.")
        n_layers = n_layers_of(_resolve(source["model"], models, path.parent, f"model {source['model']!r}").keys())
        if source.get("layer_range") != [0, n_layers]:
            raise InputError(f"{path}: slices[0] source {source['model']!r}: layer_range "
                             f"{source.get('layer_range')!r}, but the model has {n_layers} layers; a slice of other "
                             f"layers changes the layer count and would not load into the same architecture: give "
                             f"layer_range: [0, {n_layers}] (every layer).")
        entries.append({k: v for k, v in source.items() if k != "layer_range"})
    return entries


def _inputs(spec: MergekitSpec, entries: list[dict], base_name, path: Path, given: str) -> tuple[list[dict], str, bool]:
    """The models merged, the model whose structure the result takes, and whether an unlisted ``base_model`` is one
    more input (``unlisted_base_field``), by the method's base rules (:class:`MergekitSpec`)."""
    entries_wo_base = [e for e in entries if e["model"] != base_name]
    base_listed = len(entries_wo_base) < len(entries)
    base_as_input = False  # a base_model not among models, made one more input (unlisted_base_field)
    if spec.needs_base:
        if base_name is None:
            raise InputError(f"{path}: {given} needs base_model (the task vectors are taken against it).")
        inputs, structural = entries_wo_base, base_name
    elif spec.optional_base_field is not None:  # a base, if named, is the origin of the task vectors
        inputs = entries_wo_base
        structural = base_name if base_name is not None else entries[0]["model"]
    else:  # every listed model is an input, the base too when listed
        if base_name is not None and not base_listed:
            if spec.unlisted_base_field is None:
                weight = " (with its weight)" if spec.needs_weights else ""
                raise InputError(f"{path}: {given} takes no base_model unless the base is also listed among "
                                 f"models{weight} (mergekit refuses it too): drop base_model, or list the base "
                                 "under models to merge it as one more input.")
            base_as_input = True
        inputs = entries
        structural = base_name if base_name is not None else entries[0]["model"]
    return inputs, structural, base_as_input


def load_mergekit_config(path: str | os.PathLike, *, models: Mapping[str, SourceLike] | None = None) -> MergePlan:
    """Parse the mergekit YAML at ``path`` into a :class:`MergePlan` (call ``.run()`` to merge).

    Generic over the methods' declarations (``REGISTRY[name].mergekit_spec``): no method is named here.
    """
    path = Path(path)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise InputError(f"{path}: a mergekit config is a YAML mapping with models, merge_method, ...")
    unknown = set(raw) - TOP_LEVEL
    if unknown:
        raise InputError(f"{path}: unsupported keys {sorted(unknown)} (modules and tokenizer surgery are not "
                         f"implemented); supported: {sorted(TOP_LEVEL)}.")
    if raw.get("tokenizer_source") not in (None, "base"):
        raise InputError(f"{path}: tokenizer_source {raw['tokenizer_source']!r}: experts must share the base's "
                         "vocabulary here; use tokenizer_source: base or leave it out.")
    given = raw.get("merge_method")
    method = MERGEKIT_NAMES.get(given, given) if isinstance(given, str) else None
    if method not in REGISTRY or REGISTRY[method].mergekit_spec is None:
        ours = sorted(n for n, r in REGISTRY.items() if r.mergekit_spec is not None and r.mergekit is None)
        raise InputError(f"{path}: merge_method {given!r} is not implemented here; use one of "
                         f"{sorted(MERGEKIT_NAMES)} (mergekit names) or {ours}.")
    record = REGISTRY[method]
    spec = record.mergekit_spec
    if "slices" in raw and "models" in raw:
        raise InputError(f"{path}: give models or slices, not both (mergekit refuses both too).")
    entries = _entries_from_slices(raw["slices"], path, models) if "slices" in raw else raw.get("models") or []
    if not entries or not all(isinstance(e, dict) and "model" in e for e in entries):
        raise InputError(f"{path}: 'models' must be a list of {{model: ..., parameters: {{...}}}} entries.")
    folder = path.parent
    base_name = raw.get("base_model")

    inputs, structural, base_as_input = _inputs(spec, entries, base_name, path, given)
    if not inputs:
        raise InputError(f"{path}: no models to merge besides the base.")
    if record.max_experts is not None and len(inputs) > record.max_experts:
        raise InputError(f"{path}: {given} merges at most {record.max_experts} model(s) besides base_model, "
                         f"got {len(inputs)}: {[e['model'] for e in inputs]}.")

    global_settings = _global_settings(spec, raw.get("parameters"), path, given)
    weights, per_model = _per_model_values(spec, inputs, path, given)
    missing = [p.name for p in spec.required() if p.field not in global_settings
               and not any(v is not None for v in per_model.get(p, []))]
    if missing:
        raise InputError(f"{path}: {given} requires parameters {missing} (mergekit has no default for them); "
                         "give them under parameters:.")
    fixed = {}
    if base_as_input:
        fixed[spec.unlisted_base_field] = True
    if spec.optional_base_field is not None:
        fixed[spec.optional_base_field] = base_name is not None
    settings = _Settings(record, spec, global_settings, per_model, weights or None, fixed, path)
    names = [e["model"] for e in inputs]
    base_src = _resolve(structural, models, folder, "base")
    experts = [_resolve(n, models, folder, f"model {n!r}") for n in names]
    dtype = _dtype(raw.get("dtype"), path, "dtype")
    out_dtype = _dtype(raw.get("out_dtype"), path, "out_dtype")
    config, plain_weights = settings.at("", 0.0)
    per_tensor = settings.per_tensor(base_src.param_keys()) if settings.varies() else None
    return MergePlan(method, config, base_src, experts, names, plain_weights, dtype, out_dtype,
                     per_tensor=per_tensor)


@dataclass
class _Settings:
    """A YAML's parameters as given: global, per model (scalars or :class:`TensorSetting` s), the weights and the
    fields the base rules fix; resolved into a config (and weights) for one tensor at a time."""

    record: object
    spec: MergekitSpec
    global_settings: dict
    per_model: dict
    weights: list | None
    fixed: dict
    path: Path

    def __post_init__(self) -> None:
        self.defaults = {f.name: f.default for f in dataclasses.fields(self.record.config)}

    def varies(self) -> bool:
        """Whether any value depends on the tensor (a gradient or a filter)."""
        given = [*self.global_settings.values(), *(self.weights or []),
                 *(v for values in self.per_model.values() for v in values)]
        return any(isinstance(v, TensorSetting) for v in given)

    def at(self, name: str, t: float) -> tuple[object, list[float] | None]:
        """The config and weights of the tensor mergekit calls ``name`` at layer position ``t`` (module docstring
        of :mod:`merging.mergekit_settings`): a model's own value, else the global one, else the default."""
        values = {}
        for field_name, setting in self.global_settings.items():
            value = resolved([setting], name, t)
            if value is not None:
                values[field_name] = value
        for p, given in self.per_model.items():
            if any(v is not None for v in given):
                fallback = values.get(p.field, self.defaults[p.field])
                values[p.field] = tuple(resolved([v, fallback], name, t) for v in given)
        for p in self.spec.required():
            if p.field not in values:
                raise InputError(f"{self.path}: {p.name} has no value for tensor {name!r} (no filter matches it and "
                                 "no unfiltered value is given): add an entry without a filter as the fallback.")
        values = {field_name: _checked(self.spec, field_name, value, self.path) for field_name, value in values.items()}
        weights = None if self.weights is None else [
            read_value(resolved([w], name, t), float, "weight", f"{self.path}: weight of {name!r}") for w in self.weights]
        return self.record.config(**values, **self.fixed), weights

    def per_tensor(self, keys) -> dict:
        """Every tensor's (config, weights), keyed by its TransformerLens name, each config built once."""
        n_layers = n_layers_of(keys)
        made: dict = {}
        out = {}
        for key in keys:
            config, weights = self.at(hf_name(key), layer_position(key, n_layers))
            if getattr(config, "scope", "tensor") == "model":
                raise InputError(f"{self.path}: scope: model takes one threshold over the whole model, so its "
                                 "parameters cannot vary by tensor: give scalar values, or scope: tensor.")
            out[key] = made.setdefault((repr(config), tuple(weights or ())), (config, weights))
        return out


def _checked(spec: MergekitSpec, field_name: str, value, path: Path):
    """An interpolated value read again as its parameter's type (an int parameter's gradient must land on whole
    numbers); tuples (one per model) element by element."""
    param = next((p for p in spec.parameters if p.field == field_name), None)
    if param is None:
        return value
    if isinstance(value, tuple):
        return tuple(param.read(v, f"{path}: {param.name}") for v in value)
    return param.read(value, f"{path}: {param.name}")


def _dtype(name, path: Path, what: str) -> torch.dtype | None:
    if name is None:
        return None
    if name not in DTYPES:
        raise InputError(f"{path}: {what} {name!r} is not one of {sorted(DTYPES)}.")
    return DTYPES[name]
