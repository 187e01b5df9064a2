"""Edge circuits: every edge of the graph scored, patched exactly, evaluated as circuits, summarised as curves.

An edge ``s -> r`` carries sender ``s``'s output into receiver ``r``'s input (:mod:`circuits.graph`).
One forward engine (:mod:`patching.edges.engine`) fixes what a sender's output and a receiver's input
are, so that outputs add up to inputs on every supported model; everything else runs on it:

* :mod:`patching.edges.attribute`: EAP / EAP-IG scores of every edge from a few backward passes;
* :mod:`patching.edges.patch` (and its fast path :mod:`patching.edges.patch_fast`): the exact effect
  of each single edge;
* :mod:`patching.edges.mixing`: the hooks of a run with edges ablated by a weight (circuits, learned masks,
  position-aware edges) under either norm convention (``"frozen"``, ``"recompute"``);
* :mod:`patching.edges.evaluate`: circuits run with every edge outside them ablated;
* :mod:`patching.edges.learn`: learned circuits (Edge Pruning, UGS, random-budget masks) over every edge at once;
* :mod:`patching.edges.curves`: MIB faithfulness curves, CPR and CMD, with bootstrap intervals;
* :mod:`patching.edges.faithful_circuit`: the smallest faithful circuit, chosen on one half of the prompts
  and reported on the other;
* :mod:`patching.edges.circuit_methods`: the registry of circuit methods, and several compared side by side;
* :mod:`patching.edges.combine`: ensembles, bootstrapped sign-stable scores, the ILP circuit;
* :mod:`patching.edges.positions`: position-aware edges over a span schema of the prompt layouts;
* :mod:`patching.edges.shift`: what tuning or merging did to a circuit;
* :mod:`patching.edges.distributed`: the same sweeps split over processes.
"""

from patching.edges.attribute import EDGE_ATTRIBUTION_METHODS, edge_attribution
from patching.edges.curves import MIB_FRACTIONS, FaithfulnessCurve, curve_areas, faithfulness_curve
from patching.edges.engine import UnsupportedModelError, edge_mode, receiver_hooks, sender_outputs
from patching.edges.evaluate import ABLATIONS, CircuitEvaluation, MeanPoolError, evaluate_circuit, evaluate_circuits
from patching.edges.faithful_circuit import CircuitSearch, FaithfulCircuit, find_faithful_circuit
from patching.edges.learn import LearnConfig, LearnedCircuit, learn_circuit
from patching.edges.mixing import NORMS
from patching.edges.shift import CircuitShift, ShiftSettings, circuit_shift
from patching.edges.patch import EdgeEffects, edge_patch

__all__ = ["ABLATIONS", "CircuitEvaluation", "CircuitSearch", "FaithfulCircuit", "find_faithful_circuit", "CircuitShift", "ShiftSettings", "circuit_shift", "LearnConfig", "LearnedCircuit", "learn_circuit", "NORMS", "EDGE_ATTRIBUTION_METHODS", "EdgeEffects", "FaithfulnessCurve",
           "MIB_FRACTIONS", "MeanPoolError", "UnsupportedModelError", "curve_areas", "edge_attribution", "edge_mode",
           "edge_patch", "evaluate_circuit", "evaluate_circuits", "faithfulness_curve", "receiver_hooks",
           "sender_outputs"]
