"""circuits.graph: which sender feeds which receiver, checked against the rule written out by name; indices and names
round-trip; the sizes of gemma-3-270m's graph."""

import re

import pytest
import torch

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from tests.tiny_models import tiny_model


def _layer(name: str):
    """Layer of a node name ('input' -> -1, 'logits' -> +inf) and whether it is an MLP."""
    if name == "input":
        return -1, False
    if name == "logits":
        return float("inf"), False
    m = re.match(r"^(a|m)(\d+)", name)
    return int(m.group(2)), m.group(1) == "m"


def feeds(sender: str, receiver: str, parallel: bool) -> bool:
    """The residual-stream rule by name: a sender writes before the receiver reads."""
    (ls, s_mlp), (lr, r_mlp) = _layer(sender), _layer(receiver.split("<")[0])
    if s_mlp:
        return lr > ls
    if sender.startswith("a") and r_mlp and not parallel:
        return lr >= ls  # a layer's heads feed its own MLP
    return lr > ls


@pytest.mark.parametrize("n_layers,n_heads,parallel", [(1, 1, False), (3, 2, False), (3, 2, True), (2, 4, False)])
def test_real_edges_follow_the_residual_stream_rule(n_layers, n_heads, parallel):
    layout = GraphLayout(n_layers, n_heads, parallel)
    expected = torch.tensor([[feeds(s, r, parallel) for r in layout.backward_names] for s in layout.forward_names])
    assert torch.equal(layout.real_edge_mask, expected)
    assert layout.n_edges == int(expected.sum())
    assert len(layout.forward_names) == layout.n_forward and len(layout.backward_names) == layout.n_backward
    for f, b in layout.real_edge_mask.nonzero().tolist():
        assert layout.edge_index(layout.edge_name(f, b)) == (f, b)


def test_named_indices_and_bad_names():
    layout = GraphLayout(3, 2)
    assert layout.forward_names[layout.head_forward(2, 1)] == "a2.h1"
    assert layout.forward_names[layout.mlp_forward(0)] == "m0"
    assert layout.backward_names[layout.head_backward(1, 0, "k")] == "a1.h0<k>"
    assert layout.backward_names[layout.mlp_backward(2)] == "m2" and layout.backward_names[layout.logits_backward] == "logits"
    with pytest.raises(InputError, match="not an edge: its sender does not come before"):
        layout.edge_index("m1->a1.h0<q>")
    with pytest.raises(InputError, match="not a sender"):
        layout.edge_index("a3.h0->logits")
    with pytest.raises(InputError, match="not an edge name"):
        layout.edge_index("a0.h0 -> logits")


def test_each_receiver_belongs_to_the_node_of_its_name():
    layout = GraphLayout(3, 2)
    owner = layout.receiver_owner()
    for b, name in enumerate(layout.backward_names):
        expected = -1 if name == "logits" else layout.forward_index(name.split("<")[0])
        assert int(owner[b]) == expected, name


def test_graph_sizes_of_a_model_and_of_gemma_3_270m():
    model = tiny_model(style="gemma", n_layers=2)
    graph = Graph.from_model(model)
    assert graph.layout == GraphLayout(2, model.cfg.n_heads) and graph.n_edges == graph.layout.n_edges
    assert GraphLayout(18, 4).n_edges == 10342  # what EAP-IG counts for gemma-3-270m (docs/methods.md)
