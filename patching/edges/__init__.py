"""Edge circuits: every edge of the graph scored, patched exactly, evaluated as circuits, summarised as curves.

An edge ``s -> r`` carries sender ``s``'s output into receiver ``r``'s input (:mod:`circuits.graph`).
One forward engine (:mod:`patching.edges.engine`) fixes what a sender's output and a receiver's input
are, so that outputs add up to inputs on every supported model; everything else runs on it:

* :mod:`patching.edges.attribute`: EAP / EAP-IG / EAP-GP / CEAP scores of every edge from a few backward passes;
* :mod:`patching.edges.acdc`: ACDC, greedy pruning by exact runs, from the output back;
* :mod:`patching.edges.patch` (and its fast path :mod:`patching.edges.patch_fast`): the exact effect
  of each single edge;
* :mod:`patching.edges.mixing`: the hooks of a run with edges ablated by a weight (circuits, learned masks,
  position-aware edges) under either norm convention (``"frozen"``, ``"recompute"``);
* :mod:`patching.edges.evaluate`: circuits run with every edge outside them ablated;
* :mod:`patching.edges.learn`: learned circuits (Edge Pruning, UGS, random-budget masks) over every edge at once;
* :mod:`patching.edges.curves`: MIB faithfulness curves, CPR and CMD, with bootstrap intervals;
* :mod:`patching.edges.faithful_circuit`: the smallest faithful circuit, chosen on one half of the prompts
  and reported on the other;
* :mod:`patching.edges.catalogue`: every circuit method as one record (torch-free: the command line reads it);
* :mod:`patching.edges.circuit_methods`: how each method scores, and several compared side by side;
* :mod:`patching.edges.stability`: one method's circuits on disjoint prompt sets, their overlap and stable core;
* :mod:`patching.edges.families`: one method's circuit on each prompt family (template styles, transfer formats),
  evaluated on every other family;
* :mod:`patching.edges.combine`: ensembles, bootstrapped sign-stable scores, the ILP circuit;
* :mod:`patching.edges.positions`: position-aware edges over a span schema of the prompt layouts;
* :mod:`patching.edges.distributed`: the same sweeps split over processes.

This face offers the entry points (``__all__``): :func:`edge_attribution`, :func:`edge_patch`,
:func:`evaluate_circuit`, :func:`evaluate_circuits`, :func:`faithfulness_curve`,
:func:`find_faithful_circuit` (with its settings :class:`CircuitSearch`), :func:`learn_circuit`
(:class:`LearnConfig`); what tuning or merging did to a circuit is :func:`patching.circuit_shift`. Their results, constants
and errors are imported from the modules above (e.g. :class:`patching.edges.patch.EdgeEffects`,
:data:`patching.edges.curves.MIB_FRACTIONS`, :data:`patching.edges.attribute.EDGE_ATTRIBUTION_METHODS`).
"""

from __future__ import annotations

from circuits.lazy_faces import lazy_face

_EXPORTS = {
    "edge_attribution": "patching.edges.attribute",
    "faithfulness_curve": "patching.edges.curves",
    "evaluate_circuit": "patching.edges.evaluate",
    "evaluate_circuits": "patching.edges.evaluate",
    "CircuitSearch": "patching.edges.faithful_circuit",
    "find_faithful_circuit": "patching.edges.faithful_circuit",
    "LearnConfig": "patching.edges.learn",
    "learn_circuit": "patching.edges.learn",
    "edge_patch": "patching.edges.patch",
}

__all__ = ["edge_attribution", "edge_patch", "evaluate_circuit", "evaluate_circuits", "faithfulness_curve",
           "find_faithful_circuit", "CircuitSearch", "learn_circuit", "LearnConfig"]


# names load on first use: the package's torch-free modules (catalogues) import without torch
__getattr__, __dir__ = lazy_face(__name__, globals(), _EXPORTS)
