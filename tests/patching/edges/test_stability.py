"""patching.edges.stability: Jaccard against Python sets, stub methods whose circuits are known, too few prompts."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import spearmanr

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import edge_jaccard, select_fraction
from patching.edges.catalogue import CATALOGUE, CircuitMethod
from patching.edges.circuit_methods import MethodScores
from patching.edges.faithful_circuit import CircuitSearch
from patching.sweeps.options import SweepOptions
from patching.edges.stability import StabilityResult, circuit_stability

SEARCH = CircuitSearch(circuit_prompts=4, n_bootstrap=50, ig_steps=2, sweep=SweepOptions(batch_size=8, memory_mb=1024.0))


@pytest.fixture(scope="module")
def setup(one_length_prompts):
    model, data = one_length_prompts
    return model, data.select(range(8))


def _edges(graph: Graph) -> set[tuple[int, int]]:
    return {tuple(e) for e in graph.in_graph.nonzero().tolist()}


def test_jaccard_and_spearman_match_python_sets_and_scipy(setup):
    model, data = setup
    result = circuit_stability(model, data, "EAP", SEARCH, n_sets=3, fractions=(0.2, 0.5), log=lambda line: None)
    assert result.runs == [(0, 0), (1, 0), (2, 0)] and len(result.heldout) == 2
    real = result.scores[0].layout.real_edge_mask
    for i, x in enumerate(result.fractions):
        edge_sets = [_edges(select_fraction(scores, x)) for scores in result.scores]  # selected anew
        assert all(edge_sets)  # sizes at which the pruned circuits of the tiny model hold edges
        expected = [len(a & b) / len(a | b) for a, b in itertools.combinations(edge_sets, 2)]
        assert result.jaccard()[i] == pytest.approx(expected)
        entry = result.to_dict()["jaccard"][i]
        assert entry["n_pairs"] == 3 and entry["min"] == pytest.approx(min(expected))
        assert entry["mean"] == pytest.approx(sum(expected) / 3) and entry["max"] == pytest.approx(max(expected))
        core = {e for e in set().union(*edge_sets) if sum(e in s for s in edge_sets) >= 1.5}  # in at least half of 3
        assert _edges(result.cores[i]) == core and result.to_dict()["core"][i]["n_edges"] == len(core)
    expected = [spearmanr(a.scores[real].abs().numpy(), b.scores[real].abs().numpy())[0]
                for a, b in itertools.combinations(result.scores, 2)]
    assert result.spearman() == pytest.approx(expected)


def _stub(name: str, scorer) -> CircuitMethod:
    return CircuitMethod(name, "selection", lambda run, _: scorer(run))


def test_a_data_independent_method_has_jaccard_1_and_its_circuit_as_core(setup):
    model, data = setup
    layout = GraphLayout.of(model)
    fixed = torch.rand(layout.n_forward, layout.n_backward, generator=torch.Generator().manual_seed(0))
    fixed[0, layout.logits_backward] = 10.0  # input -> logits ranks first: no size's circuit is pruned away
    stub = CircuitMethod("fixed", "attribution", lambda run, _: MethodScores(Graph(layout, fixed.clone())))
    result = circuit_stability(model, data, stub, SEARCH, n_sets=2, fractions=(0.05, 0.2, 0.5), log=lambda line: None)
    summary = result.to_dict()
    assert [j["mean"] for j in summary["jaccard"]] == [1.0, 1.0, 1.0] and summary["spearman"]["mean"] == pytest.approx(1.0)
    for i, core in enumerate(result.cores):
        assert torch.equal(core.in_graph, result.circuits[0][i].in_graph)
        assert torch.equal(core.in_graph, result.circuits[1][i].in_graph)
    assert all(core.in_graph.any() for core in result.cores)  
    assert summary["core"][0]["f"]["n"] == 2 and summary["n_heldout"] == 2


def test_known_different_circuits_give_the_hand_computed_jaccard_and_core(setup):
    model, data = setup
    layout = GraphLayout.of(model)
    real = layout.real_edge_mask.nonzero().tolist()
    circuits = iter([real[0:3], real[1:4]])  # {e0, e1, e2} on the first set, {e1, e2, e3} on the second

    def scorer(run):
        edges = next(circuits)
        mask = torch.zeros(layout.n_forward, layout.n_backward, dtype=torch.bool)
        mask[tuple(zip(*edges))] = True
        return MethodScores(Graph(layout, torch.rand(layout.n_forward, layout.n_backward)),
                            select=lambda scores, n: mask)

    result = circuit_stability(model, data, _stub("two circuits", scorer), SEARCH, n_sets=2,
                               fractions=(0.1, 0.5), log=lambda line: None)
    summary = result.to_dict()
    assert [j["mean"] for j in summary["jaccard"]] == [0.5, 0.5]  # 2 shared of 4
    assert [c["n_edges"] for c in summary["core"]] == [2, 2]  # kept by a majority, with two runs by both: e1, e2
    assert _edges(result.cores[0]) == {tuple(real[1]), tuple(real[2])}


def test_edge_jaccard_of_empty_and_disjoint_masks():
    empty, one, other = torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.bool), \
        torch.zeros(2, 3, dtype=torch.bool)
    one[0, 0], other[1, 1] = True, True
    assert edge_jaccard(empty, empty) == 1.0 and edge_jaccard(one, other) == 0.0 and edge_jaccard(one, one) == 1.0


def test_too_few_prompts_names_how_many_are_needed(setup):
    model, data = setup
    with pytest.raises(InputError, match=r"3 disjoint prompt sets and a held-out set of 2 prompts each .* needs 8 "
                                         r"prompts, got 7"):
        circuit_stability(model, data.select(range(7)), "EAP", SEARCH, n_sets=3)


def test_methods_without_a_circuit_of_their_own_are_refused():
    for name in ("ensemble", "positional"):
        with pytest.raises(InputError, match=f"{name!r} has no circuit stability to measure"):
            circuit_stability(None, None, CATALOGUE[name])
    with pytest.raises(InputError, match=r"Unknown circuit method\(s\) \['nope'\]"):
        circuit_stability(None, None, "nope")


def test_a_seeded_method_runs_once_per_set_and_seed_and_a_deterministic_one_once_per_set(setup):
    model, data = setup
    layout = GraphLayout.of(model)
    seen = []

    def scorer(run):
        seen.append((run.search.seed, run.learn.seed))
        gen = torch.Generator().manual_seed(run.learn.seed)
        return MethodScores(Graph(layout, torch.rand(layout.n_forward, layout.n_backward, generator=gen)))

    learned = CircuitMethod("seeded", "learned mask", lambda run, _: scorer(run))
    result = circuit_stability(model, data, learned, SEARCH, n_sets=2, seeds=(1, 2), fractions=(0.5,),
                               log=lambda line: None)
    assert result.runs == [(0, 1), (0, 2), (1, 1), (1, 2)] and seen == [(1, 1), (2, 2), (1, 1), (2, 2)]
    assert result.to_dict()["jaccard"][0]["n_pairs"] == 6 and result.to_dict()["seeds"] == [1, 2]
    assert result.jaccard()[0][1] == 1.0  # set 0 seed 1 and set 1 seed 1: the same seeded scores
    deterministic = CircuitMethod("plain", "attribution", lambda run, _: scorer(run))
    assert circuit_stability(model, data, deterministic, SEARCH, n_sets=2, seeds=(1, 2), fractions=(0.5,),
                             log=lambda line: None).runs == [(0, 1), (1, 1)]


def test_the_stability_of_a_found_circuit_is_circuit_stability_with_its_first_run_given(setup):
    """stability_of_found scores only the further sets; given the first set's scores it equals circuit_stability."""
    from patching.edges.stability import disjoint_sets, stability_of_found

    model, data = setup
    search = dataclasses_replace(SEARCH, method="EAP")
    whole = circuit_stability(model, data, "EAP", search, n_sets=2).to_dict()
    first = CATALOGUE["EAP"].score(_run_on(model, disjoint_sets(data, 2, search)[0][0], search), "EAP").scores
    found = stability_of_found(model, data, first, search, n_sets=2, log=lambda line: None).to_dict()
    assert found["jaccard"] == whole["jaccard"] and found["core"] == whole["core"]
    assert found["n_sets"] == 2 and found["method"] == "EAP"


