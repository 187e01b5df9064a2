"""The layered circuit graph: node selection, colours, input forms."""

import numpy as np
import pytest
import torch

from circuits.analyze.attention import CLASS_COLORS
from circuits.show.node_circuit import circuit_figure, top_nodes
from circuits.nodes import MLP, Head


def _effects():
    heads = torch.zeros(4, 3)
    heads[2, 1], heads[1, 0], heads[3, 2], heads[0, 0] = -0.9, -0.5, 0.7, 0.01
    mlps = torch.tensor([0.0, 0.2, -0.6, 0.4])
    return heads, mlps


def test_top_nodes_rank_orders():
    heads, mlps = _effects()
    h, m = top_nodes(heads, mlps, top_heads=2, top_mlps=1)
    assert [x for x, _ in h] == [Head(2, 1), Head(3, 2)] and m[0][0] == MLP(2)
    h, m = top_nodes(heads, mlps, top_heads=2, top_mlps=2, rank_by="negative")
    assert [x for x, _ in h] == [Head(2, 1), Head(1, 0)] and [x for x, _ in m] == [MLP(2), MLP(0)]
    with pytest.raises(ValueError, match="rank_by"):
        top_nodes(heads, mlps, rank_by="loud")


def test_figure_nodes_roles_and_edges():
    heads, mlps = _effects()
    roles = {Head(2, 1): "operand", Head(1, 0): "operator"}
    fig = circuit_figure(heads, mlps, roles, top_heads=3, top_mlps=2)
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["operand heads"].text) == ["L2H1"]
    assert by_name["operand heads"].marker.color == CLASS_COLORS["operand"]
    assert list(by_name["operator heads"].text) == ["L1H0"]
    assert list(by_name["other heads"].text) == ["L3H2"]
    assert sorted(by_name["key MLPs"].text) == ["MLP2", "MLP3"]
    assert "logits (END)" in by_name
    edges = fig.data[0]
    # L1H0 -> MLP2, MLP3, logits; L2H1 -> MLP3, logits; L3H2 -> logits; MLP2, MLP3 -> logits: 8 edges
    assert list(edges.x).count(None) == 8


def test_dict_and_numpy_inputs_agree():
    heads, mlps = _effects()
    as_dict = {Head(l, h): float(heads[l, h]) for l in range(4) for h in range(3)}
    a = top_nodes(heads.numpy(), mlps.numpy(), 3, 2)
    b = top_nodes(as_dict, {MLP(l): float(v) for l, v in enumerate(mlps)}, 3, 2)
    assert [x for x, _ in a[0]] == [x for x, _ in b[0]] and [x for x, _ in a[1]] == [x for x, _ in b[1]]
    fig = circuit_figure(heads, None, top_heads=2)
    assert "key MLPs" not in {t.name for t in fig.data}
    with pytest.raises(ValueError, match="entries"):
        circuit_figure(heads, np.zeros(7))
    with pytest.raises(ValueError, match="n_layers, n_heads"):
        circuit_figure(np.zeros(5))
