"""Mean-ablation knockout: pooled means, the fast path against the plain hooks, curves, on tiny models."""

from __future__ import annotations

import pytest
import torch

from circuits.end_logits import end_logits
from circuits.errors import InputError
from circuits.nodes import MLP, Head, all_heads, all_mlps
from circuits.pools import pool_dataset
from circuits.answer_scoring import first_token_accuracy
from circuits.tasks import iter_batches, make_dataset
from tests.tiny_models import tiny_model
from patching.node_level.knockout_curves import (
    PoolError, check_means, knockout, knockout_correct, knockout_curve, knockout_hooks, knockout_transfer,
    mean_activations, pool_means, resolve_ks,
)
from patching.node_level.path_patching import path_patch
from patching import SweepOptions


def _own_answers(model, data):
    """A random model gets the arithmetic wrong; score its own top-1 predictions so the base accuracy is 1."""
    predicted = {}
    for b in iter_batches(data):
        for i, t in zip(b.indices, end_logits(model, b.tokens).argmax(-1).tolist()):
            predicted[i] = t
    return data.map(lambda r, i: {"answer_token_ids": [predicted[i]]}, with_indices=True)


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(style="llama", n_key_value_heads=2, n_layers=2)
    data = _own_answers(model, make_dataset(model, n_prompts=12, n_shots=1, seed=4))
    means = pool_means(model, data, all_heads(model) + all_mlps(model), n_pool=120)
    return model, data, means


def test_nothing_knocked_out_is_base_accuracy(setup):
    model, data, _ = setup
    assert knockout(model, data, []) == pytest.approx(first_token_accuracy(model, data)) == pytest.approx(1.0)


def test_own_means_on_one_prompt_change_nothing(setup):
    model, data, _ = setup
    one = data.select([0])
    nodes = all_heads(model) + all_mlps(model)
    means = mean_activations(model, one, nodes, source="reference")
    batch = next(iter_batches(one))
    hooks = knockout_hooks(model, batch, one["template_id"], nodes, means)
    torch.testing.assert_close(end_logits(model, batch.tokens, fwd_hooks=hooks), end_logits(model, batch.tokens))


def test_pooled_means_exclude_evaluated_prompts(setup):
    model, data, means = setup
    pool = pool_dataset(model, data, 120)
    evaluated = set(zip(data["template_id"], data["a"], data["b"]))
    assert not evaluated & set(zip(pool["template_id"], pool["a"], pool["b"]))
    assert not means.prompts & set(data["prompt"]) and means.n_prompts == len(pool) == 120
    # the pool shares each template's few-shot prefix, so every evaluated layout is covered
    assert all(means.counts[(t, n + 1)] >= 8 for t, n in zip(data["template_id"], data["end_pos"]))
    # the default means are these pooled means, not the evaluated prompts' own
    nodes = all_heads(model)
    default = knockout_correct(model, data, [nodes], n_pool=120)
    assert torch.equal(default, knockout_correct(model, data, [nodes], means=means))
    own = mean_activations(model, data, nodes)
    with pytest.raises(PoolError, match="evaluated prompts are also in the means' pool"):
        check_means(data, own, min_pool=1)


def test_one_prompt_layout_is_refused(setup):
    model, data, _ = setup
    row = data.select([0])
    pool = pool_dataset(model, row, 1)
    means = mean_activations(model, pool, [Head(0, 0)])
    assert means.n_prompts == 1
    with pytest.raises(PoolError, match="fewer than min_pool=8 pool prompts"):
        knockout(model, row, [Head(0, 0)], means=means)


@pytest.mark.parametrize("style,kv", [("gpt2", None), ("llama", 2), ("gemma", 1)])
def test_fast_path_equals_plain_hooks(style, kv):
    model = tiny_model(style=style, n_layers=2, **({"n_key_value_heads": kv} if kv else {}))
    data = _own_answers(model, make_dataset(model, n_prompts=12, n_shots=1, seed=1))
    every = all_heads(model) + all_mlps(model)
    means = pool_means(model, data, every, n_pool=96)
    sets = [[], [Head(0, 1)], [Head(1, 0), Head(0, 3)], [MLP(1)], all_heads(model)[::2], every]
    fast = knockout_correct(model, data, sets, means=means,
                            options=SweepOptions(memory_mb=0.05))  # tiny budget: several set chunks
    plain = knockout_correct(model, data, sets, means=means, method="hooks")
    assert torch.equal(fast, plain)
    assert fast[0].all() and not fast[-1].all()  # the sets do change predictions
    batched = knockout_correct(model, data, sets, means=means, options=SweepOptions(batch_size=5, progress=False))
    assert torch.equal(batched, plain)


