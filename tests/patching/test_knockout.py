"""Mean-ablation knockout: sanity checks and curves on tiny models."""

from __future__ import annotations

import pytest
import torch

from circuits.metrics import end_logits
from circuits.nodes import Head, all_heads, all_mlps
from circuits.tasks import accuracy, iter_batches, make_dataset
from circuits.testing import tiny_model
from patching.knockout import knockout, knockout_curve, knockout_hooks, knockout_transfer, mean_activations
from patching.path_patching import path_patch


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(style="llama", n_key_value_heads=2, n_layers=2)
    data = make_dataset(model, n_prompts=16, n_shots=0, seed=4)
    # A random model gets the arithmetic wrong; score its own top-1 predictions so the base accuracy is 1.
    predicted = {}
    for b in iter_batches(data):
        for i, t in zip(b.indices, end_logits(model, b.tokens).argmax(-1).tolist()):
            predicted[i] = t
    data = data.map(lambda r, i: {"answer_token_ids": [predicted[i]]}, with_indices=True)
    return model, data


def test_nothing_knocked_out_is_base_accuracy(setup):
    model, data = setup
    assert knockout(model, data, []) == pytest.approx(accuracy(model, data)) == pytest.approx(1.0)


def test_own_means_on_one_prompt_change_nothing(setup):
    model, data = setup
    one = data.select([0])
    nodes = all_heads(model) + all_mlps(model)
    means = mean_activations(model, one, nodes, source="reference")
    batch = next(iter_batches(one))
    hooks = knockout_hooks(model, batch, one["template_id"], nodes, means)
    torch.testing.assert_close(end_logits(model, batch.tokens, fwd_hooks=hooks), end_logits(model, batch.tokens))


def test_knocking_out_everything_hurts(setup):
    model, data = setup
    assert knockout(model, data, all_heads(model) + all_mlps(model)) < 1.0


def test_curve_and_transfer(setup):
    model, data = setup
    scores = path_patch(model, data, progress=False)
    curve = knockout_curve(model, data, scores, ks=(1, 2, 4), n_seeds=2, progress=False)
    assert curve.ks == [1, 2, 4] and len(curve.effect_rank) == 3 and len(curve.random_rank) == 3
    assert curve.base_accuracy == pytest.approx(1.0)
    assert all(0 <= a <= 1 for a in curve.effect_rank + curve.random_rank)
    explicit = knockout_curve(model, data, [Head(1, 0), Head(0, 3)], ks=(1, 2), n_seeds=1, progress=False)
    assert explicit.heads == ["L1H0", "L0H3"]
    curve.transfer = knockout_transfer(model, {"same": data}, [Head(1, 0)], progress=False)
    assert set(curve.transfer["same"]) == {"n_prompts", "base", "knockout"}
    assert len(curve.figure().data) == 2 and len(curve.transfer_figure().data) == 2
    assert curve.to_dict()["ks"] == [1, 2, 4]


def test_bad_inputs(setup):
    model, data = setup
    with pytest.raises(ValueError, match="out of range"):
        knockout(model, data, [Head(9, 0)])
    with pytest.raises(ValueError, match="ks must lie"):
        knockout_curve(model, data, [Head(0, 0)], ks=(2,), progress=False)
    other = make_dataset(model, n_prompts=2, n_shots=0, template_ids=("add-question-0",))
    means = mean_activations(model, other, [Head(0, 0)])
    with pytest.raises(ValueError, match="No mean activations"):
        knockout(model, data, [Head(0, 0)], means=means)
    with pytest.raises(ValueError, match="source"):
        mean_activations(model, data, [Head(0, 0)], source="both")
