"""circuits.graph_io: EAP-IG JSON files (round trip, edge order, bad files) and MIB submission folders."""

from __future__ import annotations

import json

import pytest
import torch

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_io import (
    GraphFileError, eap_edge_order, load_eap_json, save_eap_json, write_mib_submission, MIB_SUBMISSION_PERCENTS,
)
from circuits.graph_selection import select_top_n


def scored_graph(n_layers=3, n_heads=2, parallel=False, seed=0) -> Graph:
    layout = GraphLayout(n_layers, n_heads, parallel)
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(layout.n_forward, layout.n_backward, generator=g)
    scores = torch.where(layout.real_edge_mask, scores, torch.nan)
    return Graph(layout, scores, meta={"d_model": 16})


def test_edge_order_lists_every_edge_once():
    for parallel in (False, True):
        layout = GraphLayout(3, 2, parallel)
        order = eap_edge_order(layout)
        assert len(order) == len(set(order)) == layout.n_edges
        assert all(layout.real_edge_mask[f, b] for f, b in order)


def test_eap_json_round_trip(tmp_path):
    graph = select_top_n(scored_graph(parallel=False), 9)
    path = save_eap_json(graph, tmp_path / "g.json")
    data = json.loads(path.read_text())
    assert list(data) == ["cfg", "nodes", "edges"] and data["cfg"]["d_model"] == 16
    assert len(data["edges"]) == graph.n_edges and data["nodes"]["logits"] == {"in_graph": True}
    back = load_eap_json(path)
    assert back.layout == graph.layout
    real = graph.layout.real_edge_mask
    assert torch.equal(back.scores[real], graph.scores[real].float())
    assert torch.isnan(back.scores[~real]).all()
    assert torch.equal(back.in_graph, graph.in_graph)


def test_eap_json_needs_d_model_and_rejects_bad_files(tmp_path):
    graph = scored_graph()
    graph.meta.clear()
    with pytest.raises(InputError, match="pass d_model"):
        save_eap_json(graph, tmp_path / "x.json")
    (tmp_path / "bad.json").write_text(json.dumps({"cfg": {}, "edges": {}}))
    with pytest.raises(GraphFileError, match="lacks"):
        load_eap_json(tmp_path / "bad.json")
    (tmp_path / "worse.json").write_text(json.dumps(
        {"cfg": {"n_layers": 1, "n_heads": 1, "d_model": 4}, "nodes": {}, "edges": {"m0->a0.h0<q>": {"score": 1.0}}}))
    with pytest.raises(GraphFileError, match="not an edge"):
        load_eap_json(tmp_path / "worse.json")


def test_mib_submission_folders(tmp_path):
    graph = scored_graph(n_layers=4, n_heads=4)
    folder = write_mib_submission(graph, tmp_path, "arithmetic-addition", "gemma3")
    assert folder.name == "arithmetic-addition_gemma3" and (folder / "importances.json").is_file()
    folder = write_mib_submission(graph, tmp_path / "c", "arithmetic-addition", "gemma3", mode="circuits")
    files = sorted(folder.glob("circuit_*.json"))
    assert len(files) == len(MIB_SUBMISSION_PERCENTS)
    for percent in MIB_SUBMISSION_PERCENTS:
        circuit = load_eap_json(folder / f"circuit_{percent:g}.json")
        assert circuit.n_edges_in_graph <= percent / 100 * graph.n_edges
    with pytest.raises(InputError, match="contains '_'"):
        write_mib_submission(graph, tmp_path, "arithmetic_addition", "gemma3")
