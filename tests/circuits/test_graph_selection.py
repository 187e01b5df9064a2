"""circuits.graph_selection: top-n, threshold, greedy and pruning on small layouts, against a plain
breadth-first reference for pruning; the MIB selector."""

from __future__ import annotations

import pytest
import torch

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import nodes_in_graph, prune, select_greedy, select_threshold, select_top_n


def scored_graph(n_layers=3, n_heads=2, parallel=False, seed=0) -> Graph:
    layout = GraphLayout(n_layers, n_heads, parallel)
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(layout.n_forward, layout.n_backward, generator=g)
    scores = torch.where(layout.real_edge_mask, scores, torch.nan)
    return Graph(layout, scores, meta={"d_model": 16})


def on_some_path(layout: GraphLayout, edges: torch.Tensor) -> torch.Tensor:
    """Plain reference for pruning: an edge survives iff its sender is reachable from input and its receiver's
    node reaches logits, both through circuit edges (a breadth-first search over an explicit edge list)."""
    owner = {}
    for l in range(layout.n_layers):
        for h in range(layout.n_heads):
            for x in "qkv":
                owner[layout.head_backward(l, h, x)] = layout.head_forward(l, h)
        owner[layout.mlp_backward(l)] = layout.mlp_forward(l)
    pairs = [(f, b) for f, b in edges.nonzero().tolist()]
    reach = {0}
    changed = True
    while changed:
        changed = False
        for f, b in pairs:
            if f in reach and b in owner and owner[b] not in reach:
                reach.add(owner[b])
                changed = True
    coreach = set()  # forward nodes with a path to logits
    changed = True
    while changed:
        changed = False
        for f, b in pairs:
            if f not in coreach and (b == layout.logits_backward or owner.get(b) in coreach):
                coreach.add(f)
                changed = True
    out = torch.zeros_like(edges)
    for f, b in pairs:
        target_ok = b == layout.logits_backward or owner[b] in coreach
        if f in reach and target_ok:
            out[f, b] = True
    return out


@pytest.mark.parametrize("seed", range(5))
def test_prune_keeps_exactly_the_edges_on_input_to_logits_paths(seed):
    graph = scored_graph(seed=seed)
    g = torch.Generator().manual_seed(100 + seed)
    edges = (torch.rand(graph.in_graph.shape, generator=g) < 0.08) & graph.layout.real_edge_mask
    pruned = prune(Graph(graph.layout, graph.scores, edges))
    assert torch.equal(pruned.in_graph, on_some_path(graph.layout, edges))


def test_prune_removes_a_dangling_chain():
    layout = GraphLayout(2, 1)
    g = Graph(layout, in_graph=torch.zeros(layout.n_forward, layout.n_backward, dtype=torch.bool))
    e = lambda name: layout.edge_index(name)  # noqa: E731
    for name in ("input->a0.h0<q>", "a0.h0->m0", "m0->logits", "input->a1.h0<v>"):
        g.in_graph[e(name)] = True
    kept = prune(g)
    # a1.h0 has an input but no output: its edge goes; the input->a0.h0->m0->logits chain stays
    assert kept.n_edges_in_graph == 3 and not kept.in_graph[e("input->a1.h0<v>")]
    assert nodes_in_graph(kept)[layout.forward_index("a1.h0")].item() is False
    assert nodes_in_graph(kept)[layout.forward_index("a0.h0")].item() is True


def test_top_n_and_threshold_pick_the_largest_absolute_scores():
    graph = scored_graph()
    n = 7
    top = select_top_n(graph, n, prune=False)
    assert top.n_edges_in_graph == n
    chosen = graph.scores[top.in_graph].abs()
    others = graph.scores[graph.layout.real_edge_mask & ~top.in_graph].abs()
    assert chosen.min() > others.max()
    cut = float(chosen.min())
    assert torch.equal(select_threshold(graph, cut, prune=False).in_graph, top.in_graph)
    signed = select_top_n(graph, n, absolute=False, prune=False)
    assert graph.scores[signed.in_graph].min() > graph.scores[graph.layout.real_edge_mask & ~signed.in_graph].max()
    pruned = select_top_n(graph, n)
    assert torch.equal(pruned.in_graph, on_some_path(graph.layout, top.in_graph))


def test_greedy_grows_from_the_logits():
    graph = scored_graph(n_layers=4, n_heads=3, seed=3)
    for n in (1, 5, 20, 60):
        chosen = select_greedy(graph, n, prune=False)
        assert chosen.n_edges_in_graph == n
        # every chosen edge's receiver belongs to logits or to a node that itself has a chosen outgoing edge
        pruned = select_greedy(graph, n, prune=True)
        assert torch.equal(pruned.in_graph, on_some_path(graph.layout, chosen.in_graph))
    first = select_greedy(graph, 1, prune=False)
    logits_col = graph.scores[:, graph.layout.logits_backward].abs()
    assert first.in_graph[int(logits_col.argmax()), graph.layout.logits_backward]


def test_selection_rejects_bad_sizes_and_unscored_graphs():
    graph = scored_graph()
    with pytest.raises(InputError, match="choose 0 <= n"):
        select_top_n(graph, graph.n_edges + 1)
    with pytest.raises(InputError, match="choose 0 <= n"):
        select_greedy(graph, -1)
    unscored = Graph(graph.layout, torch.full_like(graph.scores, torch.nan))
    with pytest.raises(InputError, match="without a score"):
        select_top_n(unscored, 3)


def test_mib_selector_is_top_n_then_pruned():
    from circuits.graph_selection import mib_selector

    graph = scored_graph(n_layers=3, n_heads=3, seed=9)
    select = mib_selector(graph.layout)
    for n in (3, 20, 80):
        assert torch.equal(select(graph.scores, n), select_top_n(graph, n).in_graph)
    greedy = mib_selector(graph.layout, greedy=True)
    assert torch.equal(greedy(graph.scores, 20), select_greedy(graph, 20).in_graph)
