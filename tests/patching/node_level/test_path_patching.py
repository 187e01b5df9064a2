"""patching.node_level.path_patching: every sender's effect on the answer logit against an independent oracle (the reference
run rebuilt block by block in plain torch from the weights and cached activations) and, for last-layer heads,
against TransformerLens' activation patching; the two methods, input forms, receiver heads, metrics, errors."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import patching as tl_patching

from circuits.end_logits import end_logits
from circuits.nodes import MLP, Head, all_nodes
from circuits.tasks import make_dataset, single_batch
from tests.tiny_models import tiny_model
from patching.node_level.path_patching import path_patch
from patching import SweepOptions


STYLES = [("gpt2", None), ("llama", 2), ("gemma", None)]


@pytest.fixture(scope="module", params=STYLES, ids=[s for s, _ in STYLES])
def setup(request):
    style, kv = request.param
    model = tiny_model(style=style, n_key_value_heads=kv, n_layers=3)
    data = make_dataset(model, n_prompts=10, n_shots=0, seed=1)
    return model, data


# --------------------------------------------------------------------------------------- an independent oracle
#
# Path patching written out differently from patching/node_level/path_patching.py: no hooks and no forward of the model.
# The reference run is rebuilt block by block in plain torch (float64) from the model's weights and the activations
# TransformerLens cached: every head's output is frozen to its reference value (the attention block adds
# sum_h z_ref[h] @ W_O[h] + b_O, through ln1_post on gemma-style models), except the sender's, which takes its
# counterfactual value; MLPs are recomputed from the rebuilt residual stream (or frozen too, freeze_mlps); the answer
# logit is read at END.


def _norm(x, module):
    """TransformerLens' LayerNorm or RMSNorm, computed from the module's weights."""
    eps = module.cfg.eps
    kind = type(module).__name__
    if kind == "LayerNorm":
        x = x - x.mean(-1, keepdim=True)
        return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * module.w.double() + module.b.double()
    if kind == "RMSNorm":
        return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * module.w.double()
    raise NotImplementedError(f"no plain version of {kind}")


ACTIVATIONS = {
    "gelu_new": lambda x: 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3))),
    "silu": lambda x: x * torch.sigmoid(x),
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / 2**0.5)),
    "relu": lambda x: x.clamp(min=0),
}


def _mlp(x, mlp, cfg):
    act = ACTIVATIONS[cfg.act_fn]
    if cfg.gated_mlp:  # TransformerLens' gated MLP adds b_in after the gate
        hidden = act(x @ mlp.W_gate.double()) * (x @ mlp.W_in.double()) + mlp.b_in.double()
    else:
        hidden = act(x @ mlp.W_in.double() + mlp.b_in.double())
    return hidden @ mlp.W_out.double() + mlp.b_out.double()


def rebuilt_logits(model, ref, cf, sender=None, freeze_mlps=False):
    """Logits ``[batch, pos, vocab]`` of the reference run rebuilt with every head frozen to ``ref`` (run_with_cache of
    the reference prompts), the sender (a Head or MLP, or None) taking its value from ``cf`` (the counterfactual's)."""
    cfg = model.cfg
    assert not cfg.parallel_attn_mlp and not cfg.attn_only
    resid = ref["blocks.0.hook_resid_pre"].double()
    for layer, block in enumerate(model.blocks):
        z = ref[f"blocks.{layer}.attn.hook_z"].double().clone()  # [batch, pos, head, d_head]
        if isinstance(sender, Head) and sender.layer == layer:
            z[:, :, sender.head] = cf[f"blocks.{layer}.attn.hook_z"][:, :, sender.head].double()
        attn = torch.einsum("bphd,hdm->bpm", z, block.attn.W_O.double()) + block.attn.b_O.double()
        if cfg.use_normalization_before_and_after:
            attn = _norm(attn, block.ln1_post)
        resid = resid + attn
        if isinstance(sender, MLP) and sender.layer == layer:
            mlp = cf[f"blocks.{layer}.hook_mlp_out"].double()
        elif freeze_mlps:
            mlp = ref[f"blocks.{layer}.hook_mlp_out"].double()
        else:
            mlp = _mlp(_norm(resid, block.ln2), block.mlp, cfg)
            if cfg.use_normalization_before_and_after:
                mlp = _norm(mlp, block.ln2_post)
        resid = resid + mlp
    return _norm(resid, model.ln_final) @ model.W_U.double() + model.b_U.double()


def oracle_scores(model, data, freeze_mlps=False):
    """{node: mean over prompts of the answer logit at END, sender patched minus reference}, one group per length."""
    groups = {}
    for i, n in enumerate(data["end_pos"]):
        groups.setdefault(n, []).append(i)
    totals = {node: 0.0 for node in all_nodes(model)}
    with torch.no_grad():
        for idx in groups.values():
            batch = single_batch(data.select(idx))
            _, ref = model.run_with_cache(batch.tokens)
            _, cf = model.run_with_cache(batch.cf_tokens)
            rows = torch.arange(len(idx))
            base = rebuilt_logits(model, ref, cf)[rows, -1, batch.answer_ids]
            for node in totals:
                patched = rebuilt_logits(model, ref, cf, node, freeze_mlps)[rows, -1, batch.answer_ids]
                totals[node] += float((patched - base).sum())
    return {node: total / len(data) for node, total in totals.items()}


def test_the_rebuilt_forward_is_the_model(setup):
    """The oracle's own check: with no sender it reproduces the model's logits at every position."""
    model, data = setup
    batch = single_batch(data.select([0]))
    with torch.no_grad():
        logits, ref = model.run_with_cache(batch.tokens)
        _, cf = model.run_with_cache(batch.cf_tokens)
        torch.testing.assert_close(rebuilt_logits(model, ref, cf).float(), logits, atol=1e-4, rtol=1e-4)
        # and a head sender changes the logits only from its layer on: a head of the last layer moves END's logits
        moved = rebuilt_logits(model, ref, cf, Head(model.cfg.n_layers - 1, 0))
    assert not torch.allclose(moved[0, -1], logits[0, -1].double(), atol=1e-6)


@pytest.mark.parametrize("method", ["fast", "hooks"])
@pytest.mark.parametrize("freeze_mlps", [False, True])
def test_path_patch_equals_the_rebuilt_forward_for_every_sender(setup, freeze_mlps, method):
    model, data = setup
    assert len(set(data["end_pos"])) > 1  # several prompt lengths: the per-length groups are averaged too
    result = path_patch(model, data, receivers="logits", freeze_mlps=freeze_mlps, method=method,
                        options=SweepOptions(progress=False))
    expected = oracle_scores(model, data, freeze_mlps)
    for node, value in expected.items():
        assert result.score(node) == pytest.approx(value, rel=1e-4, abs=1e-5), node
    assert result.heads.abs().max() > 1e-4  # the test can fail: effects are not all zero


def test_last_layer_heads_equal_transformer_lens_activation_patching(setup):
    """A sender in the last layer has no later head to freeze: with MLPs recomputed, path patching it is activation
    patching its output at every position, which TransformerLens computes itself."""
    model, _ = setup
    one = make_dataset(model, n_prompts=6, n_shots=0, template_ids=("add-equation-0",), seed=2)  # one length
    batch = single_batch(one)
    rows, last = torch.arange(len(one)), model.cfg.n_layers - 1

    def metric(logits):
        return logits[rows, -1, batch.answer_ids].mean()

    with torch.no_grad():
        _, cf_cache = model.run_with_cache(batch.cf_tokens)
        theirs = tl_patching.get_act_patch_attn_head_out_all_pos(model, batch.tokens, cf_cache, metric)[last]
        theirs = theirs - metric(model(batch.tokens))
    senders = [Head(last, h) for h in range(model.cfg.n_heads)]
    ours = path_patch(model, one, senders=senders, options=SweepOptions(progress=False))
    oracle = oracle_scores(model, one)
    for sender, value in zip(senders, theirs.tolist()):
        assert ours.score(sender) == pytest.approx(value, rel=1e-4, abs=1e-5), sender
        assert oracle[sender] == pytest.approx(value, rel=1e-4, abs=1e-5), sender
    assert theirs.abs().max() > 1e-4


def test_hooks_method_equals_fast(setup):
    model, data = setup
    fast = path_patch(model, data, options=SweepOptions(progress=False))
    slow = path_patch(model, data, method="hooks", options=SweepOptions(progress=False))
    torch.testing.assert_close(fast.heads, slow.heads, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.mlps, slow.mlps, atol=1e-5, rtol=0)


def test_input_forms_agree():
    model = tiny_model(style="gemma", n_layers=2)
    data = make_dataset(model, n_prompts=6, n_shots=0, template_ids=("add-equation-0",))
    b = single_batch(data)
    from_ds = path_patch(model, data, options=SweepOptions(progress=False))
    from_batch = path_patch(model, b, options=SweepOptions(progress=False))
    from_tensors = path_patch(model, b.tokens, b.cf_tokens, answer_ids=b.answer_ids,
                              options=SweepOptions(progress=False))
    chunked = path_patch(model, b.tokens, b.cf_tokens, answer_ids=b.answer_ids,
                         options=SweepOptions(batch_size=4, progress=False))
    for other in (from_batch, from_tensors, chunked):
        torch.testing.assert_close(from_ds.heads, other.heads, atol=1e-6, rtol=0)
    assert from_ds.baseline == pytest.approx(float(end_logits(model, b.tokens).gather(1, b.answer_ids[:, None]).mean()), abs=1e-5)


def test_receiver_heads_two_step():
    model = tiny_model(style="llama", n_key_value_heads=2, n_layers=3)
    data = make_dataset(model, n_prompts=4, n_shots=0, template_ids=("add-equation-0",))
    receivers = [Head(2, 1)]
    senders = [Head(0, 0), MLP(1), Head(1, 3)]
    res = path_patch(model, data, senders=senders, receivers=receivers, options=SweepOptions(progress=False))
    assert res.info["computation"] == "hooks"
    assert abs(res.score(Head(0, 0))) > 1e-6
    by_default = path_patch(model, data, receivers=receivers,
                            options=SweepOptions(progress=False))  # only nodes that can reach layer 2
    assert torch.isnan(by_default.heads[2]).all() and not torch.isnan(by_default.heads[:2]).any()
    assert by_default.score(Head(0, 0)) == pytest.approx(res.score(Head(0, 0)), abs=1e-6)
    only_v = path_patch(model, data, senders=senders, receivers=receivers, receiver_input="v",
                        options=SweepOptions(progress=False))
    assert only_v.score(Head(0, 0)) != pytest.approx(res.score(Head(0, 0)), abs=1e-7)


def test_metrics_and_custom_callable():
    model = tiny_model(style="gpt2", n_layers=2)
    data = make_dataset(model, n_prompts=4, n_shots=0)
    logit = path_patch(model, data, options=SweepOptions(metric="logit", progress=False))
    custom = path_patch(model, data,
                        options=SweepOptions(metric=lambda lg, a, alt: lg.gather(-1, a[:, None])[:, 0], progress=False))
    torch.testing.assert_close(logit.heads, custom.heads, atol=1e-5, rtol=0)
    diff = path_patch(model, data, options=SweepOptions(metric="logit_diff", progress=False), alt_ids=5)
    assert diff.metric == "logit_diff"
    prob = path_patch(model, data, options=SweepOptions(metric="prob", progress=False), senders=[Head(1, 0)])
    assert torch.isnan(prob.heads[0]).all() and not torch.isnan(prob.heads[1, 0])


def test_bad_inputs():
    model = tiny_model(style="gpt2", n_layers=2)
    data = make_dataset(model, n_prompts=4, n_shots=0, template_ids=("add-equation-0",))
    b = single_batch(data)
    with pytest.raises(ValueError, match="same shape"):
        path_patch(model, b.tokens, b.cf_tokens[:, :-1], answer_ids=b.answer_ids, options=SweepOptions(progress=False))
    with pytest.raises(ValueError, match="out of range"):
        path_patch(model, data, senders=[Head(5, 0)], options=SweepOptions(progress=False))
    with pytest.raises(ValueError, match="out of range"):
        path_patch(model, data, senders=[Head(0, 9)], options=SweepOptions(progress=False))
    with pytest.raises(ValueError, match="Unknown metric"):
        path_patch(model, data, options=SweepOptions(metric="accuracy", progress=False))
    with pytest.raises(ValueError, match="alt_ids"):
        path_patch(model, data, options=SweepOptions(metric="logit_diff", progress=False))
    with pytest.raises(ValueError, match="answer_ids"):
        path_patch(model, b.tokens, b.cf_tokens, options=SweepOptions(progress=False))
    with pytest.raises(ValueError, match="receivers"):
        path_patch(model, data, receivers="resid", options=SweepOptions(progress=False))
    with pytest.raises(ValueError, match="one id per prompt"):
        path_patch(model, b.tokens, b.cf_tokens, answer_ids=b.answer_ids[:2], options=SweepOptions(progress=False))


@pytest.mark.integration
def test_gemma_fast_path_equals_hooks(gemma):
    """gemma-3-270m, 4 two-shot prompts (a long shared prefix, so the cached-prefix fast path is what is compared)."""
    data = make_dataset(gemma, n_prompts=4, n_shots=2, template_ids=("add-equation-0",), seed=0)
    batch = single_batch(data)
    senders = [Head(0, 1), Head(9, 2), MLP(4), MLP(gemma.cfg.n_layers - 1)]
    fast = path_patch(gemma, batch, senders=senders, options=SweepOptions(progress=False))
    slow = path_patch(gemma, batch, senders=senders, method="hooks", options=SweepOptions(progress=False))
    for node in senders:
        assert fast.score(node) == pytest.approx(slow.score(node), abs=1e-4)


def test_senders_at_or_after_the_receivers_are_refused():
    """A sender in the receiver's layer (or later) scored exactly 0: it has no path to a head's q/k/v input."""
    model = tiny_model(style="gpt2", n_layers=3)
    data = make_dataset(model, n_prompts=4, n_shots=0, template_ids=("add-equation-0",))
    with pytest.raises(ValueError, match=r"Senders \['L2H0', 'MLP2'\] come at or after the last receiver's layer 2 "
                                         r"\(L2H1\).*only from an earlier layer, so their effect is 0 by construction"):
        path_patch(model, data, senders=[Head(0, 0), Head(2, 0), MLP(2)], receivers=[Head(2, 1)],
                   options=SweepOptions(progress=False))
    with pytest.raises(ValueError, match="No senders to score"):
        path_patch(model, data, senders=[], options=SweepOptions(progress=False))


def test_tokens_outside_the_vocabulary_or_of_float_dtype_are_refused():
    """An id past the vocabulary was torch.embedding's IndexError; float tokens failed deep inside the model."""
    model = tiny_model(style="gpt2", n_layers=2)
    b = single_batch(make_dataset(model, n_prompts=4, n_shots=0, template_ids=("add-equation-0",)))
    vocab = model.cfg.d_vocab
    far = b.cf_tokens.clone()
    far[0, -1] = vocab + 7
    with pytest.raises(ValueError, match=rf"counterfactual tokens contain ids \[{vocab + 7}\] outside this model's "
                                         rf"vocabulary 0..{vocab - 1}"):
        path_patch(model, b.tokens, far, answer_ids=b.answer_ids, options=SweepOptions(progress=False))
    with pytest.raises(ValueError, match=r"reference tokens have dtype torch.float32; token ids must be an integer tensor"):
        path_patch(model, b.tokens.float(), b.cf_tokens, answer_ids=b.answer_ids, options=SweepOptions(progress=False))
    with pytest.raises(ValueError, match=r"answer_ids must be integer token ids .*got torch.float32"):
        path_patch(model, b.tokens, b.cf_tokens, answer_ids=b.answer_ids.float() + 0.5,
                   options=SweepOptions(progress=False))


def test_every_bad_argument_is_a_toolkit_error_a_command_line_shows_in_one_line():
    """These were plain ValueError / TypeError: a command line would show each as a traceback."""
    from circuits.errors import InputError, InputTypeError

    model = tiny_model(style="gpt2", n_layers=2)
    data = make_dataset(model, n_prompts=4, n_shots=0, template_ids=("add-equation-0",))
    for kwargs, message in [({"method": "slow"}, "Unknown method 'slow'"),
                            ({"receivers": "logit"}, "receivers must be 'logits'"),
                            ({"receivers": []}, "non-empty list of Head nodes"),
                            ({"receivers": [Head(1, 0)], "receiver_input": "x"}, "receiver_input must be made of")]:
        with pytest.raises(InputError, match=message):
            path_patch(model, data, options=SweepOptions(progress=False), **kwargs)
    with pytest.raises(InputTypeError, match="Expected Head or MLP nodes, got 'L0H1'.*parse_node"):
        path_patch(model, data, senders=["L0H1"], options=SweepOptions(progress=False))
    with pytest.raises(InputTypeError, match="metric must be a name"):
        path_patch(model, data, options=SweepOptions(metric=123, progress=False))


def test_a_metric_that_ignores_the_logits_warns_that_every_effect_is_zero():
    from patching.sweeps.inputs import NoEffectWarning

    model = tiny_model(n_layers=1)
    data = make_dataset(model, n_prompts=4, n_shots=0, template_ids=("add-equation-0",), seed=2)
    constant = lambda logits, answers, alts: torch.zeros(logits.shape[0])  # noqa: E731
    with pytest.warns(NoEffectWarning, match="effect is exactly 0 although the counterfactuals differ"):
        scores = path_patch(model, data, options=SweepOptions(metric=constant, progress=False))
    assert (scores.heads == 0).all()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", NoEffectWarning)
        path_patch(model, data, options=SweepOptions(progress=False))  # a metric of the logits moves: no warning
