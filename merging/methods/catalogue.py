"""Every merge method as one entry of names and references, readable without torch.

A command line lists the methods, checks ``--methods`` against them and knows which of them
merge only one or two experts before it decides to load torch; the methods themselves are
torch functions. So each method is written down once here, as plain data:

* its ``name``, the ``paper`` it comes from and mergekit's name for it (``mergekit``, None
  where mergekit 0.1.5 lacks it);
* whether it needs data (``needs_data``: only the closed form, which runs models), the most
  experts it merges (``max_experts``, None for any number) and whether a tensor no expert
  changed merges to the base's (``unchanged_is_base``: all but passthrough);
* where its objects live, as ``"module:name"`` references that nothing imports until they are
  asked for: the ``function`` on one tensor, its ``config`` class and, for the data-free
  methods, its ``mergekit_spec`` (the parameters a mergekit YAML may give it, declared in the
  method's own module, next to the function).

:data:`merging.methods.REGISTRY` is built from :data:`ENTRIES` on first use, each reference
resolved by :func:`resolve`, so the registry and this catalogue are one list of methods in one
order. The views the command lines read are derived here: :data:`DATA_FREE_METHODS`,
:data:`EXPERT_LIMITS` and :data:`MERGEKIT_NAMES`; so are the closed form's levels,
:data:`LEVELS`, which ``--levels`` offers.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Literal, get_args

#: The granularity at which the closed form (:mod:`merging.submodule`) fits one α per expert:
#: the whole model, each layer, each layer's attention and MLP, each head.
Level = Literal["model", "layer", "attn_mlp", "head"]
LEVELS: tuple[str, ...] = get_args(Level)


@dataclass(frozen=True)
class MethodEntry:
    """One merge method as plain data: its names, its rules, and references to its objects.

    ``function``, ``config`` and ``mergekit_spec`` are ``"module:name"`` strings (see :func:`resolve`); the other
    fields mean what they mean on :class:`merging.methods.MergeMethod`, the record built from this entry.
    """

    name: str
    function: str
    config: str
    paper: str
    mergekit: str | None
    needs_data: bool = False
    mergekit_spec: str | None = None
    max_experts: int | None = None
    unchanged_is_base: bool = True


def resolve(reference: str):
    """The object a ``"module:name"`` reference names, its module imported (the import is where torch loads)."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def _entry(name: str, module: str, function: str, config: str, paper: str, mergekit: str | None,
           mergekit_spec: str | None = None, **rules) -> MethodEntry:
    """An entry whose function, config and mergekit spec all live in ``module`` (a bare name is a module of
    ``merging.methods``), the way every method module declares them side by side."""
    where = module if "." in module else f"merging.methods.{module}"
    return MethodEntry(name, f"{where}:{function}", f"{where}:{config}", paper, mergekit,
                       mergekit_spec=f"{where}:{mergekit_spec}" if mergekit_spec else None, **rules)


_GTA = "generalized_task_arithmetic"  # one pipeline behind task arithmetic, TIES, DARE, Breadcrumbs and DELLA
_DAVARI = "Davari & Belilovsky 2024 (arXiv 2312.06795)"
_DARE = "Yu et al. 2024, DARE (arXiv 2311.03099)"
_DELLA = "Deep et al. 2024, DELLA-Merging (arXiv 2406.11617)"
_ISO = "Marczak et al. 2025, No Task Left Behind (ICML)"

