"""Interventions through hook points: identify the arithmetic circuit, validate it, find its AF1 subgraph.

This face offers the entry points (``__all__``): :func:`path_patch`, :func:`activation_patch`,
:func:`attribution_patch`, :func:`key_heads`, :func:`knockout`, :func:`knockout_curve`,
:func:`knockout_transfer`, :class:`SweepOptions`, and the sub-packages :mod:`patching.edges` (edge
circuits) and :mod:`patching.all_for_one` (AF1). Everything else is imported from its module below
(e.g. :class:`patching.results.NodeScores`, :func:`patching.knockout_curves.knockout_correct`); docs/index.md
maps each face's names.

Node level (heads and MLPs):

* :mod:`patching.path_patching`: exact path patching from every head and MLP to the answer logit
  (or to receiver heads' q/k/v), with an END-only fast path;
* :mod:`patching.activation_patching`: activation patching of head outputs, MLP outputs and the
  residual stream (equal to ``transformer_lens.patching``'s sweeps, faster);
* :mod:`patching.attribution_patching`: attribution patching, and its rank agreement with exact patching;
* :mod:`patching.head_ranking`: which heads are "the key heads" (top-k of one ranking, or combined
  over operations);
* :mod:`patching.knockout_curves`: mean-ablation knockout, effect-rank vs random-rank curves, transfer formats;
* :mod:`patching.number_interventions`: frequency filters, helix-subspace patching and
  heuristic-neuron knockout on number representations;
* :mod:`patching.interchange`, :mod:`patching.featurizers`: interchange interventions and their
  accuracy (IIA) against a causal model's variables (:mod:`circuits.causal_models`), in full or in a
  DAS, DBM, PCA or random subspace.

Edge level: :mod:`patching.edges` (one forward engine; EAP / EAP-IG attribution, exact edge
patching, circuit evaluation, MIB faithfulness curves, the smallest faithful circuit, the same
sweeps over several processes).

All for One: :mod:`patching.all_for_one` (CAMA, ABP, the AF1 search; Mamidanna et al. 2025).

Shared by all of them: :mod:`patching.inputs` (the prompt forms every method accepts),
:mod:`patching.forward` (cached runs, shared-prefix reuse, END-only block pieces),
:mod:`patching.metrics` (what a run is scored by), :mod:`patching.options` (:class:`SweepOptions`:
metric, batching, memory budget, prefix reuse, progress as one record) and
:mod:`patching.results` (the result containers).
"""

from patching import all_for_one, edges
from patching.activation_patching import activation_patch
from patching.attribution_patching import attribution_patch
from patching.head_ranking import key_heads
from patching.knockout_curves import knockout, knockout_curve, knockout_transfer
from patching.options import SweepOptions
from patching.path_patching import path_patch

__all__ = ["path_patch", "activation_patch", "attribution_patch", "key_heads", "knockout", "knockout_curve",
           "knockout_transfer", "SweepOptions", "edges", "all_for_one"]
