"""Interventions through hook points: identify the arithmetic circuit, validate it, find its AF1 subgraph.

* :mod:`patching.path_patching`: exact path patching from every head and MLP to the
  answer logit (or to receiver heads' q/k/v), with an END-only fast path;
* :mod:`patching.activation_patching`: activation patching of head outputs, MLP outputs
  and the residual stream (equal to ``transformer_lens.patching``'s sweeps, faster);
* :mod:`patching.edge_runs`: senders' outputs and receivers' inputs of the edge graph (the norm convention);
* :mod:`patching.edge_patching`, :mod:`patching.circuit_evaluation`: exact patching of each edge, and circuits run
  with every edge outside them ablated; :mod:`patching.faithfulness`: MIB faithfulness curves, CPR and CMD;
* :mod:`patching.edge_attribution`: EAP / EAP-IG scores of every edge (hannamw/EAP-IG's methods);
* :mod:`patching.attribution`: attribution patching, and its rank agreement with exact patching;
* :mod:`patching.key_heads`: which heads are "the key heads" (per operation, their union, or summed effects);
* :mod:`patching.knockout`: mean-ablation knockout, effect-rank vs random-rank curves, transfer formats;
* :mod:`patching.cama`, :mod:`patching.abp`, :mod:`patching.af1`: context-aware mean ablation,
  attention-based peeking and the All-for-One search (Mamidanna et al. 2025);
* :mod:`patching.number_interventions`: frequency filters, helix-subspace patching and
  heuristic-neuron knockout on number representations.
"""

from patching.activation_patching import activation_patch
from patching.circuit_evaluation import ABLATIONS, CircuitEvaluation, MeanPoolError, evaluate_circuit, evaluate_circuits
from patching.edge_patching import EdgeEffects, edge_patch
from patching.faithfulness import MIB_FRACTIONS, FaithfulnessCurve, curve_areas, faithfulness_curve, top_n_mask
from patching.edge_attribution import EDGE_ATTRIBUTION_METHODS, edge_attribution
from patching.edge_runs import UnsupportedModelError, edge_mode, receiver_hooks, sender_outputs
from patching.af1 import AF1Config, AF1Runner, AF1SearchResult, af1_accuracy, search_af1
from patching.af1_data import authors_templates, make_template_dataset
from patching.abp import abp_hooks, allowed_keys_mask, peek_mask
from patching.attribution import attribution_patch, rank_agreement
from patching.cama import CamaConfig, CamaMeans, fit_cama
from patching.knockout import (
    LayoutMeans, PoolError, knockout, knockout_correct, knockout_curve, knockout_hooks, knockout_transfer, mean_activations,
    pool_means,
)
from patching.metrics import METRICS, PatchMetric, get_metric
from patching.number_interventions import (
    evaluate_end, fourier_filter, fraction_moved, frequency_band, frequency_filter_edit, neuron_attribution,
    neuron_knockout_edit, subspace_patch_edit, top_neurons,
)
from patching.path_patching import path_patch
from patching.key_heads import KeyHeads, combine_key_heads, given_key_heads, rank_key_heads
from patching.results import ActivationScores, KnockoutCurve, NodeScores, key_heads

__all__ = [
    "activation_patch", "AF1Config", "AF1Runner", "AF1SearchResult", "af1_accuracy", "authors_templates", "make_template_dataset",
    "search_af1", "abp_hooks", "allowed_keys_mask", "peek_mask", "attribution_patch", "rank_agreement",
    "CamaConfig", "CamaMeans", "fit_cama", "knockout", "knockout_curve", "knockout_hooks", "knockout_transfer",
    "mean_activations", "LayoutMeans", "PoolError", "knockout_correct", "pool_means", "METRICS", "PatchMetric", "get_metric", "path_patch", "ActivationScores",
    "KnockoutCurve", "NodeScores", "key_heads", "evaluate_end", "fourier_filter", "fraction_moved", "frequency_band",
    "frequency_filter_edit", "neuron_attribution", "neuron_knockout_edit", "subspace_patch_edit", "top_neurons",
]
__all__ += ["ABLATIONS", "CircuitEvaluation", "MeanPoolError", "evaluate_circuit", "evaluate_circuits", "EdgeEffects",
            "edge_patch", "MIB_FRACTIONS", "FaithfulnessCurve", "curve_areas", "faithfulness_curve", "top_n_mask",
            "UnsupportedModelError", "edge_mode", "receiver_hooks", "sender_outputs"]
__all__ += ["EDGE_ATTRIBUTION_METHODS", "edge_attribution"]
__all__ += ["KeyHeads", "combine_key_heads", "given_key_heads", "rank_key_heads"]
