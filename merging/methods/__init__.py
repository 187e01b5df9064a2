"""The merge methods and their one registry, :data:`REGISTRY`.

Every weight-space method is a pure function on one tensor,
``fn(base, experts, config, *, weights=None, generator=None, thresholds=None, key=None) -> Tensor``
(``experts`` are the fine-tuned tensors θ_i; task vectors are formed inside;
``key`` is the state-dict name, used by the spectral methods to see matrices),
so :func:`merging.merge` can stream a model tensor by tensor. A
:class:`MergeMethod` record holds the name, the function, the config class, the
paper, mergekit's name for it (None if mergekit 0.1.5 lacks it), whether it
needs data, the most experts it takes (``max_experts``: slerp, nearswap, arcee_fusion and passthrough one),
whether a tensor no expert changed merges to the base's (``unchanged_is_base``: all but passthrough), and how a mergekit YAML drives it (``mergekit_spec``, a
:class:`~merging.methods.mergekit_spec.MergekitSpec` declared next to the method:
its parameters, per model or global, and its rules on the base and the weights;
:func:`merging.load_mergekit_config` reads only these). Data-driven closed-form
merging is a record too, but runs models, has no YAML and is called through
:func:`merging.merge_submodules`.

The methods are listed once, in :mod:`merging.methods.catalogue`, as names and
``"module:name"`` references that need no torch; :data:`REGISTRY` is those entries
with their references resolved, built the first time it is asked for. So a command
line can read the catalogue (``import merging.methods.catalogue``) without loading
torch, and everything here loads on first use.

``METHODS`` (name -> function) and ``CONFIGS`` (name -> config class) are views of
the data-free records, kept for code that imports them; ``MERGEKIT_NAMES`` (mergekit's
name -> ours) is the catalogue's.

This face offers (``__all__``) the registry, its record class and each method's config class; the
method functions are imported from their modules (e.g. :func:`merging.methods.generalized.generalized_task_arithmetic`,
:func:`merging.methods.spectral.tsv_m`, :func:`merging.methods.spherical.slerp`,
:func:`merging.methods.arcee.ram`, :func:`merging.methods.interference.wudi`), ``METHODS``, ``CONFIGS`` and ``MERGEKIT_NAMES`` from here.
"""

from __future__ import annotations

import dataclasses
from circuits.lazy_faces import lazy_face
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from merging.methods.catalogue import ENTRIES, MERGEKIT_NAMES, MethodEntry, resolve

if TYPE_CHECKING:
    from merging.methods.mergekit_spec import MergekitSpec


@dataclass(frozen=True)
class MergeMethod:
    """One merge method: its catalogue entry (:class:`merging.methods.catalogue.MethodEntry`: name, paper, mergekit
    name, whether it needs data, the most experts it merges, whether an unchanged tensor merges to the base's) with
    the function, config class and mergekit spec the entry names, imported."""

    entry: MethodEntry
    function: Callable
    config: type
    mergekit_spec: MergekitSpec | None = None

    def __getattr__(self, name: str):
        # the entry's fields read through the record (record.name, record.max_experts, ...): declared once, there
        if name == "entry":
            raise AttributeError(name)
        return getattr(self.entry, name)

    def __post_init__(self):
        if self.mergekit_spec is not None:
            unknown = self.mergekit_spec.fields() - {f.name for f in dataclasses.fields(self.config)}
            if unknown:
                raise TypeError(f"{self.name}: mergekit_spec sets {sorted(unknown)}, not fields of "
                                f"{self.config.__name__}.")

    @classmethod
    def from_entry(cls, entry: MethodEntry) -> MergeMethod:
        """The record of a catalogue entry: its function, config class and mergekit spec imported."""
        spec = resolve(entry.mergekit_spec) if entry.mergekit_spec is not None else None
        return cls(entry, resolve(entry.function), resolve(entry.config), spec)


def _registry() -> dict[str, MergeMethod]:
    return {entry.name: MergeMethod.from_entry(entry) for entry in ENTRIES}


def _data_free_functions() -> dict[str, Callable]:
    return {name: r.function for name, r in _built("REGISTRY").items() if not r.needs_data}


def _data_free_configs() -> dict[str, type]:
    return {name: r.config for name, r in _built("REGISTRY").items() if not r.needs_data}


# the registry and its views, built on first use (building imports every method's module, and torch)
_BUILDERS = {"REGISTRY": _registry, "METHODS": _data_free_functions, "CONFIGS": _data_free_configs}


def _built(name: str):
    """The registry or one of its views, built once: a record's identity is the same wherever it is read."""
    if name not in globals():
        globals()[name] = _BUILDERS[name]()  # later lookups find it there and skip __getattr__
    return globals()[name]


# name -> module of every object a catalogue entry names (functions, the config classes of __all__, mergekit
# specs) and of the spec's own classes: each importable from here as before, its module loaded on first use
_EXPORTS = {reference.partition(":")[2]: reference.partition(":")[0]
            for entry in ENTRIES for reference in (entry.function, entry.config, entry.mergekit_spec) if reference}
_EXPORTS |= {"MergekitParameter": "merging.methods.mergekit_spec", "MergekitSpec": "merging.methods.mergekit_spec",
             "ties_thresholds": "merging.methods.generalized"}

__all__ = [
    "REGISTRY", "MergeMethod", "AverageConfig", "BreadcrumbsConfig", "BreadcrumbsTiesConfig", "ConsensusConfig",
    "DareLinearConfig", "DareTiesConfig", "DellaConfig", "DellaLinearConfig", "IsoCConfig", "IsoCtsConfig",
    "KarcherConfig", "ModelStockConfig", "SceConfig", "TaskArithmeticConfig", "TiesConfig", "TsvConfig",
    "MultiSlerpConfig", "NearswapConfig", "NuSlerpConfig", "SlerpConfig", "ArceeFusionConfig", "RamConfig",
    "RamPlusConfig", "PassthroughConfig", "WudiConfig",
]


# names load on first use, so that merging.methods.catalogue imports without torch; the registry's tables are built
# from the catalogue when first read
_face_getattr, _face_dir = lazy_face(__name__, globals(), _EXPORTS)


def __getattr__(name: str):
    if name in _BUILDERS:
        return _built(name)
    return _face_getattr(name)


def __dir__() -> list[str]:
    return sorted(set(_face_dir()) | set(_BUILDERS))
