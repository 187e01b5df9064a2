"""patching.edges.circuit_methods: one record per circuit method, and what compare_methods refuses before it runs.

The methods' numbers are checked end to end by tests/experiments/circuit/test_compare.py.
"""

import pytest

from circuits.errors import InputError
from patching.edges.attribute import EDGE_ATTRIBUTION_METHODS
from patching.edges.circuit_methods import (
    GRADIENTS, KINDS, NEEDS, REGISTRY, WARM_START, CircuitMethod, MethodScores, compare_methods,
)
from patching.edges.learn import METHODS as LEARNED_METHODS


def test_every_method_is_one_record_under_its_name():
    assert tuple(REGISTRY) == (*EDGE_ATTRIBUTION_METHODS, *LEARNED_METHODS, "exact", "ensemble", "bootstrap", "ilp",
                               "positional", "ACDC")
    for name, method in REGISTRY.items():
        assert method.name == name and method.kind in KINDS and set(method.needs) <= set(NEEDS) and method.source
    assert {n for n, m in REGISTRY.items() if m.kind == "attribution"} == set(EDGE_ATTRIBUTION_METHODS)
    assert {n for n, m in REGISTRY.items() if WARM_START in m.needs} == set(LEARNED_METHODS)
    assert GRADIENTS not in REGISTRY["exact"].needs and GRADIENTS not in REGISTRY["ensemble"].needs
    assert GRADIENTS not in REGISTRY["ACDC"].needs and {"EAP-GP", "CEAP"} <= set(EDGE_ATTRIBUTION_METHODS)
    assert [n for n, m in REGISTRY.items() if m.position_aware] == ["positional"]
    assert [n for n, m in REGISTRY.items() if not m.keeps_scores] == ["ilp", "positional"]


def test_a_record_with_an_unknown_kind_or_need_is_refused():
    def score(run, name):
        return MethodScores(None)

    with pytest.raises(TypeError, match="kind 'oracle' is none of"):
        CircuitMethod("new", "oracle", score)
    with pytest.raises(TypeError, match=r"needs \['a GPU'\], none of"):
        CircuitMethod("new", "attribution", score, needs=("a GPU",))


def test_unknown_method_names_are_refused_with_the_registered_ones_listed():
    with pytest.raises(InputError, match=r"Unknown circuit method\(s\) \['nope'\]: use any of EAP, EAP-IG-inputs, .*"
                                         r"ilp, positional, ACDC\."):
        compare_methods(None, None, ["EAP", "nope"])  # refused before the model or the prompts are touched
