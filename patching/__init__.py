"""Interventions through hook points: identify the arithmetic circuit, validate it, find its AF1 subgraph.

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
  heuristic-neuron knockout on number representations.

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

from patching.activation_patching import activation_patch
from patching.edges.evaluate import ABLATIONS, CircuitEvaluation, MeanPoolError, evaluate_circuit, evaluate_circuits
from patching.edges.patch import EdgeEffects, edge_patch
from patching.edges.curves import MIB_FRACTIONS, FaithfulnessCurve, curve_areas, faithfulness_curve
from patching.edges.attribute import EDGE_ATTRIBUTION_METHODS, edge_attribution
from patching.edges.learn import LearnConfig, LearnedCircuit, learn_circuit
from patching.edges.shift import CircuitShift, ShiftSettings, circuit_shift
from patching.edges.engine import UnsupportedModelError, edge_mode, receiver_hooks, sender_outputs
from patching.all_for_one.search import AF1Config, AF1Runner, AF1SearchResult, af1_accuracy, search_af1
from patching.all_for_one.template_prompts import authors_templates, make_template_dataset
from patching.all_for_one.abp import abp_hooks, allowed_keys_mask, peek_mask
from patching.attribution_patching import attribution_patch, rank_agreement
from patching.all_for_one.cama import CamaConfig, CamaMeans, fit_cama
from patching.knockout_curves import (
    LayoutMeans, PoolError, knockout, knockout_correct, knockout_curve, knockout_hooks, knockout_transfer, mean_activations,
    pool_means,
)
from patching.metrics import METRICS, PatchMetric, get_metric
from patching.options import SweepOptions
from patching.number_interventions import (
    evaluate_end, fourier_filter, fraction_moved, frequency_band, frequency_filter_edit, neuron_attribution,
    neuron_knockout_edit, subspace_patch_edit, top_neurons,
)
from patching.path_patching import path_patch
from patching.head_ranking import KeyHeads, combine_key_heads, given_key_heads, key_heads, rank_key_heads
from patching.results import ActivationScores, KnockoutCurve, NodeScores

__all__ = [
    "activation_patch", "AF1Config", "AF1Runner", "AF1SearchResult", "af1_accuracy", "authors_templates", "make_template_dataset",
    "search_af1", "abp_hooks", "allowed_keys_mask", "peek_mask", "attribution_patch", "rank_agreement",
    "CamaConfig", "CamaMeans", "fit_cama", "knockout", "knockout_curve", "knockout_hooks", "knockout_transfer",
    "mean_activations", "LayoutMeans", "PoolError", "knockout_correct", "pool_means", "METRICS", "PatchMetric", "get_metric", "path_patch", "ActivationScores",
    "KnockoutCurve", "NodeScores", "key_heads", "evaluate_end", "fourier_filter", "fraction_moved", "frequency_band",
    "frequency_filter_edit", "neuron_attribution", "neuron_knockout_edit", "subspace_patch_edit", "top_neurons",
]
__all__ += ["ABLATIONS", "CircuitEvaluation", "MeanPoolError", "evaluate_circuit", "evaluate_circuits", "EdgeEffects",
            "edge_patch", "MIB_FRACTIONS", "FaithfulnessCurve", "curve_areas", "faithfulness_curve",
            "UnsupportedModelError", "edge_mode", "receiver_hooks", "sender_outputs"]
__all__ += ["EDGE_ATTRIBUTION_METHODS", "edge_attribution", "LearnConfig", "LearnedCircuit", "learn_circuit",
            "CircuitShift", "ShiftSettings", "circuit_shift"]
__all__ += ["KeyHeads", "combine_key_heads", "given_key_heads", "rank_key_heads", "SweepOptions"]