#: every merge method, in the order the registry, the command line and the results list them
ENTRIES: tuple[MethodEntry, ...] = (
    _entry("weight_average", "average", "weight_average", "AverageConfig",
           "Wortsman et al. 2022, Model soups (arXiv 2203.05482)", "linear", "AVERAGE_MERGEKIT"),
    _entry("task_arithmetic", "generalized", _GTA, "TaskArithmeticConfig", "Ilharco et al. 2023 (arXiv 2212.04089)",
           "task_arithmetic", "GTA_MERGEKIT"),
    _entry("ties", "generalized", _GTA, "TiesConfig", "Yadav et al. 2023, TIES-Merging (arXiv 2306.01708)", "ties",
           "GTA_MERGEKIT"),
    _entry("dare_linear", "generalized", _GTA, "DareLinearConfig", _DARE, "dare_linear", "GTA_MERGEKIT"),
    _entry("dare_ties", "generalized", _GTA, "DareTiesConfig", _DARE, "dare_ties", "GTA_MERGEKIT"),
    _entry("breadcrumbs", "generalized", _GTA, "BreadcrumbsConfig", _DAVARI, "breadcrumbs", "GTA_MERGEKIT"),
    _entry("breadcrumbs_ties", "generalized", _GTA, "BreadcrumbsTiesConfig", _DAVARI, "breadcrumbs_ties",
           "GTA_MERGEKIT"),
    _entry("della", "generalized", _GTA, "DellaConfig", _DELLA, "della", "GTA_MERGEKIT"),
    _entry("della_linear", "generalized", _GTA, "DellaLinearConfig", _DELLA, "della_linear", "GTA_MERGEKIT"),
    _entry("sce", "sce", "select_calculate_erase", "SceConfig", "Wan et al. 2024, FuseChat (arXiv 2408.07990)", "sce",
           "SCE_MERGEKIT"),
    _entry("model_stock", "average", "model_stock", "ModelStockConfig",
           "Jang et al. 2024, Model Stock (arXiv 2403.19522)", "model_stock", "MODEL_STOCK_MERGEKIT"),
    _entry("karcher", "average", "karcher", "KarcherConfig", "Karcher mean (mergekit; arXiv 2603.04972)", "karcher",
           "KARCHER_MERGEKIT"),
    _entry("slerp", "spherical", "slerp", "SlerpConfig", "Shoemake 1985, spherical linear interpolation (mergekit)",
           "slerp", "SLERP_MERGEKIT", max_experts=1),
    _entry("nuslerp", "spherical", "nuslerp", "NuSlerpConfig", "NuSLERP (mergekit)", "nuslerp", "NUSLERP_MERGEKIT",
           max_experts=2),
    _entry("multislerp", "spherical", "multislerp", "MultiSlerpConfig", "Goddard, Multi-SLERP (mergekit)", "multislerp",
           "MULTISLERP_MERGEKIT"),
    _entry("nearswap", "spherical", "nearswap", "NearswapConfig", "alchemonaut, NearSwap (mergekit)", "nearswap",
           "NEARSWAP_MERGEKIT", max_experts=1),
    _entry("arcee_fusion", "arcee", "arcee_fusion", "ArceeFusionConfig", "Arcee Fusion (mergekit)", "arcee_fusion",
           "ARCEE_FUSION_MERGEKIT", max_experts=1),
    _entry("ram", "arcee", "ram", "RamConfig", "Reinforced Agent Merging (arXiv 2601.13572)", "ram", "RAM_MERGEKIT"),
    _entry("ramplus_tl", "arcee", "ramplus_tl", "RamPlusConfig", "RAM+, tensor-local (arXiv 2601.13572)", "ramplus_tl",
           "RAMPLUS_MERGEKIT"),
    # the one model is copied, scaled or not, so a tensor it left alone is still not the base's
    _entry("passthrough", "single_model", "passthrough", "PassthroughConfig",
           "mergekit's passthrough (one model, optionally scaled)", "passthrough", "PASSTHROUGH_MERGEKIT",
           max_experts=1, unchanged_is_base=False),
    _entry("consensus_ta", "consensus", "consensus_task_arithmetic", "ConsensusConfig",
           "Wang et al. 2024, Localizing Task Information (TALL)", None, "CONSENSUS_MERGEKIT"),
    _entry("tsv_m", "spectral", "tsv_m", "TsvConfig", "Gargiulo et al. 2025, Task Singular Vectors (CVPR)", None,
           "TSV_MERGEKIT"),
    _entry("iso_c", "spectral", "iso_c", "IsoCConfig", _ISO, None, "TSV_MERGEKIT"),
    _entry("iso_cts", "spectral", "iso_cts", "IsoCtsConfig", _ISO, None, "ISO_CTS_MERGEKIT"),
    _entry("wudi", "interference", "wudi", "WudiConfig", "Cheng et al. 2025, WUDI merging (arXiv 2503.08099)", None,
           "WUDI_MERGEKIT"),
    # runs models on task samples, so no YAML drives it: merging.merge_submodules calls it
    _entry("closed_form", "merging.submodule", "merge_submodules", "SubmoduleMergeConfig",
           "Dai et al. 2025, submodule linearity (ICLR)", None, needs_data=True),
)

#: the data-free methods (every one but the closed form), in catalogue order: what ``merging.merge`` runs
DATA_FREE_METHODS: tuple[str, ...] = tuple(e.name for e in ENTRIES if not e.needs_data)
#: the methods that merge at most this many experts besides the base
EXPERT_LIMITS: dict[str, int] = {e.name: e.max_experts for e in ENTRIES if e.max_experts is not None}
#: mergekit's name of a method -> its name here (only the methods mergekit 0.1.5 has)
MERGEKIT_NAMES: dict[str, str] = {e.mergekit: e.name for e in ENTRIES if e.mergekit is not None}
