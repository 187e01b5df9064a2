"""The weight-space merge methods: one file per method, one registry.

Every method is a pure function on one tensor,
``fn(base, experts, config, *, weights=None, generator=None, thresholds=None) -> Tensor``
(``experts`` are the fine-tuned tensors θ_i; task vectors are formed inside),
so :func:`merging.merge` can stream a model tensor by tensor. ``METHODS`` maps a
name to the function and ``CONFIGS`` to its frozen config dataclass.
"""

from merging.methods.average import AverageConfig, average
from merging.methods.breadcrumbs import BreadcrumbsConfig, breadcrumbs
from merging.methods.consensus import ConsensusConfig, consensus
from merging.methods.dare import DareConfig, dare
from merging.methods.task_arithmetic import TaskArithmeticConfig, task_arithmetic
from merging.methods.ties import TiesConfig, ties, ties_thresholds

METHODS = {
    "weight_average": average,
    "task_arithmetic": task_arithmetic,
    "ties": ties,
    "dare": dare,
    "breadcrumbs": breadcrumbs,
    "consensus_ta": consensus,
}

CONFIGS = {
    "weight_average": AverageConfig,
    "task_arithmetic": TaskArithmeticConfig,
    "ties": TiesConfig,
    "dare": DareConfig,
    "breadcrumbs": BreadcrumbsConfig,
    "consensus_ta": ConsensusConfig,
}

__all__ = [
    "METHODS", "CONFIGS", "AverageConfig", "BreadcrumbsConfig", "ConsensusConfig", "DareConfig",
    "TaskArithmeticConfig", "TiesConfig", "average", "breadcrumbs", "consensus", "dare",
    "task_arithmetic", "ties", "ties_thresholds",
]
