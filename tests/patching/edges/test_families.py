"""patching.edges.families: each prompt family's circuit on every family, against its own curve, Jaccard against sets,
a data-independent method whose circuits coincide, unknown families refused."""

from __future__ import annotations

import pytest
import torch

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import mib_selector, select_fraction
from circuits.tasks import TaskConfig
from patching.edges.catalogue import CircuitMethod
from patching.edges.circuit_methods import MethodScores
from patching.edges.curves import faithfulness_curve
from patching.edges.faithful_circuit import CircuitSearch
from patching.sweeps.options import SweepOptions
from patching.edges.families import FAMILIES, check_families, family_circuits, family_prompts

SEARCH = CircuitSearch(circuit_prompts=4, n_bootstrap=50, ig_steps=2, sweep=SweepOptions(batch_size=8, memory_mb=1024.0))
FRACTION = 0.2
QUIET = dict(log=lambda line: None)


@pytest.fixture(scope="module")
def setup(one_length_prompts):
    model, _ = one_length_prompts
    prompts = family_prompts(model, ["equation", "question", "zero_shot"], TaskConfig(n_prompts=6, n_shots=1, seed=4))
    return model, prompts


@pytest.fixture(scope="module")
def eap(setup):
    model, prompts = setup
    return family_circuits(model, prompts, "EAP", SEARCH, fraction=FRACTION, **QUIET)


def _edges(graph: Graph) -> set[tuple[int, int]]:
    return {tuple(e) for e in graph.in_graph.nonzero().tolist()}


def test_family_prompts_are_of_their_style_or_format(setup):
    _, prompts = setup
    assert list(prompts) == ["equation", "question", "zero_shot"] and all(len(p) == 6 for p in prompts.values())
    assert all("-equation-" in t for t in prompts["equation"]["template_id"])
    assert all("-question-" in t for t in prompts["question"]["template_id"])


def test_a_circuit_on_its_own_family_is_its_own_curves_point(setup, eap):
    model, _ = setup
    layout = GraphLayout.of(model)
    for name in eap.families:
        assert _edges(eap.circuits[name]) == _edges(select_fraction(eap.scores[name], FRACTION))
        own = faithfulness_curve(model, eap.scores[name], eap.heldout[name], fractions=[FRACTION],
                                 select=mib_selector(layout), n_bootstrap=SEARCH.n_bootstrap, seed=SEARCH.seed,
                                 options=SEARCH.options(False))
        point = eap.f(name, name)
        assert (point.value, point.low, point.high, point.n) == pytest.approx(
            (own.faithfulness[0].value, own.faithfulness[0].low, own.faithfulness[0].high, own.faithfulness[0].n))
        assert eap.jaccard(name, name) == 1.0


def test_jaccard_matches_python_sets_and_the_record_is_complete(eap):
    names = eap.families
    summary = eap.to_dict()
    for a in names:
        for b in names:
            ea, eb = _edges(eap.circuits[a]), _edges(eap.circuits[b])
            assert summary["jaccard"][a][b] == pytest.approx(len(ea & eb) / len(ea | eb))
            f = summary["f"][a][b]
            assert f["low"] <= f["value"] <= f["high"] and f["n"] == summary["n_heldout"][b] == 2
    assert summary["families"] == names and summary["fraction"] == FRACTION and summary["method"] == "EAP"
    assert summary["circuit_edges"] == {n: len(_edges(eap.circuits[n])) for n in names}
    figure = eap.figure()
    assert [t.type for t in figure.data] == ["heatmap", "heatmap"]
    assert list(figure.data[1].z[0]) == [summary["jaccard"]["equation"][b] for b in names]


def test_a_data_independent_method_has_one_circuit_for_every_family(setup):
    model, prompts = setup
    layout = GraphLayout.of(model)
    fixed = torch.rand(layout.n_forward, layout.n_backward, generator=torch.Generator().manual_seed(0))
    fixed[0, layout.logits_backward] = 10.0  # input -> logits ranks first: the circuit is never pruned away
    stub = CircuitMethod("fixed", "attribution", lambda run, _: MethodScores(Graph(layout, fixed.clone())))
    result = family_circuits(model, prompts, stub, SEARCH, fraction=FRACTION, **QUIET)
    names = result.families
    assert all(result.jaccard(a, b) == 1.0 for a in names for b in names)
    for b in names:  # the same circuit on b's prompts, whichever family found it
        assert len({result.f(a, b).value for a in names}) == 1


def test_unknown_families_and_unusable_methods_are_refused(setup, eap):
    model, prompts = setup
    with pytest.raises(InputError, match=r"Unknown prompt families \['limerick'\]: use any of equation, statement"):
        check_families(["equation", "limerick"])
    with pytest.raises(InputError, match=r"Unknown prompt families \['limerick'\]"):
        family_circuits(model, {"equation": prompts["equation"], "limerick": prompts["question"]}, "EAP", SEARCH)
    with pytest.raises(InputError, match="compare at least two families"):
        family_prompts(model, ["equation"])
    with pytest.raises(InputError, match="name one family twice"):
        check_families(["equation", "equation"])
    with pytest.raises(InputError, match="'positional' cannot be compared across prompt families"):
        family_circuits(model, prompts, "positional", SEARCH)
    with pytest.raises(InputError, match=r"fraction=0: the circuit's size is a fraction of the edges in \(0, 1\]"):
        family_circuits(model, prompts, "EAP", SEARCH, fraction=0)
    with pytest.raises(InputError, match=r"prompt_family 'statement' is not one of this result's families"):
        eap.f("equation", "statement")
    assert set(FAMILIES) >= {"equation", "statement", "question", "word_problem", "multi_digit", "decimal", "zero_shot"}
