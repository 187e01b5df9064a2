"""Interventions through hook points: identify the arithmetic circuit, validate it, find its AF1 subgraph.

This face offers the entry points (``__all__``): :func:`path_patch`, :func:`activation_patch`,
:func:`attribution_patch`, :func:`key_heads`, :func:`knockout`, :func:`knockout_curve`,
:func:`knockout_transfer`, :class:`SweepOptions`, and the sub-packages :mod:`patching.edges` (edge
circuits) and :mod:`patching.all_for_one` (AF1). Everything else is imported from its module below
(e.g. :class:`patching.sweeps.results.NodeScores`, :func:`patching.node_level.knockout_curves.knockout_correct`); docs/index.md
maps each face's names.

The package is laid out by role, one folder each:

* :mod:`patching.sweeps`: what every sweep shares (inputs, cached forwards, metrics, options, results);
* :mod:`patching.node_level`: node-level methods (heads and MLPs);
* :mod:`patching.edges`: edge circuits, on one forward engine;
* :mod:`patching.all_for_one`: All for One;
* :mod:`patching.variables`: causal variables (causal models, interchange interventions, featurizers);
* :mod:`patching.shift`: what tuning or merging did to a circuit, edges and nodes together (the one module that
  reads two roles).

Node level (heads and MLPs):

* :mod:`patching.node_level.path_patching`: exact path patching from every head and MLP to the answer logit
  (or to receiver heads' q/k/v), with an END-only fast path;
* :mod:`patching.node_level.activation_patching`: activation patching of head outputs, MLP outputs and the
  residual stream (equal to ``transformer_lens.patching``'s sweeps, faster);
* :mod:`patching.node_level.attribution_patching`: attribution patching, and its rank agreement with exact patching;
* :mod:`patching.node_level.head_ranking`: which heads are "the key heads" (top-k of one ranking, or combined
  over operations);
* :mod:`patching.node_level.knockout_curves`: mean-ablation knockout, effect-rank vs random-rank curves, transfer formats;
* :mod:`patching.node_level.number_interventions`: frequency filters, helix-subspace patching and
  heuristic-neuron knockout on number representations;
* :mod:`patching.variables.interchange`, :mod:`patching.variables.featurizers`: interchange interventions and their
  accuracy (IIA) against a causal model's variables (:mod:`patching.variables.causal_models`), in full or in a
  DAS, DBM, PCA or random subspace.

Edge level: :mod:`patching.edges` (one forward engine; EAP / EAP-IG attribution, exact edge
patching, circuit evaluation, MIB faithfulness curves, the smallest faithful circuit, the same
sweeps over several processes).

All for One: :mod:`patching.all_for_one` (CAMA, ABP, the AF1 search; Mamidanna et al. 2025).

Shared by all of them: :mod:`patching.sweeps.inputs` (the prompt forms every method accepts),
:mod:`patching.sweeps.forward` (cached runs, shared-prefix reuse, END-only block pieces),
:mod:`patching.sweeps.metrics` (what a run is scored by), :mod:`patching.sweeps.options` (:class:`SweepOptions`:
metric, batching, memory budget, prefix reuse, progress as one record) and
:mod:`patching.sweeps.results` (the result containers).
"""

from __future__ import annotations

from circuits.lazy_faces import lazy_face

_EXPORTS = {
    "path_patch": "patching.node_level.path_patching",
    "activation_patch": "patching.node_level.activation_patching",
    "attribution_patch": "patching.node_level.attribution_patching",
    "key_heads": "patching.node_level.head_ranking",
    "knockout": "patching.node_level.knockout_curves",
    "knockout_curve": "patching.node_level.knockout_curves",
    "knockout_transfer": "patching.node_level.knockout_curves",
    "SweepOptions": "patching.sweeps.options",
    "circuit_shift": "patching.shift",
    "ShiftSettings": "patching.shift",
}

__all__ = ["path_patch", "activation_patch", "attribution_patch", "key_heads", "knockout", "knockout_curve",
           "knockout_transfer", "SweepOptions", "circuit_shift", "ShiftSettings", "edges", "all_for_one"]


# names load on first use: the package's torch-free modules (catalogues) import without torch
__getattr__, __dir__ = lazy_face(__name__, globals(), _EXPORTS, submodules=("edges", "all_for_one"))
