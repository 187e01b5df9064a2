"""Choosing a circuit from scored edges: top-n, threshold, greedy, and pruning to connected paths.

A :class:`~circuits.graph.Graph` carries a score per edge (e.g. from EAP-IG); a *circuit*
is the set of edges with ``in_graph`` True. The selections here follow hannamw/EAP-IG's
``Graph.apply_topn`` / ``apply_threshold`` / ``apply_greedy`` / ``prune``, so a circuit
chosen here is the one EAP-IG (and the MIB circuit track, which calls them) would choose:

* :func:`select_top_n`: the n edges of largest score (|score| by default);
* :func:`select_threshold`: every edge whose score is at least a threshold;
* :func:`select_greedy`: grown from the logits upward: start with the edges into
  ``logits``; repeatedly take the best edge into any receiver whose node is already in
  the circuit, and when that edge's sender is new, its own incoming edges become
  candidates. Every chosen edge is connected to the logits when chosen;
* :func:`prune`: drop every edge that lies on no path from ``input`` to ``logits``
  (a node is kept only if it has an in-circuit input, or is ``input``, and an
  in-circuit output), repeated to a fixed point as EAP-IG does. Selections prune by
  default, so a selection of n edges may hold fewer than n afterwards.

Node membership is derived from the edges (:func:`nodes_in_graph`): a node is in the
circuit when it has an outgoing circuit edge and an incoming one (``input`` needs none);
``logits`` always is.

Two circuits of one graph are compared by :func:`edge_jaccard` (their shared edges over all edges of
either) and two scorings by :func:`score_spearman` (the rank correlation of every real edge's |score|).

Ties: edges of equal score are taken in index order (a stable sort), so selections are
deterministic; EAP-IG's unstable ``argsort`` may break exact ties differently.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

import torch
from jaxtyping import Bool
from torch import Tensor

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout

__all__ = ["nodes_in_graph", "prune", "select_top_n", "select_threshold", "select_greedy", "select_fraction",
           "mib_selector", "edge_jaccard", "score_spearman"]


def _forward_to_backward(layout: GraphLayout) -> Bool[Tensor, "n_forward n_backward"]:
    owner = layout.receiver_owner()
    matrix = torch.zeros(layout.n_forward, layout.n_backward, dtype=torch.bool)
    has_owner = owner >= 0
    matrix[owner[has_owner], torch.arange(layout.n_backward)[has_owner]] = True
    return matrix


def _nodes_from_edges(layout: GraphLayout, edges: Bool[Tensor, "n_forward n_backward"]) -> Bool[Tensor, "n_forward"]:
    with_outgoing = edges.any(dim=1)
    with_incoming = (_forward_to_backward(layout) & edges.any(dim=0)[None, :]).any(dim=1)
    with_incoming[0] = True  # input has no inputs of its own
    return with_outgoing & with_incoming


def nodes_in_graph(graph: Graph) -> Bool[Tensor, "n_forward"]:
    """Which senders (forward nodes) are in the circuit: an outgoing circuit edge, and an incoming one or ``input``."""
    return _nodes_from_edges(graph.layout, graph.in_graph & graph.layout.real_edge_mask)


def _pruned_edges(layout: GraphLayout, edges: Bool[Tensor, "n_forward n_backward"]) -> Bool[Tensor, "n_forward n_backward"]:
    edges = edges & layout.real_edge_mask
    f2b = _forward_to_backward(layout)
    while True:
        nodes = _nodes_from_edges(layout, edges)
        receivers_alive = (nodes[:, None] & f2b).any(dim=0)
        receivers_alive[layout.logits_backward] = True
        kept = edges & nodes[:, None] & receivers_alive[None, :]
        if torch.equal(kept, edges):
            return kept
        edges = kept


def prune(graph: Graph) -> Graph:
    """A copy of ``graph`` keeping only circuit edges on some path from ``input`` to ``logits``."""
    return replace(graph, in_graph=_pruned_edges(graph.layout, graph.in_graph.cpu()), meta=dict(graph.meta))


def _ranked_scores(graph: Graph, absolute: bool) -> Tensor:
    scores = graph.scores.detach().float().cpu()
    if torch.isnan(scores[graph.layout.real_edge_mask]).any():
        raise InputError("The graph has edges without a score (NaN): score every edge (e.g. with "
                         "patching.edges.attribute) before selecting a circuit.")
    scores = scores.abs() if absolute else scores.clone()
    return torch.where(graph.layout.real_edge_mask, scores, torch.tensor(-torch.inf))


def _finish(graph: Graph, edges: Tensor, do_prune: bool, how: str) -> Graph:
    if do_prune:
        edges = _pruned_edges(graph.layout, edges)
    meta = dict(graph.meta, selection=how)
    return replace(graph, in_graph=edges & graph.layout.real_edge_mask, meta=meta)


def select_top_n(graph: Graph, n: int, *, absolute: bool = True, prune: bool = True) -> Graph:
    """The ``n`` best-scoring edges (by |score| when ``absolute``), then pruned (EAP-IG's ``apply_topn``)."""
    if not 0 <= n <= graph.n_edges:
        raise InputError(f"n={n} edges requested, but the graph has {graph.n_edges}: choose 0 <= n <= {graph.n_edges}.")
    flat = _ranked_scores(graph, absolute).flatten()
    order = torch.argsort(flat, descending=True, stable=True)
    edges = torch.zeros_like(flat, dtype=torch.bool)
    edges[order[:n]] = True
    return _finish(graph, edges.view_as(graph.in_graph), prune, f"top_n({n}, absolute={absolute})")


def select_fraction(graph: Graph, fraction: float, *, absolute: bool = True, prune: bool = True,
                    greedy: bool = False) -> Graph:
    """Top ``int(fraction * n_edges)`` edges (MIB's circuit sizes), by top-n or by :func:`select_greedy`."""
    if not 0.0 <= fraction <= 1.0:
        raise InputError(f"fraction={fraction} is not in [0, 1]: pass e.g. 0.01 for 1% of the edges.")
    n = int(fraction * graph.n_edges)
    chooser = select_greedy if greedy else select_top_n
    return chooser(graph, n, absolute=absolute, prune=prune)


def select_threshold(graph: Graph, threshold: float, *, absolute: bool = True, prune: bool = True) -> Graph:
    """Every edge whose score (|score| when ``absolute``) is >= ``threshold``, then pruned (``apply_threshold``)."""
    edges = _ranked_scores(graph, absolute) >= float(threshold)
    return _finish(graph, edges, prune, f"threshold({threshold}, absolute={absolute})")


def select_greedy(graph: Graph, n: int, *, absolute: bool = True, prune: bool = True) -> Graph:
    """``n`` edges grown from the logits upward (EAP-IG's ``apply_greedy``; see the module docstring)."""
    layout = graph.layout
    if not 0 <= n <= graph.n_edges:
        raise InputError(f"n={n} edges requested, but the graph has {graph.n_edges}: choose 0 <= n <= {graph.n_edges}.")
    ranked = _ranked_scores(graph, absolute)
    real = layout.real_edge_mask
    owner = layout.receiver_owner()
    receivers_of = {f: (owner == f).nonzero().flatten().tolist() for f in range(layout.n_forward)}
    heap: list[tuple[float, int, int]] = []  # (-score, backward, forward): max-heap, ties in index order

    def push_into(backward: int) -> None:
        for f in real[:, backward].nonzero().flatten().tolist():
            heapq.heappush(heap, (-float(ranked[f, backward]), backward, f))

    push_into(layout.logits_backward)
    edges = torch.zeros_like(real)
    node_added = torch.zeros(layout.n_forward, dtype=torch.bool)
    for _ in range(n):
        _, b, f = heapq.heappop(heap)
        edges[f, b] = True
        if not node_added[f]:
            node_added[f] = True
            for receiver in receivers_of[f]:
                push_into(receiver)
    return _finish(graph, edges, prune, f"greedy({n}, absolute={absolute})")


def mib_selector(layout: GraphLayout, *, absolute: bool = True, greedy: bool = False):
    """``(scores, n) -> bool mask``: the circuit MIB evaluates at size n (top-n or greedy, then pruned).

    Pass it as ``select=`` to :func:`patching.edges.faithfulness_curve` so that every point of the
    curve is the pruned circuit hannamw/MIB-circuit-track's ``evaluate_area_under_curve`` builds.
    """
    chooser = select_greedy if greedy else select_top_n

    def select(scores: Tensor, n: int) -> Tensor:
        return chooser(Graph(layout, scores.detach().float().cpu()), n, absolute=absolute).in_graph

    return select


def edge_jaccard(mask_a: Tensor, mask_b: Tensor) -> float:
    """|A ∩ B| / |A ∪ B| of two circuits' edge masks (1.0 when both are empty)."""
    union = int((mask_a | mask_b).sum())
    return 1.0 if union == 0 else int((mask_a & mask_b).sum()) / union


def score_spearman(a: Graph, b: Graph) -> float:
    """Spearman correlation of the |score| of every real edge in two scorings of one graph.

    Constant scores have no ranking: 1.0 when both are the same constant vector, NaN otherwise.
    """
    import numpy as np
    from scipy.stats import spearmanr  # only here: selecting a circuit needs no scipy

    real = a.layout.real_edge_mask
    x, y = a.scores[real].abs().numpy(), b.scores[real].abs().numpy()
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return 1.0 if np.array_equal(x, y) else float("nan")
    return float(spearmanr(x, y)[0])
