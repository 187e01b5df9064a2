"""Path patching: the END-only fast path against a plain reference written here, input forms, errors."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import utils as tl_utils

from circuits.end_logits import end_logits
from circuits.nodes import MLP, Head, all_nodes
from circuits.tasks import make_dataset, single_batch
from tests.tiny_models import tiny_model
from patching.path_patching import path_patch
from patching.head_ranking import key_heads

STYLES = [("gpt2", None), ("llama", 2), ("gemma", None)]


@pytest.fixture(scope="module", params=STYLES, ids=[s for s, _ in STYLES])
def setup(request):
    style, kv = request.param
    model = tiny_model(style=style, n_key_value_heads=kv, n_layers=3)
    data = make_dataset(model, n_prompts=10, n_shots=0, seed=1)
    return model, data


def plain_path_patch(model, tokens, cf_tokens, answers, sender, freeze_mlps):
    """One forward per sender: freeze every head's z (and MLP outputs) to the reference, sender from the counterfactual."""
    _, ref = model.run_with_cache(tokens)
    _, cf = model.run_with_cache(cf_tokens)

    def z_hook(z, *, hook):
        z = ref[hook.name].clone()
        if isinstance(sender, Head) and hook.name == sender.hook_name:
            z[:, :, sender.head] = cf[hook.name][:, :, sender.head]
        return z

    def mlp_hook(out, *, hook):
        if hook.name == sender.hook_name:
            return cf[hook.name]
        return ref[hook.name] if freeze_mlps else out

    hooks = [(tl_utils.get_act_name("z", l), z_hook) for l in range(model.cfg.n_layers)]
    hooks += [(tl_utils.get_act_name("mlp_out", l), mlp_hook) for l in range(model.cfg.n_layers)]
    rows = torch.arange(len(answers))
    patched = model.run_with_hooks(tokens, fwd_hooks=hooks)[rows, -1, answers]
    base = model(tokens)[rows, -1, answers]
    return float((patched - base).mean())


@pytest.mark.parametrize("freeze_mlps", [False, True])
def test_fast_path_equals_plain_reference(setup, freeze_mlps):
    model, data = setup
    result = path_patch(model, data, freeze_mlps=freeze_mlps, progress=False)
    groups = {}
    for i, n in enumerate(data["end_pos"]):
        groups.setdefault(n, []).append(i)
    for node in all_nodes(model):
        total = 0.0
        for idx in groups.values():
            b = single_batch(data.select(idx))
            total += plain_path_patch(model, b.tokens, b.cf_tokens, b.answer_ids, node, freeze_mlps) * len(idx)
        assert result.score(node) == pytest.approx(total / len(data), abs=1e-5), node
    assert result.heads.abs().max() > 1e-4  # the test can fail: effects are not all zero


def test_hooks_method_equals_fast(setup):
    model, data = setup
    fast = path_patch(model, data, progress=False)
    slow = path_patch(model, data, method="hooks", progress=False)
    torch.testing.assert_close(fast.heads, slow.heads, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.mlps, slow.mlps, atol=1e-5, rtol=0)


def test_input_forms_agree():
    model = tiny_model(style="gemma", n_layers=2)
    data = make_dataset(model, n_prompts=6, n_shots=0, template_ids=("add-equation-0",))
    b = single_batch(data)
    from_ds = path_patch(model, data, progress=False)
    from_batch = path_patch(model, b, progress=False)
    from_tensors = path_patch(model, b.tokens, b.cf_tokens, answer_ids=b.answer_ids, progress=False)
    chunked = path_patch(model, b.tokens, b.cf_tokens, answer_ids=b.answer_ids, batch_size=4, progress=False)
    for other in (from_batch, from_tensors, chunked):
        torch.testing.assert_close(from_ds.heads, other.heads, atol=1e-6, rtol=0)
    assert from_ds.baseline == pytest.approx(float(end_logits(model, b.tokens).gather(1, b.answer_ids[:, None]).mean()), abs=1e-5)


