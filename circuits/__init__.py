"""The shared core: model loading, task data, node and edge names, the edge graph, END logits, statistics.

``circuits`` is what the other packages build on (``patching``, ``finetune`` and ``merging``
import it, never each other): load a model with :func:`load_model`, build prompts with
:mod:`circuits.tasks`, name heads and MLPs with :class:`Head` / :class:`MLP`, hold edge scores
in a :class:`Graph`.

The core modules:

* :mod:`circuits.loading`, :mod:`circuits.model_cache`, :mod:`circuits.gguf_models`: models
  that run offline, the verified safetensors cache, saved models;
* :mod:`circuits.tasks`, :mod:`circuits.templates`, :mod:`circuits.counterfactuals`,
  :mod:`circuits.pools`: prompts, their counterfactual twins, prompt pools for ablation means;
* :mod:`circuits.nodes`, :mod:`circuits.graph`, :mod:`circuits.graph_selection`,
  :mod:`circuits.graph_io`: heads and MLPs, the edge graph, choosing a circuit, its files;
* :mod:`circuits.end_logits`, :mod:`circuits.answer_scoring`, :mod:`circuits.stats`: the answer's logit at
  END, accuracy (first token, whole answer), intervals;
* :mod:`circuits.errors`, :mod:`circuits.arguments`, :mod:`circuits.atomic_files`: bad input,
  argument checks, files written atomically;
* :mod:`circuits.random_models`: tiny random models of each supported architecture.

Two sub-packages serve the experiments: :mod:`circuits.analyze` (attention reads, probes, number
representations, heuristic neurons) and :mod:`circuits.show` (figures,
the HTML report, static export).

The names below are imported on first use, so ``import circuits.errors`` (done everywhere)
loads neither TransformerLens nor plotly.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "DEFAULT_MODEL": "circuits.loading",
    "CorruptModelDirError": "circuits.loading",
    "MissingModelPackageError": "circuits.loading",
    "ModelNotAvailableError": "circuits.loading",
    "load_model": "circuits.loading",
    "offline_models": "circuits.loading",
    "save_model": "circuits.loading",
    "Head": "circuits.nodes",
    "MLP": "circuits.nodes",
    "Node": "circuits.nodes",
    "all_heads": "circuits.nodes",
    "all_mlps": "circuits.nodes",
    "all_nodes": "circuits.nodes",
    "parse_node": "circuits.nodes",
    "validate_nodes": "circuits.nodes",
    "Graph": "circuits.graph",
    "GraphLayout": "circuits.graph",
    "GraphFileError": "circuits.graph_io",
    "load_eap_json": "circuits.graph_io",
    "save_eap_json": "circuits.graph_io",
    "write_mib_submission": "circuits.graph_io",
    "mib_selector": "circuits.graph_selection",
    "prune": "circuits.graph_selection",
    "select_fraction": "circuits.graph_selection",
    "select_greedy": "circuits.graph_selection",
    "select_threshold": "circuits.graph_selection",
    "select_top_n": "circuits.graph_selection",
}

__all__ = sorted(_EXPORTS) + ["tasks", "templates"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in ("tasks", "templates"):
        return importlib.import_module(f"circuits.{name}")
    raise AttributeError(f"module 'circuits' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
