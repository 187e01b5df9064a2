"""patching.edges.combine: ensembles, bootstrapped sign-stable scores and the ILP circuit, against brute force."""

from __future__ import annotations

import itertools

import pytest
import torch

from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import _pruned_edges, select_top_n
from patching.edges.combine import bootstrap_scores, ensemble, ilp_select, normalise


def _random_scores(layout: GraphLayout, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.where(layout.real_edge_mask, torch.randn(layout.real_edge_mask.shape, generator=g), torch.nan)


def test_rank_normalisation_orders_by_magnitude_and_spans_zero_to_one():
    layout = GraphLayout(n_layers=2, n_heads=2)
    scores = _random_scores(layout, 0)
    normed = normalise(layout, scores, "rank")[layout.real_edge_mask]
    magnitude = scores[layout.real_edge_mask].abs()
    assert torch.equal(torch.argsort(normed, stable=True), torch.argsort(magnitude, stable=True))
    assert float(normed.max()) == 1.0 and float(normed.min()) == pytest.approx(1 / len(normed))
    assert float(normalise(layout, scores, "scale")[layout.real_edge_mask].max()) == 1.0


@pytest.mark.parametrize("how", ["mean", "min", "max"])
@pytest.mark.parametrize("normalisation", ["rank", "scale"])
def test_an_ensemble_of_identical_rankings_is_that_ranking(how, normalisation):
    layout = GraphLayout(n_layers=2, n_heads=3)
    scores = _random_scores(layout, 1)
    combined = ensemble(layout, [scores, scores.clone(), -scores], how, normalisation)
    for n in (1, 7, 30):
        assert torch.equal(select_top_n(combined, n, prune=False).in_graph,
                           select_top_n(Graph(layout, scores), n, prune=False).in_graph)


def test_an_ensemble_mean_sits_between_min_and_max():
    layout = GraphLayout(n_layers=2, n_heads=2)
    rankings = [_random_scores(layout, s) for s in range(3)]
    lo, mid, hi = (ensemble(layout, rankings, how).scores[layout.real_edge_mask] for how in ("min", "mean", "max"))
    assert bool((lo <= mid + 1e-7).all() and (mid <= hi + 1e-7).all())


def test_bootstrap_marks_edges_whose_interval_excludes_zero():
    layout = GraphLayout(n_layers=1, n_heads=2)
    real = layout.real_edge_mask
    n_prompts = 40
    per_prompt = torch.zeros(n_prompts, *real.shape)
    g = torch.Generator().manual_seed(0)
    stable_edge, noisy_edge = real.nonzero()[0].tolist(), real.nonzero()[1].tolist()
    per_prompt[:, stable_edge[0], stable_edge[1]] = 1.0 + 0.1 * torch.randn(n_prompts, generator=g)
    per_prompt[:, noisy_edge[0], noisy_edge[1]] = torch.randn(n_prompts, generator=g) * 5  # mean ~0, wide

    def score(rows):
        return torch.where(real, per_prompt[rows].mean(0), torch.nan)

    result = bootstrap_scores(score, n_prompts, layout, n_resamples=20, seed=1)
    assert bool(result.stable[tuple(stable_edge)]) and not bool(result.stable[tuple(noisy_edge)])
    top = select_top_n(result.graph(), 1, prune=False).in_graph
    assert bool(top[tuple(stable_edge)])


def _feasible(layout: GraphLayout, mask: torch.Tensor) -> bool:
    return torch.equal(_pruned_edges(layout, mask), mask & layout.real_edge_mask)


def test_the_ilp_circuit_is_the_best_connected_edge_set_by_brute_force():
    layout = GraphLayout(n_layers=1, n_heads=2)  # 12 edges: every subset can be checked
    real = layout.real_edge_mask
    edges = real.nonzero().tolist()
    scores = _random_scores(layout, 3)
    for n in (1, 2, 3, 5):
        mask = ilp_select(layout, scores, n)
        assert int(mask.sum()) <= n and _feasible(layout, mask)
        best = 0.0
        for k in range(1, n + 1):
            for subset in itertools.combinations(edges, k):
                candidate = torch.zeros_like(real)
                for f, b in subset:
                    candidate[f, b] = True
                if _feasible(layout, candidate):
                    best = max(best, float(scores[candidate].abs().sum()))
        assert float(scores[mask].abs().sum()) == pytest.approx(best, rel=1e-6), n


def test_the_ilp_beats_or_equals_pruned_top_n_and_honours_the_positive_ratio():
    layout = GraphLayout(n_layers=3, n_heads=2)
    scores = _random_scores(layout, 4)
    for n in (3, 8, 20):
        mask = ilp_select(layout, scores, n)
        pruned = select_top_n(Graph(layout, scores), n).in_graph
        assert _feasible(layout, mask) and float(scores[mask].abs().sum()) >= float(scores[pruned].abs().sum()) - 1e-6
        ratio = ilp_select(layout, scores, n, positive_ratio=0.75)
        assert int((scores[ratio] > 0).sum()) >= int(0.75 * n)
