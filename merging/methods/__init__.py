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

``METHODS`` (name -> function) and ``CONFIGS`` (name -> config class) are views of
the data-free records, kept for code that imports them.

This face offers (``__all__``) the registry, its record class and each method's config class; the
method functions are imported from their modules (e.g. :func:`merging.methods.generalized.generalized_task_arithmetic`,
:func:`merging.methods.spectral.tsv_m`, :func:`merging.methods.spherical.slerp`,
:func:`merging.methods.arcee.ram`, :func:`merging.methods.interference.wudi`), ``METHODS``, ``CONFIGS`` and ``MERGEKIT_NAMES`` from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from merging.methods.arcee import (
    ARCEE_FUSION_MERGEKIT,
    RAM_MERGEKIT,
    RAMPLUS_MERGEKIT,
    ArceeFusionConfig,
    RamConfig,
    RamPlusConfig,
    arcee_fusion,
    ram,
    ramplus_tl,
)
from merging.methods.average import (
    AVERAGE_MERGEKIT,
    KARCHER_MERGEKIT,
    MODEL_STOCK_MERGEKIT,
    AverageConfig,
    KarcherConfig,
    ModelStockConfig,
    karcher,
    model_stock,
    weight_average,
)
from merging.methods.consensus import CONSENSUS_MERGEKIT, ConsensusConfig, consensus_task_arithmetic
from merging.methods.generalized import (
    GTA_MERGEKIT,
    BreadcrumbsConfig,
    BreadcrumbsTiesConfig,
    DareLinearConfig,
    DareTiesConfig,
    DellaConfig,
    DellaLinearConfig,
    TaskArithmeticConfig,
    TiesConfig,
    generalized_task_arithmetic,
    ties_thresholds,
)
from merging.methods.mergekit_spec import MergekitParameter, MergekitSpec
from merging.methods.single_model import PASSTHROUGH_MERGEKIT, PassthroughConfig, passthrough
from merging.methods.sce import SCE_MERGEKIT, SceConfig, select_calculate_erase
from merging.methods.spectral import (
    ISO_CTS_MERGEKIT,
    TSV_MERGEKIT,
    IsoCConfig,
    IsoCtsConfig,
    TsvConfig,
    iso_c,
    iso_cts,
    tsv_m,
)
from merging.methods.spherical import (
    MULTISLERP_MERGEKIT,
    NEARSWAP_MERGEKIT,
    NUSLERP_MERGEKIT,
    SLERP_MERGEKIT,
    MultiSlerpConfig,
    NearswapConfig,
    NuSlerpConfig,
    SlerpConfig,
    multislerp,
    nearswap,
    nuslerp,
    slerp,
)
from merging.methods.interference import WUDI_MERGEKIT, WudiConfig, wudi
from merging.submodule import SubmoduleMergeConfig, merge_submodules


@dataclass(frozen=True)
class MergeMethod:
    """One merge method: what to call, with which config, where it comes from, how a mergekit YAML drives it."""

    name: str
    function: Callable
    config: type
    paper: str
    mergekit: str | None
    needs_data: bool = False
    mergekit_spec: MergekitSpec | None = None
    max_experts: int | None = None  # the most experts it merges besides the base (None: any number)
    unchanged_is_base: bool = True  # a tensor no expert changed merges to the base's (passthrough's scale: not)

    def __post_init__(self):
        if self.mergekit_spec is not None:
            unknown = self.mergekit_spec.fields() - {f.name for f in dataclasses.fields(self.config)}
            if unknown:
                raise TypeError(f"{self.name}: mergekit_spec sets {sorted(unknown)}, not fields of "
                                f"{self.config.__name__}.")


