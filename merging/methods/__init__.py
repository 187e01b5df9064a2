"""The merge methods and their one registry, :data:`REGISTRY`.

Every weight-space method is a pure function on one tensor,
``fn(base, experts, config, *, weights=None, generator=None, thresholds=None, key=None) -> Tensor``
(``experts`` are the fine-tuned tensors θ_i; task vectors are formed inside;
``key`` is the state-dict name, used by the spectral methods to see matrices),
so :func:`merging.merge` can stream a model tensor by tensor. A
:class:`MergeMethod` record holds the name, the function, the config class, the
paper, mergekit's name for it (None if mergekit 0.1.5 lacks it) and whether it
needs data. Data-driven closed-form merging is a record too, but runs models and
is called through :func:`merging.merge_submodules`.

``METHODS`` (name -> function) and ``CONFIGS`` (name -> config class) are views of
the data-free records, kept for code that imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from merging.methods.average import AverageConfig, KarcherConfig, ModelStockConfig, average, karcher, model_stock
from merging.methods.consensus import ConsensusConfig, consensus
from merging.methods.generalized import (
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
from merging.methods.sce import SceConfig, sce
from merging.methods.spectral import IsoCConfig, IsoCtsConfig, TsvConfig, iso_c, iso_cts, tsv_m
from merging.submodule import SubmoduleMergeConfig, merge_submodules


@dataclass(frozen=True)
class MergeMethod:
    """One merge method: what to call, with which config, where it comes from."""

    name: str
    function: Callable
    config: type
    paper: str
    mergekit: str | None
    needs_data: bool = False


_GTA = generalized_task_arithmetic
_RECORDS = (
    MergeMethod("weight_average", average, AverageConfig, "Wortsman et al. 2022, Model soups (arXiv 2203.05482)", "linear"),
    MergeMethod("task_arithmetic", _GTA, TaskArithmeticConfig, "Ilharco et al. 2023 (arXiv 2212.04089)", "task_arithmetic"),
    MergeMethod("ties", _GTA, TiesConfig, "Yadav et al. 2023, TIES-Merging (arXiv 2306.01708)", "ties"),
    MergeMethod("dare_linear", _GTA, DareLinearConfig, "Yu et al. 2024, DARE (arXiv 2311.03099)", "dare_linear"),
    MergeMethod("dare_ties", _GTA, DareTiesConfig, "Yu et al. 2024, DARE (arXiv 2311.03099)", "dare_ties"),
    MergeMethod("breadcrumbs", _GTA, BreadcrumbsConfig, "Davari & Belilovsky 2024 (arXiv 2312.06795)", "breadcrumbs"),
    MergeMethod("breadcrumbs_ties", _GTA, BreadcrumbsTiesConfig, "Davari & Belilovsky 2024 (arXiv 2312.06795)",
                "breadcrumbs_ties"),
    MergeMethod("della", _GTA, DellaConfig, "Deep et al. 2024, DELLA-Merging (arXiv 2406.11617)", "della"),
    MergeMethod("della_linear", _GTA, DellaLinearConfig, "Deep et al. 2024, DELLA-Merging (arXiv 2406.11617)",
                "della_linear"),
    MergeMethod("sce", sce, SceConfig, "Wan et al. 2024, FuseChat (arXiv 2408.07990)", "sce"),
    MergeMethod("model_stock", model_stock, ModelStockConfig, "Jang et al. 2024, Model Stock (arXiv 2403.19522)",
                "model_stock"),
    MergeMethod("karcher", karcher, KarcherConfig, "Karcher mean (mergekit; arXiv 2603.04972)", "karcher"),
    MergeMethod("consensus_ta", consensus, ConsensusConfig, "Wang et al. 2024, Localizing Task Information (TALL)",
                None),
    MergeMethod("tsv_m", tsv_m, TsvConfig, "Gargiulo et al. 2025, Task Singular Vectors (CVPR)", None),
    MergeMethod("iso_c", iso_c, IsoCConfig, "Marczak et al. 2025, No Task Left Behind (ICML)", None),
    MergeMethod("iso_cts", iso_cts, IsoCtsConfig, "Marczak et al. 2025, No Task Left Behind (ICML)", None),
    MergeMethod("closed_form", merge_submodules, SubmoduleMergeConfig,
                "Dai et al. 2025, submodule linearity (ICLR)", None, needs_data=True),
)
REGISTRY: dict[str, MergeMethod] = {r.name: r for r in _RECORDS}

METHODS = {name: r.function for name, r in REGISTRY.items() if not r.needs_data}
CONFIGS = {name: r.config for name, r in REGISTRY.items() if not r.needs_data}
MERGEKIT_NAMES = {r.mergekit: r.name for r in _RECORDS if r.mergekit is not None}

__all__ = [
    "REGISTRY", "MergeMethod", "METHODS", "CONFIGS", "MERGEKIT_NAMES", "AverageConfig", "BreadcrumbsConfig",
    "BreadcrumbsTiesConfig", "ConsensusConfig", "DareLinearConfig", "DareTiesConfig", "DellaConfig",
    "DellaLinearConfig", "IsoCConfig", "IsoCtsConfig", "KarcherConfig", "ModelStockConfig", "SceConfig",
    "TaskArithmeticConfig", "TiesConfig", "TsvConfig", "average", "consensus", "generalized_task_arithmetic",
    "iso_c", "iso_cts", "karcher", "model_stock", "sce", "ties_thresholds", "tsv_m",
]
