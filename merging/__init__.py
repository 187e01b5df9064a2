"""Model merging: task vectors, weight-space merge baselines, and submodule closed-form merging.

* :mod:`merging.state_dicts`: task vectors, source checks (architecture, NaN/Inf,
  processed weights), lazy safetensors sources, atomic saving.
* :mod:`merging.primitives` and :mod:`merging.methods`: weight average, task
  arithmetic, TIES, DARE, Breadcrumbs, Consensus TA in the registry
  :data:`METHODS`; :func:`merge` streams them over a state dict.
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
from merging.merge import merge
from merging.methods import CONFIGS, METHODS
from merging.methods import (
    AverageConfig,
    BreadcrumbsConfig,
    ConsensusConfig,
    DareConfig,
    TaskArithmeticConfig,
    TiesConfig,
)
from merging.state_dicts import (
    StateDictSource,
    apply_task_vectors,
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
    "METHODS", "CONFIGS", "merge", "AverageConfig", "BreadcrumbsConfig", "ConsensusConfig", "DareConfig",
    "TaskArithmeticConfig", "TiesConfig", "StateDictSource", "apply_task_vectors", "check_compatible",
    "iter_task_vectors", "load_state_dict", "save_state_dict", "task_vector", "AlphaTable",
    "SubmoduleMergeConfig", "SubmoduleMergeResult", "alpha_heatmap", "merge_submodules",
    "LinearityConfig", "LinearityResult", "alpha_grid", "nonlinearity_figure", "nonlinearity_scores",
]
