"""The shared core: model loading, task data, node names, metrics, figures and reports.

``circuits`` is what the other packages build on (``patching``, ``finetune`` and
``merging`` import it, never each other): load a model with :func:`load_model`,
build prompts with :mod:`circuits.tasks`, name heads and MLPs with
:class:`Head` / :class:`MLP`.
"""

from circuits import heuristics, metrics, number_geometry, numbers, tasks, templates
from circuits.loading import (
    DEFAULT_MODEL,
    CorruptModelDirError,
    MissingModelPackageError,
    ModelNotAvailableError,
    load_model,
    offline_models,
    save_model,
)
from circuits.nodes import MLP, Head, Node, all_heads, all_mlps, all_nodes, parse_node, validate_nodes

__all__ = [
    "DEFAULT_MODEL",
    "CorruptModelDirError",
    "MissingModelPackageError",
    "ModelNotAvailableError",
    "load_model",
    "offline_models",
    "save_model",
    "heuristics",
    "metrics",
    "number_geometry",
    "numbers",
    "tasks",
    "templates",
    "Head",
    "MLP",
    "Node",
    "all_heads",
    "all_mlps",
    "all_nodes",
    "parse_node",
    "validate_nodes",
]