def test_the_comparisons_result_stands_for_the_first_set_and_the_rest_is_scored_as_before(setup):
    """Given compare_methods' result, only the further sets are scored, and the stability is the one scored anew."""
    from patching.edges.compare import compare_methods

    model, data = setup
    found = compare_methods(model, data, ["EAP"], SEARCH, log=lambda line: None)[0]
    whole = circuit_stability(model, data, "EAP", SEARCH, n_sets=3, log=lambda line: None).to_dict()
    scored = []

    def counted(run, name):
        scored.append(run.selection["tokens"])
        return CATALOGUE["EAP"].score(run, "EAP")

    record = CircuitMethod("EAP", "attribution", counted)
    reused = circuit_stability(model, data, record, SEARCH, n_sets=3, reuse=found, log=lambda line: None).to_dict()
    assert reused["jaccard"] == whole["jaccard"] and reused["core"] == whole["core"] and reused["runs"] == whole["runs"]
    assert len(scored) == 2 and found.found.selection["tokens"] not in scored  # sets 1 and 2 only


def test_a_reused_result_of_another_method_or_prompt_draw_is_refused(setup):
    from patching.edges.compare import compare_methods

    model, data = setup
    found = compare_methods(model, data, ["EAP"], SEARCH, log=lambda line: None)[0]
    with pytest.raises(InputError, match="reuse holds circuit method 'EAP'.s result, not 'EAP-IG-inputs'"):
        circuit_stability(model, data, "EAP-IG-inputs", SEARCH, n_sets=2, reuse=found)
    with pytest.raises(InputError, match="its selection half is not the first stability set"):
        circuit_stability(model, data, "EAP", dataclasses_replace(SEARCH, seed=SEARCH.seed + 1), n_sets=2,
                          reuse=found)


