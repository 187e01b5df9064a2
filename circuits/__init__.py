"""The shared core: model loading, task data, node and edge names, the edge graph, END logits, statistics.

``circuits`` is what the other packages build on (``patching``, ``finetune`` and ``merging``
import it, never each other): load a model with :func:`load_model`, build prompts with
:mod:`circuits.tasks`, name heads and MLPs with :class:`Head` / :class:`MLP`, hold edge scores
in a :class:`Graph`.

The core modules:

* :mod:`circuits.loading`, :mod:`circuits.model_cache`, :mod:`circuits.gguf_models`: models
  that run offline, the verified safetensors cache, saved models;
* :mod:`circuits.tasks`, :mod:`circuits.templates`, :mod:`circuits.counterfactuals`,
  :mod:`circuits.pools`: prompts, their counterfactual twins, prompt pools for ablation means (the tasks' causal
  models sit with the interchange interventions that test them, :mod:`patching.variables.causal_models`);
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

This face offers the entry points (``__all__``): :func:`load_model`, :func:`save_model`, :class:`Head`,
:class:`MLP`, :func:`parse_node`, :class:`Graph`, and the modules :mod:`circuits.tasks` and
:mod:`circuits.templates`. Everything else is imported from its module above (e.g.
:func:`circuits.nodes.all_heads`, :func:`circuits.graph_io.load_eap_json`,
:func:`circuits.graph_selection.select_top_n`).

The names are imported on first use, so ``import circuits.errors`` (done everywhere)
loads neither TransformerLens nor plotly.
"""

from __future__ import annotations

from circuits.lazy_faces import lazy_face

_EXPORTS = {
    "load_model": "circuits.loading",
    "save_model": "circuits.loading",
    "Head": "circuits.nodes",
    "MLP": "circuits.nodes",
    "parse_node": "circuits.nodes",
    "Graph": "circuits.graph",
}

__all__ = ["load_model", "save_model", "Head", "MLP", "parse_node", "Graph", "tasks", "templates"]


# names load on first use: the package's torch-free modules (catalogues) import without torch
__getattr__, __dir__ = lazy_face(__name__, globals(), _EXPORTS, submodules=("tasks", "templates"))
