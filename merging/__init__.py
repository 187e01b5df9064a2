"""Model merging: task vectors, weight-space merge baselines, and submodule closed-form merging.

* :mod:`merging.state_dicts`: task vectors, source checks (architecture, NaN/Inf,
  processed weights), lazy safetensors sources, atomic saving.
* :mod:`merging.primitives` and :mod:`merging.methods`: one generalized
  task-arithmetic pipeline (task arithmetic, TIES, DARE, Breadcrumbs, DELLA) plus
  weight average, Karcher mean, Model Stock, SCE, Consensus TA, TSV-M, Iso-C and
  Iso-CTS, all records of one registry :data:`REGISTRY`; :func:`merge`
  (:mod:`merging.apply`) applies one to whole models, streaming tensor by tensor;
  :mod:`merging.lines` adds LiNeS layer scaling to any.
* :mod:`merging.mergekit_config`: run a mergekit YAML with these methods (each
  record declares its mergekit parameters and input rules, ``mergekit_spec``).
* :mod:`merging.submodule`: Dai et al. (ICLR 2025) closed-form α per submodule.
* :mod:`merging.linearity`: non-linearity scores of submodules vs the whole model.
* :mod:`merging.circuit_aware`: head-level weights where the key heads are, coarser elsewhere.
"""

from merging.circuit_aware import circuit_levels, merge_circuit_aware
from merging.linearity import (
    LinearityConfig,
    LinearityResult,
    alpha_grid,
    nonlinearity_figure,
    nonlinearity_scores,
)
from merging.lines import LinesConfig
from merging.apply import merge
from merging.mergekit_config import MergePlan, load_mergekit_config
from merging.methods import CONFIGS, METHODS, REGISTRY, MergeMethod
from merging.methods import (
    AverageConfig,
    BreadcrumbsConfig,
    BreadcrumbsTiesConfig,
    ConsensusConfig,
    DareLinearConfig,
    DareTiesConfig,
    DellaConfig,
    DellaLinearConfig,
    IsoCConfig,
    IsoCtsConfig,
    KarcherConfig,
    ModelStockConfig,
    SceConfig,
    TaskArithmeticConfig,
    TiesConfig,
    TsvConfig,
)
from merging.state_dicts import (
    StateDictSource,
    check_compatible,
    iter_task_vectors,
    load_state_dict,
    save_state_dict,
    task_vector,
)
from merging.submodule import (
    AlphaTable,
    SubmoduleMergeConfig,
    SubmoduleMergeResult,
    alpha_heatmap,
    merge_submodules,
)

__all__ = [
    "circuit_levels",
    "merge_circuit_aware",
    "REGISTRY", "MergeMethod", "METHODS", "CONFIGS", "merge", "LinesConfig", "MergePlan", "load_mergekit_config",
    "AverageConfig", "BreadcrumbsConfig", "BreadcrumbsTiesConfig", "ConsensusConfig", "DareLinearConfig",
    "DareTiesConfig", "DellaConfig", "DellaLinearConfig", "IsoCConfig", "IsoCtsConfig", "KarcherConfig",
    "ModelStockConfig", "SceConfig", "TaskArithmeticConfig", "TiesConfig", "TsvConfig", "StateDictSource", "check_compatible",
    "iter_task_vectors", "load_state_dict", "save_state_dict", "task_vector", "AlphaTable",
    "SubmoduleMergeConfig", "SubmoduleMergeResult", "alpha_heatmap", "merge_submodules",
    "LinearityConfig", "LinearityResult", "alpha_grid", "nonlinearity_figure", "nonlinearity_scores",
]