def test_comparing_fewer_than_two_runs_is_refused(setup):
    from patching.edges.stability import compare_runs

    model, data = setup
    graph = Graph.from_model(model)
    with pytest.raises(InputError, match="Stability compares at least 2 runs"):
        compare_runs(model, [(0, 0)], [graph], [[graph]], data, SEARCH, method="x", kind="given", fractions=(0.5,))


def test_a_search_refuses_methods_it_does_not_score_with(setup):
    from patching.edges.faithful_circuit import score_selection

    model, data = setup
    for name in ("ensemble", "ACDC", "exact"):
        with pytest.raises(InputError, match=f"Circuit search method {name!r} is none of EAP, "):
            score_selection(model, data, dataclasses_replace(SEARCH, method=name))


def dataclasses_replace(record, **changes):
    import dataclasses

    return dataclasses.replace(record, **changes)


def _run_on(model, prompts, search):
    from patching.edges.circuit_methods import ComparisonRun

    return ComparisonRun(model, prompts, GraphLayout.of(model), search, search.learning, search.warm_start, 10)


def test_node_jaccard_compares_the_heads_and_mlps_the_circuits_touch():
    layout = GraphLayout(n_layers=1, n_heads=2)

    def circuit(edges):
        in_graph = torch.zeros(layout.n_forward, layout.n_backward, dtype=torch.bool)
        for f, b in edges:
            in_graph[f, b] = True
        return Graph(layout, torch.ones(layout.n_forward, layout.n_backward), in_graph)

    head, mlp = layout.head_forward(0, 0), layout.mlp_forward(0)
    through_head = circuit([(0, layout.head_backward(0, 0, "q")), (head, layout.logits_backward)])
    through_mlp = circuit([(0, layout.mlp_backward(0)), (mlp, layout.logits_backward)])
    result = StabilityResult("m", "attribution", [0.5], 0.5, [(0, 0), (1, 0)], 1, None,
                             [through_head, through_mlp], [[through_head], [through_mlp]], [], None)
    # by hand: {input, a0.h0} against {input, m0}: one shared node of three
    assert result.node_jaccard() == [[pytest.approx(1 / 3)]]
    assert result.jaccard() == [[0.0]]
