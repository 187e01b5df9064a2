"""patching.edges.consensus: the consensus order against a by-hand count of kept edges, its runs against learned
circuits run one by one, and the method through the default search."""

import dataclasses

import pytest
import torch

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import select_top_n
from patching.edges.catalogue import CATALOGUE, ConsensusSettings
from patching.edges.circuit_methods import ComparisonRun, score_method
from patching.edges.consensus import Consensus, resample_rows
from patching.edges.faithful_circuit import CircuitSearch, find_faithful_circuit
from patching.edges.learn import DEFAULT_CIRCUIT, learn_circuit, restart_seed


def _random_runs(layout: GraphLayout, runs: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(runs, layout.n_forward, layout.n_backward, generator=generator)
    scores[:, ~layout.real_edge_mask] = float("nan")
    return scores


def test_the_order_is_the_share_of_runs_keeping_each_edge_then_the_mean_standardised_score():
    layout = GraphLayout(n_layers=2, n_heads=2)
    run_scores = _random_runs(layout, runs=5, seed=0)
    consensus = Consensus(layout, run_scores)
    real = [(f, b) for f in range(layout.n_forward) for b in range(layout.n_backward) if layout.real_edge_mask[f, b]]
    n = 6
    # by hand: each run's pruned top-n circuit, an edge's count of runs that keep it
    kept_by = [select_top_n(Graph(layout, s), n).in_graph for s in run_scores]
    count = {e: sum(bool(kept[e]) for kept in kept_by) for e in real}
    assert torch.allclose(consensus.shares(n)[tuple(zip(*real))].float(),
                          torch.tensor([count[e] / 5 for e in real]))
    # by hand: the mean over runs of each run's z-score, and the order (count, mean z) from Python's sort
    z = {e: 0.0 for e in real}
    for s in run_scores:
        values = [float(s[e]) for e in real]
        mean = sum(values) / len(values)
        sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
        for e, v in zip(real, values):
            z[e] += (v - mean) / sd / len(run_scores)
    expected = sorted(real, key=lambda e: (count[e], z[e]), reverse=True)
    ordered = consensus.ordered_scores(n)
    got = sorted(real, key=lambda e: float(ordered[e]), reverse=True)
    assert got == expected
    # the circuit is MIB's pruned top-n of that order
    assert torch.equal(consensus.select(None, n), select_top_n(Graph(layout, ordered), n).in_graph)


def test_edges_every_run_keeps_are_the_core():
    layout = GraphLayout(n_layers=2, n_heads=2)
    one = _random_runs(layout, runs=1, seed=1)
    consensus = Consensus(layout, one.repeat(3, 1, 1))  # three identical runs: every kept edge is kept by all
    split = consensus.split(0.5)
    assert split["n_contingent"] == 0 and split["n_core"] == split["n_union"] > 0


def test_resamples_are_seeded_half_samples_or_bootstraps_within_each_length():
    lengths = [5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 9]
    half = resample_rows(lengths, "half", seed=3)
    assert len(half) == len(set(half)) == 2 + 3 + 1 and half == resample_rows(lengths, "half", seed=3)
    assert sorted(lengths[i] for i in half) == [5, 5, 7, 7, 7, 9]
    assert any(resample_rows(lengths, "half", seed=s) != half for s in range(4, 8))
    boot = resample_rows(lengths, "bootstrap", seed=3)
    assert sorted(lengths[i] for i in boot) == sorted(lengths) and len(set(boot)) < len(lengths)


def test_bad_settings_are_refused():
    with pytest.raises(InputError, match="at least 1 run"):
        ConsensusSettings(runs=0)
    with pytest.raises(InputError, match="resampling 'jackknife'"):
        ConsensusSettings(resampling="jackknife")


def test_the_runs_equal_learned_circuits_run_one_by_one(one_length_prompts):
    model, data = one_length_prompts
    selection = data.select(range(8))
    learn = dataclasses.replace(DEFAULT_CIRCUIT, steps=2, batch_size=2, samples=2, fractions=(0.05, 0.2))
    search = CircuitSearch(method="consensus", learning=learn, warm_start="EAP", ig_steps=1,
                           method_settings=(ConsensusSettings(runs=2),))
    run = ComparisonRun(model, selection, Graph.from_model(model).layout, search, learn, "EAP", 0)
    scored, _ = score_method(run, CATALOGUE["consensus"])
    warm = run.computed["EAP"]
    by_hand = []
    for k in range(2):
        seed = restart_seed(learn.seed, k)
        rows = resample_rows([len(t) for t in selection["tokens"]], "half", seed)
        alone = dataclasses.replace(learn, seed=seed, length_seed=learn.seed)  # one stream of lengths for all runs
        by_hand.append(learn_circuit(model, selection.select(rows), config=alone, init=warm,
                                     progress=False).graph.scores)
    expected = Consensus(run.layout, torch.stack(by_hand))
    assert torch.equal(scored.scores.scores.nan_to_num(-1), expected.graph().scores.nan_to_num(-1))
    assert scored.info["consensus"]["runs"] == 2 and scored.info["consensus"]["seconds"] > 0


def test_the_default_search_curves_the_consensus_circuits(one_length_prompts):
    model, data = one_length_prompts
    learn = dataclasses.replace(DEFAULT_CIRCUIT, steps=2, batch_size=2, samples=2, fractions=(0.05, 0.2))
    search = CircuitSearch(method="consensus", circuit_prompts=16, learning=learn, warm_start="EAP", ig_steps=1,
                           n_bootstrap=50, method_settings=(ConsensusSettings(runs=2),))
    found = find_faithful_circuit(model, data, search)
    assert found.extra["consensus"]["runs"] == 2
    curve = found.curve_heldout
    assert curve.n_edges[-1] == found.scores.layout.n_edges and len(curve.faithfulness) == len(curve.fractions)