_GTA = generalized_task_arithmetic
_RECORDS = (
    MergeMethod("weight_average", weight_average, AverageConfig, "Wortsman et al. 2022, Model soups (arXiv 2203.05482)",
                "linear", mergekit_spec=AVERAGE_MERGEKIT),
    MergeMethod("task_arithmetic", _GTA, TaskArithmeticConfig, "Ilharco et al. 2023 (arXiv 2212.04089)",
                "task_arithmetic", mergekit_spec=GTA_MERGEKIT),
    MergeMethod("ties", _GTA, TiesConfig, "Yadav et al. 2023, TIES-Merging (arXiv 2306.01708)", "ties",
                mergekit_spec=GTA_MERGEKIT),
    MergeMethod("dare_linear", _GTA, DareLinearConfig, "Yu et al. 2024, DARE (arXiv 2311.03099)", "dare_linear",
                mergekit_spec=GTA_MERGEKIT),
    MergeMethod("dare_ties", _GTA, DareTiesConfig, "Yu et al. 2024, DARE (arXiv 2311.03099)", "dare_ties",
                mergekit_spec=GTA_MERGEKIT),
    MergeMethod("breadcrumbs", _GTA, BreadcrumbsConfig, "Davari & Belilovsky 2024 (arXiv 2312.06795)", "breadcrumbs",
                mergekit_spec=GTA_MERGEKIT),
    MergeMethod("breadcrumbs_ties", _GTA, BreadcrumbsTiesConfig, "Davari & Belilovsky 2024 (arXiv 2312.06795)",
                "breadcrumbs_ties", mergekit_spec=GTA_MERGEKIT),
    MergeMethod("della", _GTA, DellaConfig, "Deep et al. 2024, DELLA-Merging (arXiv 2406.11617)", "della",
                mergekit_spec=GTA_MERGEKIT),
    MergeMethod("della_linear", _GTA, DellaLinearConfig, "Deep et al. 2024, DELLA-Merging (arXiv 2406.11617)",
                "della_linear", mergekit_spec=GTA_MERGEKIT),
    MergeMethod("sce", select_calculate_erase, SceConfig, "Wan et al. 2024, FuseChat (arXiv 2408.07990)", "sce",
                mergekit_spec=SCE_MERGEKIT),
    MergeMethod("model_stock", model_stock, ModelStockConfig, "Jang et al. 2024, Model Stock (arXiv 2403.19522)",
                "model_stock", mergekit_spec=MODEL_STOCK_MERGEKIT),
    MergeMethod("karcher", karcher, KarcherConfig, "Karcher mean (mergekit; arXiv 2603.04972)", "karcher",
                mergekit_spec=KARCHER_MERGEKIT),
    MergeMethod("slerp", slerp, SlerpConfig, "Shoemake 1985, spherical linear interpolation (mergekit)", "slerp",
                mergekit_spec=SLERP_MERGEKIT, max_experts=1),
    MergeMethod("nuslerp", nuslerp, NuSlerpConfig, "NuSLERP (mergekit)", "nuslerp", mergekit_spec=NUSLERP_MERGEKIT,
                max_experts=2),
    MergeMethod("multislerp", multislerp, MultiSlerpConfig, "Goddard, Multi-SLERP (mergekit)", "multislerp",
                mergekit_spec=MULTISLERP_MERGEKIT),
    MergeMethod("nearswap", nearswap, NearswapConfig, "alchemonaut, NearSwap (mergekit)", "nearswap",
                mergekit_spec=NEARSWAP_MERGEKIT, max_experts=1),
    MergeMethod("arcee_fusion", arcee_fusion, ArceeFusionConfig, "Arcee Fusion (mergekit)", "arcee_fusion",
                mergekit_spec=ARCEE_FUSION_MERGEKIT, max_experts=1),
    MergeMethod("ram", ram, RamConfig, "Reinforced Agent Merging (arXiv 2601.13572)", "ram",
                mergekit_spec=RAM_MERGEKIT),
    MergeMethod("ramplus_tl", ramplus_tl, RamPlusConfig, "RAM+, tensor-local (arXiv 2601.13572)", "ramplus_tl",
                mergekit_spec=RAMPLUS_MERGEKIT),
    MergeMethod("passthrough", passthrough, PassthroughConfig, "mergekit's passthrough (one model, optionally scaled)",
                "passthrough", mergekit_spec=PASSTHROUGH_MERGEKIT, max_experts=1, unchanged_is_base=False),
    MergeMethod("consensus_ta", consensus_task_arithmetic, ConsensusConfig, "Wang et al. 2024, Localizing Task Information (TALL)",
                None, mergekit_spec=CONSENSUS_MERGEKIT),
    MergeMethod("tsv_m", tsv_m, TsvConfig, "Gargiulo et al. 2025, Task Singular Vectors (CVPR)", None,
                mergekit_spec=TSV_MERGEKIT),
    MergeMethod("iso_c", iso_c, IsoCConfig, "Marczak et al. 2025, No Task Left Behind (ICML)", None,
                mergekit_spec=TSV_MERGEKIT),
    MergeMethod("iso_cts", iso_cts, IsoCtsConfig, "Marczak et al. 2025, No Task Left Behind (ICML)", None,
                mergekit_spec=ISO_CTS_MERGEKIT),
    MergeMethod("wudi", wudi, WudiConfig, "Cheng et al. 2025, WUDI merging (arXiv 2503.08099)", None,
                mergekit_spec=WUDI_MERGEKIT),
    MergeMethod("closed_form", merge_submodules, SubmoduleMergeConfig,
                "Dai et al. 2025, submodule linearity (ICLR)", None, needs_data=True),
)
REGISTRY: dict[str, MergeMethod] = {r.name: r for r in _RECORDS}

METHODS = {name: r.function for name, r in REGISTRY.items() if not r.needs_data}
CONFIGS = {name: r.config for name, r in REGISTRY.items() if not r.needs_data}
MERGEKIT_NAMES = {r.mergekit: r.name for r in _RECORDS if r.mergekit is not None}

__all__ = [
    "REGISTRY", "MergeMethod", "AverageConfig", "BreadcrumbsConfig", "BreadcrumbsTiesConfig", "ConsensusConfig",
    "DareLinearConfig", "DareTiesConfig", "DellaConfig", "DellaLinearConfig", "IsoCConfig", "IsoCtsConfig",
    "KarcherConfig", "ModelStockConfig", "SceConfig", "TaskArithmeticConfig", "TiesConfig", "TsvConfig",
    "MultiSlerpConfig", "NearswapConfig", "NuSlerpConfig", "SlerpConfig", "ArceeFusionConfig", "RamConfig",
    "RamPlusConfig", "PassthroughConfig", "WudiConfig",
]
