"""Faithfulness curves: CPR/CMD areas of hand-made curves, top-n selection, and the curve on a tiny gemma-style model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_io import GraphFileError
from circuits.graph_selection import select_top_n
from circuits.tasks import make_dataset, single_batch
from tests.tiny_models import tiny_model
from patching.edges.evaluate import evaluate_circuit, evaluate_circuits
from patching.edges.curves import MIB_FRACTIONS, curve_areas, faithfulness_curve, table_faithfulness
from patching import SweepOptions


def test_areas_of_hand_made_curves():
    assert curve_areas([0.0, 0.5, 1.0], [0.0, 1.0, 1.0]) == pytest.approx((0.75, 0.25))
    # f = 1 everywhere: the area is the span of x (MIB starts at 0.1%), no distance from the model
    assert curve_areas(MIB_FRACTIONS, [1.0] * 10) == pytest.approx((0.999, 0.0))
    # f = x: ∫ x dx exactly (trapezoids are exact on a line); |1 − f| = 1 − f
    cpr, cmd = curve_areas(MIB_FRACTIONS, MIB_FRACTIONS)
    assert cpr == pytest.approx((1 - 0.001**2) / 2)
    assert cmd == pytest.approx(0.999 - (1 - 0.001**2) / 2)
    # overshoot counts in CMD: f = 2 at one point
    f = [1, 1, 2, 1]
    assert curve_areas([0.1, 0.2, 0.3, 0.4], f) == pytest.approx((0.1 * (1 + 1.5 + 1.5), 0.1 * (0 + 0.5 + 0.5)))
    with pytest.raises(InputError, match="one faithfulness per fraction"):
        curve_areas([0.1, 0.2], [1.0])


def test_faithfulness_of_a_hand_made_table_is_a_ratio_of_means():
    # two prompts; columns: two circuits, full, empty. Means: 1, 3 | full 4 | empty 1 -> f = 0 and 2/3.
    table = [[2.0, 5.0, 6.0, 0.0],
             [0.0, 1.0, 2.0, 2.0]]
    assert table_faithfulness(table) == pytest.approx([0.0, 2 / 3])
    # not the mean of per-prompt ratios: the second prompt alone has full == empty
    assert table_faithfulness(table[:1]) == pytest.approx([2 / 6, 5 / 6])
    assert not np.isfinite(table_faithfulness(table[1:])).any()


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(style="gemma", n_layers=2, seed=5)
    data = make_dataset(model, n_prompts=6, n_shots=1, template_ids=["add-equation-0"], seed=2)
    layout = GraphLayout.of(model)
    scores = torch.randn(layout.n_forward, layout.n_backward, generator=torch.Generator().manual_seed(0))
    return model, data, layout, Graph(layout, scores=torch.where(layout.real_edge_mask, scores, torch.nan))


def test_curve_points_are_ratios_of_evaluated_circuits(setup):
    model, data, layout, graph = setup
    fractions = (0.05, 0.2, 0.5, 1.0)
    curve = faithfulness_curve(model, graph, data, fractions=fractions, n_bootstrap=200,
                               options=SweepOptions(progress=False))
    full = evaluate_circuit(model, layout.real_edge_mask, data).mean
    empty = evaluate_circuit(model, torch.zeros_like(layout.real_edge_mask), data).mean
    expected = []
    for x, point, n in zip(fractions, curve.faithfulness, curve.n_edges):
        assert n == int(x * layout.n_edges)
        m = evaluate_circuit(model, select_top_n(graph, n, prune=False).in_graph, data).mean
        expected.append((m - empty) / (full - empty))
        assert point.value == pytest.approx(expected[-1], rel=1e-5, abs=1e-6)
        assert point.low <= point.value <= point.high and point.n == len(data)
    assert curve.faithfulness[-1].value == pytest.approx(1.0, abs=1e-6)
    cpr, cmd = curve_areas(fractions, expected)
    assert curve.cpr.value == pytest.approx(cpr, rel=1e-5) and curve.cmd.value == pytest.approx(cmd, rel=1e-5, abs=1e-6)
    assert curve.cpr.low <= curve.cpr.value <= curve.cpr.high
    assert curve.full.value == pytest.approx(full) and curve.empty.value == pytest.approx(empty)
    d = curve.to_dict()
    assert d["n_prompts"] == len(data) and len(d["faithfulness"]) == len(fractions) and d["cpr"]["interval"] == "bootstrap"


def test_custom_selection_and_zero_ablation(setup):
    model, data, layout, graph = setup
    only_logits = torch.zeros_like(layout.real_edge_mask)
    only_logits[:, layout.logits_backward] = True
    chosen = []

    def select(scores, n):
        chosen.append(n)
        return only_logits & select_top_n(Graph(layout, scores), n, prune=False).in_graph

    curve = faithfulness_curve(model, graph.scores, data, fractions=(0.5, 1.0), select=select, ablation="zero",
                               n_bootstrap=50, options=SweepOptions(progress=False))
    assert chosen == [int(0.5 * layout.n_edges), layout.n_edges]
    assert curve.ablation == "zero" and curve.n_edges[-1] == layout.n_forward
    assert math.isfinite(curve.cpr.value)


def test_bad_fractions_are_refused(setup):
    model, data, _, graph = setup
    for bad in [(0.5, 0.2), (0.0, 1.0), (0.5, 1.5)]:
        with pytest.raises(InputError, match="fractions must increase"):
            faithfulness_curve(model, graph, data, fractions=bad, options=SweepOptions(progress=False))
    with pytest.raises(InputError, match="Scores must be"):
        faithfulness_curve(model, torch.zeros(3, 3), data, options=SweepOptions(progress=False))


def test_bootstrap_intervals_use_the_same_resamples_for_every_point(setup):
    """The top point (the full graph) is 1 in every resample, so its interval is degenerate at 1."""
    model, data, _, graph = setup
    curve = faithfulness_curve(model, graph, data, fractions=(0.1, 1.0), n_bootstrap=100,
                               options=SweepOptions(progress=False))
    top = curve.faithfulness[-1]
    assert np.isclose([top.low, top.high], 1.0, atol=1e-5).all()


def test_an_unscored_edge_is_refused_by_the_default_selection(setup):
    model, data, layout, graph = setup
    scores = graph.scores.clone()
    f, b = layout.edge_index("a0.h0->m0")
    scores[f, b] = float("nan")
    with pytest.raises(InputError, match="without a score"):
        faithfulness_curve(model, scores, data, fractions=(0.5, 1.0), n_bootstrap=20,
                           options=SweepOptions(progress=False))


def test_an_identical_counterfactual_is_refused_before_anything_runs(setup):
    """m(full) − m(∅) = 0 gave NaN faithfulness at every point and a NaN CPR."""
    model, data, _, graph = setup
    batch = single_batch(data)
    ran = []

    def evaluate(*args, **kwargs):
        ran.append(1)
        return evaluate_circuits(*args, **kwargs)

    with pytest.raises(InputError, match=r"Every counterfactual prompt is identical to its reference prompt.*m\(full\) − "
                                         r"m\(∅\) is 0 .*Pass counterfactuals that differ from the references"):
        faithfulness_curve(model, graph, batch.tokens, batch.tokens, answer_ids=batch.answer_ids, fractions=(0.5, 1.0),
                           evaluate=evaluate, options=SweepOptions(progress=False))
    assert not ran, "the circuits were evaluated before the refusal"


def test_a_zero_denominator_after_the_runs_is_refused(setup):
    """With the model and the empty circuit scoring the same (here a metric blind to the run), f is 0/0 everywhere."""
    model, data, _, graph = setup
    with pytest.raises(InputError, match=r"The model and the empty circuit score the same mean metric \(1 and 1 with "
                                         r"ablation='counterfactual'\): m\(full\) − m\(∅\) is 0"):
        faithfulness_curve(model, graph, data, fractions=(0.5, 1.0),
                           options=SweepOptions(metric=lambda lg, a, b: lg[:, 0] * 0 + 1, progress=False))


def test_a_graph_of_another_model_size_is_refused(setup):
    model, data, layout, graph = setup
    other = Graph(layout, scores=graph.scores, meta={"d_model": model.cfg.d_model * 2})  # same layers and heads
    with pytest.raises(GraphFileError, match=rf"The scores' graph is for another model: it records d_model "
                                             rf"{2 * model.cfg.d_model} \(the model has {model.cfg.d_model}\)"):
        faithfulness_curve(model, other, data, fractions=(0.5, 1.0), options=SweepOptions(progress=False))


def test_paired_differences_of_curves_on_the_same_prompts(setup):
    from patching.edges.curves import paired_curve_difference

    model, batch, layout, scores = setup
    fractions = (0.1, 0.5, 1.0)
    a = faithfulness_curve(model, scores, batch, fractions=fractions, n_bootstrap=100,
                           options=SweepOptions(progress=False))
    flipped = Graph(layout, torch.where(layout.real_edge_mask, 1 / (1 + scores.scores.abs()), torch.nan))  # reversed
    b = faithfulness_curve(model, flipped, batch, fractions=fractions, n_bootstrap=100,
                           options=SweepOptions(progress=False))
    same = paired_curve_difference(a, a, n_bootstrap=100)
    assert all(same[k]["value"] == 0 and same[k]["low"] == same[k]["high"] == 0 for k in same)
    diff = paired_curve_difference(a, b, n_bootstrap=100)
    assert diff["cpr"]["value"] == pytest.approx(a.cpr.value - b.cpr.value, abs=1e-9)
    assert diff["f@10%"]["value"] == pytest.approx(a.faithfulness[0].value - b.faithfulness[0].value, abs=1e-9)
    assert diff["cpr"]["low"] <= diff["cpr"]["value"] <= diff["cpr"]["high"]
    with pytest.raises(InputError, match="same prompts"):
        paired_curve_difference(a, faithfulness_curve(model, scores, batch, fractions=(0.5, 1.0), n_bootstrap=10,
                                                      options=SweepOptions(progress=False)))
    # the tables as results.json keeps them (lists) give the same numbers; a table of other prompts is refused
    from patching.edges.curves import paired_table_difference

    assert paired_table_difference(fractions, a.table.tolist(), b.table.tolist(), n_bootstrap=100) == diff
    with pytest.raises(InputError, match="same prompts with 5 columns"):
        paired_table_difference(fractions, a.table, b.table[:-1], n_bootstrap=10)


def test_scores_with_nothing_finite_are_refused_and_infinite_ones_warn():
    model = tiny_model(n_layers=1)
    data = make_dataset(model, n_prompts=3, n_shots=0, template_ids=("add-equation-0",), seed=2)
    layout = GraphLayout.of(model)
    hopeless = torch.where(layout.real_edge_mask, torch.inf, torch.nan)  # all tie: any top-n is arbitrary
    with pytest.raises(InputError, match="None of the .* edge scores is finite .*rescore the edges"):
        faithfulness_curve(model, hopeless, data, fractions=(0.5, 1.0), n_bootstrap=10,
                           options=SweepOptions(progress=False))
    some = torch.where(layout.real_edge_mask, torch.rand(layout.n_forward, layout.n_backward), torch.nan)
    some[tuple(layout.real_edge_mask.nonzero()[0].tolist())] = torch.inf
    with pytest.warns(UserWarning, match="1 of the .* edge scores are infinite; they rank before every finite score"):
        faithfulness_curve(model, some, data, fractions=(0.5, 1.0), n_bootstrap=10,
                           options=SweepOptions(progress=False))


def test_a_bootstrap_of_no_resamples_names_the_argument(setup):
    """It used to say 'n_resamples must be >= 1', the name of an argument faithfulness_curve does not have."""
    model, data, _, graph = setup
    with pytest.raises(InputError, match=r"n_bootstrap must be an integer >= 1, got 0"):
        faithfulness_curve(model, graph, data, n_bootstrap=0, options=SweepOptions(progress=False))
