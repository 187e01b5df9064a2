"""circuits.nodes: heads and MLPs by name, their hook points, and the checks against a model."""

import pytest

from circuits.errors import InputError
from circuits.nodes import MLP, Head, all_heads, all_mlps, all_nodes, parse_node, validate_nodes
from tests.tiny_models import tiny_model


def test_names_round_trip_and_sort_layer_major():
    nodes = [Head(3, 1), MLP(5), Head(0, 12)]
    assert [str(n) for n in nodes] == ["L3H1", "MLP5", "L0H12"]
    assert [parse_node(str(n)) for n in nodes] == nodes and parse_node(" l2h0 ") == Head(2, 0)
    assert sorted([Head(1, 0), Head(0, 3), Head(0, 1)]) == [Head(0, 1), Head(0, 3), Head(1, 0)]
    for bad in ("H3", "L3", "MLPx", "L1H"):
        with pytest.raises(InputError, match="Cannot parse node"):
            parse_node(bad)


def test_every_node_has_its_hook_point_on_the_model():
    model = tiny_model(style="llama", n_layers=2, n_key_value_heads=2)
    nodes = all_nodes(model)
    assert nodes == all_heads(model) + all_mlps(model) and len(nodes) == 2 * 4 + 2
    assert all(n.hook_name in model.hook_dict for n in nodes)
    assert Head(1, 2).hook_name == "blocks.1.attn.hook_z" and MLP(0).hook_name == "blocks.0.hook_mlp_out"
    assert validate_nodes(model, iter(nodes)) == nodes
    with pytest.raises(InputError, match="head 4 is out of range"):
        validate_nodes(model, [Head(0, 4)])
    with pytest.raises(InputError, match="layer 2 is out of range"):
        validate_nodes(model, [MLP(2)])
    with pytest.raises(TypeError, match="Expected Head or MLP"):
        validate_nodes(model, ["L0H0"])
