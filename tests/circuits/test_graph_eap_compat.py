"""Selections and JSON files agree with hannamw/EAP-IG's own ``Graph`` (runs only where ``eap`` is importable).

EAP-IG is not a dependency: install it in a scratch place (see docs/methods.md, "Edge circuits") and put it on
PYTHONPATH to run these; CI skips them.

Cross-cutting: the compatibility contract of circuits.graph (layout), circuits.graph_selection and
circuits.graph_io with EAP-IG's Graph.
"""

from __future__ import annotations

import json

import pytest
import torch

eap_graph = pytest.importorskip("eap.graph", reason="hannamw/EAP-IG (package 'eap') is not installed; "
                                "install it in a scratch dir and add it to PYTHONPATH to compare against it")

from circuits.graph import Graph, GraphLayout  # noqa: E402
from circuits.graph_io import graph_to_eap_dict, load_eap_json, save_eap_json  # noqa: E402
from circuits.graph_selection import prune, select_greedy, select_threshold, select_top_n  # noqa: E402


def pair(n_layers=3, n_heads=2, parallel=False, seed=0):
    cfg = {"n_layers": n_layers, "n_heads": n_heads, "parallel_attn_mlp": parallel, "d_model": 8}
    theirs = eap_graph.Graph.from_model(cfg)
    layout = GraphLayout(n_layers, n_heads, parallel)
    g = torch.Generator().manual_seed(seed)
    scores = torch.where(layout.real_edge_mask, torch.randn(layout.n_forward, layout.n_backward, generator=g),
                         torch.nan)
    theirs.scores[:] = torch.nan_to_num(scores)
    ours = Graph(layout, scores, meta={"d_model": 8})
    return ours, theirs


@pytest.mark.parametrize("parallel", [False, True])
def test_layout_matches(parallel):
    ours, theirs = pair(parallel=parallel)
    assert torch.equal(ours.layout.real_edge_mask, theirs.real_edge_mask)
    assert [ours.layout.edge_name(*e.matrix_index) for e in theirs.edges.values()] == list(theirs.edges)


@pytest.mark.parametrize("seed", range(3))
def test_selections_match_eap_ig(seed):
    ours, theirs = pair(n_layers=4, n_heads=3, seed=seed)
    for n in (1, 4, 17, 60, 150):
        theirs.apply_topn(n, absolute=True)
        assert torch.equal(select_top_n(ours, n).in_graph, theirs.in_graph), f"top-n {n}"
        theirs.apply_greedy(n, absolute=True)
        assert torch.equal(select_greedy(ours, n).in_graph, theirs.in_graph), f"greedy {n}"
        theirs.apply_topn(n, absolute=False, prune=False)
        assert torch.equal(select_top_n(ours, n, absolute=False, prune=False).in_graph, theirs.in_graph)
    theirs.apply_threshold(0.8, absolute=True)
    assert torch.equal(select_threshold(ours, 0.8).in_graph, theirs.in_graph)
    g = torch.Generator().manual_seed(seed)
    random_edges = (torch.rand(theirs.in_graph.shape, generator=g) < 0.1) & theirs.real_edge_mask
    theirs.in_graph[:] = random_edges
    theirs.prune()
    assert torch.equal(prune(Graph(ours.layout, ours.scores, random_edges)).in_graph, theirs.in_graph)


def test_json_both_directions(tmp_path):
    ours, theirs = pair(n_layers=3, n_heads=2, seed=5)
    theirs.apply_topn(10, absolute=True)
    theirs.to_json(str(tmp_path / "theirs.json"))
    loaded = load_eap_json(tmp_path / "theirs.json")
    assert torch.equal(loaded.in_graph, theirs.in_graph)
    real = theirs.real_edge_mask
    assert torch.equal(loaded.scores[real], theirs.scores[real])
    # and what we write is, key for key and in the same order, what EAP-IG writes
    ours = select_top_n(ours, 10)
    assert graph_to_eap_dict(ours) == json.loads((tmp_path / "theirs.json").read_text())
    save_eap_json(ours, tmp_path / "ours.json")
    assert list(graph_to_eap_dict(ours)["edges"]) == list(json.loads((tmp_path / "theirs.json").read_text())["edges"])
    back = eap_graph.Graph.from_json(str(tmp_path / "ours.json"))
    assert torch.equal(back.in_graph, theirs.in_graph) and torch.equal(back.scores, theirs.scores)
