"""patching.shift: a model against itself shows no shift; a silenced head loses its circuit mass."""

from __future__ import annotations

import copy

import pytest
import torch

from circuits.graph import Graph, GraphLayout
from circuits.nodes import Head
from patching.edges.faithful_circuit import circuit_heads
from patching.shift import ShiftSettings, circuit_shift
from tests.tiny_models import tiny_model

FAST = ShiftSettings(fractions=(0.05, 0.2, 0.5, 1.0), size=0.2, n_bootstrap=50, ig_steps=2)


@pytest.fixture(scope="module")
def setup(one_length_prompts):
    model, data = one_length_prompts
    return model, data.select(range(6))


def test_a_model_against_itself_has_the_same_circuit_everywhere(setup):
    model, data = setup
    shift = circuit_shift(model, copy.deepcopy(model), data, FAST, path_patching=False)
    assert all(j.value == 1.0 for j in shift.jaccard) and shift.spearman.value == pytest.approx(1.0)
    assert shift.edges["n_gained"] == shift.edges["n_lost"] == 0
    for a, b in zip(shift.reference_curve.faithfulness, shift.transferred_curve.faithfulness):
        assert a.value == pytest.approx(b.value, rel=1e-5, abs=1e-6)
    assert all(row["change"] == pytest.approx(0.0, abs=1e-6) for row in shift.node_mass)


def test_a_silenced_head_loses_every_edge_out_of_it(setup):
    model, data = setup
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.blocks[0].attn.W_O[1] = 0.0  # head L0H1 now adds nothing
    shift = circuit_shift(model, changed, data, FAST)
    layout = GraphLayout.of(model)
    f = layout.head_forward(0, 1)
    assert torch.all(shift.changed_scores.scores[f][layout.real_edge_mask[f]] == 0)
    assert not bool(shift.edges["changed_mask"][f].any())
    row = next(r for r in shift.node_mass if r["node"] == "a0.h1")
    assert row["reference"] > 0 and row["change"] < 0
    assert shift.path_patching["changed"]["heads"][0][1] == pytest.approx(0.0, abs=1e-6)
    assert set(shift.figures()) == {"circuit_shift", "shift_curves"}
    assert "jaccard" in shift.to_dict() and "reference_mask" not in shift.to_dict()["edges"]


def test_a_chain_of_shifts_reuses_the_previous_changed_map(setup):
    model, data = setup
    middle, last = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad():
        middle.blocks[1].attn.W_O[0] *= 0.5
        last.blocks[0].attn.W_O[2] = 0.0
    first = circuit_shift(model, middle, data, FAST)
    chained = circuit_shift(middle, last, data, FAST, reference_scores=first.changed_scores,
                            reference_map=first.changed_map)
    fresh = circuit_shift(middle, last, data, FAST, reference_scores=first.changed_scores)
    assert chained.path_patching["reference"] == first.path_patching["changed"]
    for key in ("heads_change", "mlps_change"):
        assert torch.allclose(torch.tensor(chained.path_patching[key]), torch.tensor(fresh.path_patching[key]),
                              atol=1e-6)
    other = circuit_shift(model, middle, data.select(range(3)), FAST)
    with pytest.raises(ValueError, match="reference_map .* over 3 prompts"):
        circuit_shift(middle, last, data, FAST, reference_map=other.changed_map)


def test_overlap_intervals_come_from_prompt_resamples(setup):
    model, data = setup
    shift = circuit_shift(model, copy.deepcopy(model), data, ShiftSettings(**{**FAST.__dict__, "n_resamples": 2}),
                          path_patching=False)
    assert shift.spearman.interval.startswith("95% percentile over 2") and shift.jaccard[0].low == 1.0


def test_models_of_different_shapes_are_refused(setup):
    model, data = setup
    with pytest.raises(ValueError, match="different graphs"):
        circuit_shift(model, tiny_model(style="gemma", n_layers=3, n_heads=4), data, FAST)


def test_circuit_heads_are_the_heads_with_the_most_in_circuit_score():
    layout = GraphLayout(n_layers=2, n_heads=2)
    scores = torch.where(layout.real_edge_mask, 0.0, torch.nan)
    scores[layout.head_forward(1, 0), layout.logits_backward] = 5.0  # out of L1H0
    scores[0, layout.head_backward(0, 1, "v")] = 3.0  # into L0H1
    scores[layout.head_forward(0, 1), layout.mlp_backward(0)] = 0.5  # out of L0H1
    graph = Graph(layout, scores)
    assert circuit_heads(graph, 2, fraction=0.2) == [Head(1, 0), Head(0, 1)]
    assert circuit_heads(graph, 5, fraction=0.2) == [Head(1, 0), Head(0, 1)]  # no in-circuit edge: never chosen
