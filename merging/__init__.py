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

This face offers the entry points (``__all__``): :func:`merge` (a registry method on whole models),
:func:`load_mergekit_config` (a mergekit YAML), :func:`task_vector`, :func:`merge_submodules` with
:class:`SubmoduleMergeConfig` (the closed form), :func:`nonlinearity_scores` with
:class:`LinearityConfig`, :func:`merge_circuit_aware`, and the sub-package :mod:`merging.methods`
(the registry, each method's config class). Everything else is imported from its module above (e.g.
:func:`merging.state_dicts.save_state_dict`, :class:`merging.lines.LinesConfig`).

The names are imported on first use, so ``import merging.methods.catalogue`` (the
merge methods' names, for a command line) loads no torch.
"""

from __future__ import annotations

from circuits.lazy_faces import lazy_face

_EXPORTS = {
    "merge": "merging.apply",
    "load_mergekit_config": "merging.mergekit_config",
    "task_vector": "merging.state_dicts",
    "merge_submodules": "merging.submodule",
    "SubmoduleMergeConfig": "merging.submodule",
    "nonlinearity_scores": "merging.linearity",
    "LinearityConfig": "merging.linearity",
    "merge_circuit_aware": "merging.circuit_aware",
}

__all__ = ["merge", "load_mergekit_config", "task_vector", "merge_submodules", "SubmoduleMergeConfig",
           "nonlinearity_scores", "LinearityConfig", "merge_circuit_aware", "methods"]


# names load on first use: the package's torch-free modules (catalogues) import without torch
__getattr__, __dir__ = lazy_face(__name__, globals(), _EXPORTS, submodules=("methods",))
