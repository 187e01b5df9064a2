"""patching.edges.acdc: batched speculative ACDC equals the plain edge-by-edge loop over dense masks, each mask run
by evaluate_circuit on its own (experiments.bench_circuits.acdc_arm.plain_acdc, which the benchmark times it
against); bad settings are refused."""

from __future__ import annotations

import pytest
import torch

from circuits.errors import InputError
from circuits.graph import GraphLayout
from circuits.tasks import make_dataset
from patching import SweepOptions
from patching.edges.acdc import ACDCConfig, acdc
from experiments.bench_circuits.acdc_arm import plain_acdc
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(style="gemma", n_layers=2, n_heads=2, seed=3)
    data = make_dataset(model, n_prompts=6, n_shots=1, template_ids=["add-equation-0"], seed=1)
    return model, data


@pytest.mark.parametrize("objective,threshold", [("kl", 0.003), ("metric", 0.0)])
def test_batched_acdc_equals_the_plain_edge_by_edge_loop(setup, objective, threshold):
    model, data = setup
    mask, damages, final = plain_acdc(model, data, threshold, objective)
    partial, partial_damages, _ = plain_acdc(model, data, threshold, objective, n_receivers=3)
    assert 0 < int(mask.sum()) < GraphLayout.of(model).n_edges  # the threshold both keeps and removes edges
    # the third setting's memory budget is so small that every circuit's KL is taken on its own
    circuits_run = {}
    for batch_edges, adaptive, from_receiver_layer, memory_mb in (
            (True, True, True, None), (True, False, True, None), (True, True, False, None), (True, True, True, 1e-4),
            (False, True, True, None)):
        config = ACDCConfig(threshold=threshold, objective=objective, batch_edges=batch_edges, max_batch=7,
                            adaptive_batch=adaptive, from_receiver_layer=from_receiver_layer)
        found = acdc(model, data, config=config, options=SweepOptions(metric="logit", memory_mb=memory_mb))
        assert torch.equal(found.graph.in_graph, mask)
        ours = torch.tensor([float(found.graph.scores[e]) for e in damages], dtype=torch.float64)
        torch.testing.assert_close(ours, torch.tensor(list(damages.values()), dtype=torch.float64),
                                   atol=2e-5, rtol=1e-4)
        assert found.n_tested == len(damages) == GraphLayout.of(model).n_edges
        assert found.objective_kept == pytest.approx(final, abs=1e-5)
        kept = found.graph.in_graph
        assert bool((found.graph.scores[kept] >= threshold).all())
        circuits_run[batch_edges, adaptive] = found.n_circuits_run
    assert found.n_circuits_run == found.n_tested  # one circuit per forward: nothing speculated
    # batches sized to the runs of removals speculate less than fixed ones wherever a batch's tail was dropped
    assert circuits_run[True, True] < circuits_run[True, False]
    first = acdc(model, data, config=ACDCConfig(threshold=threshold, objective=objective, max_receivers=3))
    assert torch.equal(first.graph.in_graph, partial) and first.n_tested == len(partial_damages)


def test_bad_acdc_settings_are_refused():
    with pytest.raises(InputError, match="Unknown ACDC objective 'loss'"):
        ACDCConfig(objective="loss")
    with pytest.raises(InputError, match="Unknown ablation 'noise' for ACDC"):
        ACDCConfig(ablation="noise")
    with pytest.raises(InputError, match=r"threshold must be a finite number >= 0 .*got 'high'\.$"):
        ACDCConfig(threshold="high")
    with pytest.raises(InputError, match="max_batch must be a positive integer, got 0"):
        ACDCConfig(max_batch=0)
    with pytest.raises(InputError, match="adaptive_batch must be True or False, got 'yes'"):
        ACDCConfig(adaptive_batch="yes")
    with pytest.raises(InputError, match="max_receivers must be a positive integer or None"):
        ACDCConfig(max_receivers=0)


def test_forwards_from_a_layer_refuse_circuits_ablated_below_it(setup):
    from patching.edges.engine import edge_mode
    from patching.edges.evaluate import circuit_end_residuals, prepare_group
    from patching.sweeps import inputs

    model, data = setup
    layout = GraphLayout.of(model)
    mask = layout.real_edge_mask.clone()
    mask[0, layout.head_backward(0, 1, "k")] = False  # an edge into layer 0
    group = inputs.prompt_groups(model, data, None, batch_size=len(data))[0]
    with edge_mode(model):
        prepared = prepare_group(model, layout, group, "counterfactual", None, True, "frozen")
        with pytest.raises(InputError, match="Forwards from layer 1 need every receiver below it intact"):
            next(circuit_end_residuals(model, layout, mask[None], prepared, 512.0, from_layer=1))
