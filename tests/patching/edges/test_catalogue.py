"""patching.edges.catalogue: one record per circuit method, torch-free, and what compare_methods refuses before it
runs.

The methods' numbers are checked end to end by tests/experiments/circuit/test_compare.py.
"""

import pytest

from circuits.errors import InputError
from patching.edges.attribute import EDGE_ATTRIBUTION_METHODS
from patching.edges.catalogue import (
    ATTRIBUTION_METHODS, CATALOGUE, GRADIENTS, KINDS, LEARNED_METHODS, NEEDS, SEARCH_METHODS, WARM_START,
    CircuitMethod,
)
from patching.edges.circuit_methods import MethodScores
from patching.edges.compare import compare_methods


def test_every_method_is_one_record_under_its_name():
    assert tuple(CATALOGUE) == (*ATTRIBUTION_METHODS, *LEARNED_METHODS, "exact", "ensemble", "bootstrap", "ilp",
                                "positional", "ACDC", "consensus")
    for name, method in CATALOGUE.items():
        assert method.name == name and method.kind in KINDS and set(method.needs) <= set(NEEDS) and method.source
        assert callable(method.score)  # the lazy reference resolves
    # the attribution records and the attribution engine's algorithms are the same set of names
    assert set(ATTRIBUTION_METHODS) == set(EDGE_ATTRIBUTION_METHODS) and {"EAP-GP", "CEAP"} <= set(ATTRIBUTION_METHODS)
    assert {n for n, m in CATALOGUE.items() if WARM_START in m.needs} == {*LEARNED_METHODS, "consensus"}
    assert GRADIENTS not in CATALOGUE["exact"].needs and GRADIENTS not in CATALOGUE["ensemble"].needs
    assert GRADIENTS not in CATALOGUE["ACDC"].needs
    assert [n for n, m in CATALOGUE.items() if m.position_aware] == ["positional"]
    assert [n for n, m in CATALOGUE.items() if not m.keeps_scores] == ["ilp", "positional"]
    assert SEARCH_METHODS == (*ATTRIBUTION_METHODS, *LEARNED_METHODS, "consensus")


def test_a_record_with_an_unknown_kind_need_or_reference_is_refused():
    def score(run, name):
        return MethodScores(None)

    with pytest.raises(TypeError, match="kind 'oracle' is none of"):
        CircuitMethod("new", "oracle", score)
    with pytest.raises(TypeError, match=r"needs \['a GPU'\], none of"):
        CircuitMethod("new", "attribution", score, needs=("a GPU",))
    with pytest.raises(TypeError, match="is not 'module:function'"):
        CircuitMethod("new", "attribution", "patching.edges.circuit_methods.attribution_scores")


def test_unknown_method_names_are_refused_with_the_catalogued_ones_listed():
    with pytest.raises(InputError, match=r"Unknown circuit method\(s\) \['nope'\]: use any of EAP, EAP-IG-inputs, .*"
                                         r"ilp, positional, ACDC, consensus\."):
        compare_methods(None, None, ["EAP", "nope"])  # refused before the model or the prompts are touched


@pytest.mark.parametrize("threshold", [-1.0, float("inf"), float("nan")])
def test_an_acdc_threshold_that_keeps_every_edge_or_none_is_refused(threshold):
    """τ = -1 kept every edge and τ = inf none, without a word."""
    from patching.edges.acdc import ACDCConfig
    from patching.edges.catalogue import ACDCSettings

    with pytest.raises(InputError, match="ACDC threshold must be a finite number >= 0"):
        ACDCSettings(threshold=threshold)
    with pytest.raises(InputError, match="ACDC threshold must be a finite number >= 0"):
        ACDCConfig(threshold=threshold)
