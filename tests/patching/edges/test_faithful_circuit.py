"""patching.edges.faithful_circuit: the held-out split and the key heads a hand-made circuit holds."""

import pytest
import torch
from datasets import Dataset

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.nodes import Head
from patching.edges.faithful_circuit import key_head_relation, split_halves


def test_halves_are_disjoint_and_seeded():
    data = Dataset.from_list([{"x": i} for i in range(10)])
    a, b = split_halves(data, 8, seed=3)
    assert len(a) == len(b) == 4 and not set(a["x"]) & set(b["x"])
    assert split_halves(data, 8, seed=3)[0]["x"] == a["x"] and split_halves(data, 8, seed=4)[0]["x"] != a["x"]


def test_key_head_relation_of_a_hand_made_circuit():
    layout = GraphLayout(n_layers=2, n_heads=2)
    in_graph = torch.zeros(layout.n_forward, layout.n_backward, dtype=torch.bool)
    # input -> a0.h1<v> -> a1.h0<q> -> logits, plus input -> m1 -> logits
    in_graph[0, layout.head_backward(0, 1, "v")] = True
    in_graph[layout.head_forward(0, 1), layout.head_backward(1, 0, "q")] = True
    in_graph[layout.head_forward(1, 0), layout.logits_backward] = True
    in_graph[0, layout.mlp_backward(1)] = True
    in_graph[layout.mlp_forward(1), layout.logits_backward] = True
    graph = Graph(layout, torch.ones(layout.n_forward, layout.n_backward), in_graph)
    relation = key_head_relation(graph, [Head(0, 1), Head(1, 1)])
    assert relation["rows"][0] == {"head": "L0H1", "node": "a0.h1", "in_circuit": True, "edges_out": 1, "edges_in": 1}
    assert relation["rows"][1]["in_circuit"] is False and relation["missing"] == ["L1H1"]
    assert relation["circuit_heads_not_key"] == ["a1.h0"] and relation["n_circuit_heads"] == 2


def test_too_few_prompts_is_a_clear_error():
    from datasets import Dataset

    with pytest.raises(InputError, match="at least 4"):
        split_halves(Dataset.from_list([{"x": i} for i in range(3)]), 64, seed=0)