def test_receiver_heads_two_step():
    model = tiny_model(style="llama", n_key_value_heads=2, n_layers=3)
    data = make_dataset(model, n_prompts=4, n_shots=0, template_ids=("add-equation-0",))
    receivers = [Head(2, 1)]
    senders = [Head(0, 0), MLP(1), Head(2, 0)]
    res = path_patch(model, data, senders=senders, receivers=receivers, progress=False)
    assert res.info["computation"] == "hooks"
    assert res.score(Head(2, 0)) == pytest.approx(0.0, abs=1e-6)  # same layer as the receiver: no path
    assert abs(res.score(Head(0, 0))) > 1e-6
    only_v = path_patch(model, data, senders=senders, receivers=receivers, receiver_input="v", progress=False)
    assert only_v.score(Head(0, 0)) != pytest.approx(res.score(Head(0, 0)), abs=1e-7)


def test_metrics_and_custom_callable():
    model = tiny_model(style="gpt2", n_layers=2)
    data = make_dataset(model, n_prompts=4, n_shots=0)
    logit = path_patch(model, data, metric="logit", progress=False)
    custom = path_patch(model, data, metric=lambda lg, a, alt: lg.gather(-1, a[:, None])[:, 0], progress=False)
    torch.testing.assert_close(logit.heads, custom.heads, atol=1e-5, rtol=0)
    diff = path_patch(model, data, metric="logit_diff", alt_ids=5, progress=False)
    assert diff.metric == "logit_diff"
    prob = path_patch(model, data, metric="prob", senders=[Head(1, 0)], progress=False)
    assert torch.isnan(prob.heads[0]).all() and not torch.isnan(prob.heads[1, 0])


def test_result_ranking_key_heads_figure_json():
    model = tiny_model(style="gemma", n_layers=2)
    res = path_patch(model, make_dataset(model, n_prompts=4, n_shots=0), progress=False)
    ranked = res.ranked("heads", by="neg")
    assert [v for _, v in ranked] == sorted(v for _, v in ranked)
    heads, fraction = key_heads(res, top_k=3)
    assert len(heads) == 3 and fraction == pytest.approx(3 / 8)
    heads, _ = key_heads(res, threshold=0.0, by="neg")
    assert all(res.score(h) <= 0 for h in heads)
    d = res.to_dict()
    assert len(d["heads"]) == 2 and len(d["mlps"]) == 2 and d["ranked"]
    fig = res.figure()
    assert len(fig.data) == 2


def test_percentages_with_a_zero_reference():
    """A reference metric averaging ~0 (e.g. logit_diff) has no meaningful % of it."""
    import dataclasses

    import torch

    model = tiny_model(style="gemma", n_layers=2)
    res = path_patch(model, make_dataset(model, n_prompts=4, n_shots=0), progress=False)
    torch.testing.assert_close(res.heads_percent, 100 * res.heads / abs(res.baseline))
    zero = dataclasses.replace(res, baseline=0.0)
    assert torch.isnan(zero.heads_percent).all() and torch.isnan(zero.mlps_percent).all()
    with pytest.raises(ValueError, match="top_k"):
        key_heads(zero, threshold=5.0)
    assert len(key_heads(zero, top_k=2)[0]) == 2
    assert "%" not in zero.figure().layout.title.text  # falls back to absolute effects


def test_bad_inputs():
    model = tiny_model(style="gpt2", n_layers=2)
    data = make_dataset(model, n_prompts=4, n_shots=0, template_ids=("add-equation-0",))
    b = single_batch(data)
    with pytest.raises(ValueError, match="same shape"):
        path_patch(model, b.tokens, b.cf_tokens[:, :-1], answer_ids=b.answer_ids, progress=False)
    with pytest.raises(ValueError, match="out of range"):
        path_patch(model, data, senders=[Head(5, 0)], progress=False)
    with pytest.raises(ValueError, match="out of range"):
        path_patch(model, data, senders=[Head(0, 9)], progress=False)
    with pytest.raises(ValueError, match="Unknown metric"):
        path_patch(model, data, metric="accuracy", progress=False)
    with pytest.raises(ValueError, match="alt_ids"):
        path_patch(model, data, metric="logit_diff", progress=False)
    with pytest.raises(ValueError, match="answer_ids"):
        path_patch(model, b.tokens, b.cf_tokens, progress=False)
    with pytest.raises(ValueError, match="receivers"):
        path_patch(model, data, receivers="resid", progress=False)
    with pytest.raises(ValueError, match="one id per prompt"):
        path_patch(model, b.tokens, b.cf_tokens, answer_ids=b.answer_ids[:2], progress=False)