def test_knockout_refuses_sweep_options_it_does_not_use(setup):
    model, data, means = setup[:3]
    with pytest.raises(InputError, match=r"knockout does not use the sweep option\(s\) metric \(it uses batch_size, "
                                         r"memory_mb, progress\)"):
        knockout(model, data, [Head(0, 0)], means=means, options=SweepOptions(metric="prob"))
    with pytest.raises(InputError, match=r"knockout_curve does not use the sweep option\(s\) reuse_prefix"):
        knockout_curve(model, data, [Head(0, 0)], ks=(1,), means=means, options=SweepOptions(reuse_prefix=False))


def test_ks_as_fractions():
    assert resolve_ks((0.05, 2, 8), n_heads=72, n_ranked=72) == [2, 4, 8]
    with pytest.raises(ValueError, match="ks must lie"):
        resolve_ks((0.5,), n_heads=72, n_ranked=8)
    with pytest.raises(ValueError, match="neither a head count"):
        resolve_ks((1.5,), n_heads=72, n_ranked=72)


def test_curve_and_transfer(setup):
    model, data, means = setup
    scores = path_patch(model, data, options=SweepOptions(progress=False))
    curve = knockout_curve(model, data, scores, ks=(1, 2), means=means, options=SweepOptions(progress=False))
    assert curve.ks == [1, 2] and curve.n_seeds == 10 and curve.n_prompts == 12 and curve.n_pool == 120
    assert curve.base_accuracy == pytest.approx(1.0)
    for values, cis in ((curve.effect_rank, curve.effect_ci), (curve.random_rank, curve.random_ci)):
        assert all(lo <= v <= hi for v, (lo, hi) in zip(values, cis))
    # effect-rank at k = 1 equals knocking that head out alone
    assert curve.effect_rank[0] == pytest.approx(knockout(model, data, [scores.ranked("heads", by="neg")[0][0]], means=means))
    # the recorded random draws reproduce their per-seed accuracies
    assert [len(d) for d in curve.random_sets[1]] == [2] * 10 and len(curve.random_per_seed[1]) == 10
    draw = [Head(int(h[1:h.index("H")]), int(h[h.index("H") + 1:])) for h in curve.random_sets[1][3]]
    assert curve.random_per_seed[1][3] == pytest.approx(knockout(model, data, draw, means=means))
    assert sum(curve.random_per_seed[0]) / 10 == pytest.approx(curve.random_rank[0])
    explicit = knockout_curve(model, data, [Head(1, 0), Head(0, 3)], ks=(1, 2), n_seeds=1, means=means,
                              options=SweepOptions(progress=False))
    assert explicit.heads == ["L1H0", "L0H3"]
    curve.transfer = knockout_transfer(model, {"same": data}, [Head(1, 0)], n_pool=96,
                                       options=SweepOptions(progress=False))
    same = curve.transfer["same"]
    assert same["base"] == pytest.approx(1.0) and same["n_pool"] == 96 and same["drop"]["n"] == 12
    assert len(curve.figure().data) == 2 and len(curve.transfer_figure().data) == 2
    assert curve.figure().data[0].error_y.arrayminus is not None
    assert curve.to_dict()["ks"] == [1, 2]


def test_bad_inputs(setup):
    model, data, means = setup
    with pytest.raises(ValueError, match="out of range"):
        knockout(model, data, [Head(9, 0)], means=means)
    with pytest.raises(ValueError, match="ks must lie"):
        knockout_curve(model, data, [Head(0, 0)], ks=(2,), means=means, options=SweepOptions(progress=False))
    other = make_dataset(model, n_prompts=2, n_shots=0, template_ids=("add-question-0",))
    with pytest.raises(PoolError, match="No mean activations"):
        knockout(model, data, [Head(0, 0)], means=mean_activations(model, other, [Head(0, 0)]))
    with pytest.raises(ValueError, match="source"):
        mean_activations(model, data, [Head(0, 0)], source="both")
    with pytest.raises(ValueError, match="Unknown knockout method"):
        knockout(model, data, [Head(0, 0)], means=means, method="fast")


def test_knockout_refuses_nan_weights_and_prompts_beyond_the_context():
    from circuits.errors import InputError

    model = tiny_model(n_layers=1)
    data = make_dataset(model, n_prompts=4, n_shots=1, seed=3)
    broken = tiny_model(n_layers=1)
    with torch.no_grad():
        broken.unembed.b_U[0] = float("nan")  # gave base accuracy 0 and effects 0, silently
    with pytest.raises(InputError, match=r"NaN or Inf weights in 1 tensors \(unembed\.b_U\)"):
        knockout_curve(broken, data, [Head(0, 0)], ks=[1], n_seeds=1, n_pool=8, min_pool=1,
                       options=SweepOptions(progress=False))
    short = tiny_model(n_layers=1, n_ctx=8)  # gave a raw size-mismatch RuntimeError
    with pytest.raises(InputError, match=r"longer than the model's context \(8 positions\)"):
        knockout_curve(short, data, [Head(0, 0)], ks=[1], n_seeds=1, n_pool=8, min_pool=1,
                       options=SweepOptions(progress=False))
