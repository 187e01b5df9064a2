"""Edge attribution (EAP, EAP-IG) against a plain per-edge reference written here, on tiny random models.

The reference runs the whole sequence (no prefix cache), reads every vocabulary logit, takes
each receiver's gradient in its own backward pass, and computes each sender's output from
TransformerLens' ``hook_result`` (times ``ln1_post.w / scale`` on gemma-style models).
"""

from __future__ import annotations

import pytest
import torch

from circuits.errors import InputError
from circuits.graph import GraphLayout
from tests.tiny_models import tiny_model
from patching.edges.attribute import edge_attribution
from patching.sweeps.metrics import get_metric
from patching import SweepOptions

STYLES = [("gpt2", None), ("llama", 2), ("gemma", 1)]


def make_model(style, n_kv):
    model = tiny_model(style=style, n_layers=2, n_heads=4, n_key_value_heads=n_kv, seed=1)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():  # random norm weights, so the post-norm convention matters
        for name, p in model.named_parameters():
            if name.endswith(".w") and ("ln" in name):
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
    return model


def prompts(model, n=4, length=8, split=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    vocab = model.cfg.d_vocab
    tokens = torch.randint(1, vocab, (n, length), generator=g)
    cf = tokens.clone()
    cf[:, split:] = torch.randint(1, vocab, (n, length - split), generator=g)
    answers = torch.randint(1, vocab, (n,), generator=g)
    return tokens, cf, answers


def _flags(model, on=True):
    model.set_use_split_qkv_input(on)
    model.set_use_attn_result(on)
    model.set_use_hook_mlp_in(on)
    model.set_ungroup_grouped_query_attention(on)


@torch.no_grad()
def plain_outputs(model, tokens):
    """[n_forward, batch, pos, d_model] from hook_result / hook_mlp_out / blocks.0.hook_resid_pre."""
    _, cache = model.run_with_cache(tokens)
    outs = [cache["blocks.0.hook_resid_pre"]]
    for layer in range(model.cfg.n_layers):
        result = cache[f"blocks.{layer}.attn.hook_result"]
        if model.cfg.use_normalization_before_and_after:
            result = result * model.blocks[layer].ln1_post.w / cache[f"blocks.{layer}.ln1_post.hook_scale"][:, :, None]
        outs += [result[:, :, h] for h in range(model.cfg.n_heads)] + [cache[f"blocks.{layer}.hook_mlp_out"]]
    return torch.stack(outs)


def receivers(model):
    out = []
    for layer in range(model.cfg.n_layers):
        for x in "qkv":
            out += [(f"blocks.{layer}.hook_{x}_input", h) for h in range(model.cfg.n_heads)]
        out.append((f"blocks.{layer}.hook_mlp_in", None))
    return out + [(f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", None)]


def plain_gradients(model, tokens, answers, names, metric, extra_hook=None):
    """∂(Σ m)/∂(the named receivers' inputs), full sequence, full vocabulary, one backward."""
    store = {}

    def keep(act, *, hook):
        store[hook.name] = act
        return act

    hooks = ([extra_hook] if extra_hook else []) + [(n, keep) for n in names]
    with torch.enable_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
        value = metric.fn(logits[:, -1], answers, None).sum()
        grads = torch.autograd.grad(value, [store[n] for n in names], allow_unused=True)
    # a receiver upstream of a replaced component does not reach the metric: zero gradient
    return {n: torch.zeros_like(store[n]) if g is None else g for n, g in zip(names, grads)}


def plain_scores(model, tokens, cf, answers, metric="logit", grad_tokens=None, extra_hooks=(None,),
                 per_receiver=False):
    """With ``per_receiver``, each receiver's gradient comes from its own forward and backward."""
    metric = get_metric(metric)
    layout = GraphLayout.of(model)
    grad_tokens = tokens if grad_tokens is None else grad_tokens
    names = list(dict.fromkeys(n for n, _ in receivers(model)))
    _flags(model, True)
    try:
        diff = plain_outputs(model, cf) - plain_outputs(model, tokens)
        if not per_receiver:
            runs = [plain_gradients(model, grad_tokens, answers, names, metric, e) for e in extra_hooks]
            mean = {n: sum(r[n] for r in runs) / len(runs) for n in names}
        scores = torch.full((layout.n_forward, layout.n_backward), float("nan"))
        for b, (hook, head) in enumerate(receivers(model)):
            grad = plain_gradients(model, grad_tokens, answers, [hook], metric)[hook] if per_receiver else mean[hook]
            grad = grad if head is None else grad[:, :, head]
            for f in range(layout.n_forward):
                if layout.real_edge_mask[f, b]:
                    scores[f, b] = float((diff[f] * grad).sum()) / tokens.shape[0]
    finally:
        _flags(model, False)
    return scores


def close(ours, ref):
    real = ~torch.isnan(ref)
    assert torch.equal(~torch.isnan(ours), real)
    scale = ref[real].abs().max()
    err = (ours[real] - ref[real]).abs().max() / scale
    assert err < 1e-4, f"max relative difference {err:.2e}"


@pytest.mark.parametrize("style, n_kv", STYLES)
def test_eap_equals_plain_per_edge_reference(style, n_kv):
    model = make_model(style, n_kv)
    tokens, cf, answers = prompts(model)
    for metric in ("logit", "logprob"):
        graph = edge_attribution(model, tokens, cf, answer_ids=answers, method="EAP",
                                 options=SweepOptions(metric=metric, progress=False))
        close(graph.scores, plain_scores(model, tokens, cf, answers, metric, per_receiver=metric == "logit"))
    assert graph.meta["n_prompts"] == 4 and graph.meta["method"] == "EAP"
    assert not any(hp._forward_hooks or hp._backward_hooks for hp in model.hook_dict.values())
    assert not model.cfg.use_split_qkv_input and not model.cfg.use_hook_mlp_in


@pytest.mark.parametrize("style, n_kv", STYLES)
def test_eap_ig_inputs_follows_eap_igs_path(style, n_kv):
    """EAP-IG's k-th step runs the embeddings cf + (k/steps)(ref - cf), k = 0..steps-1 (k = 0 is the cf run)."""
    model = make_model(style, n_kv)
    tokens, cf, answers = prompts(model, seed=2)
    steps = 3
    _flags(model, True)
    with torch.no_grad():
        emb_ref, emb_cf = model(tokens, stop_at_layer=0), model(cf, stop_at_layer=0)
    _flags(model, False)

    def interpolation(k):
        return ("blocks.0.hook_resid_pre",
                lambda act, *, hook: (emb_cf + (k / steps) * (emb_ref - emb_cf)).requires_grad_(True))

    ref = plain_scores(model, tokens, cf, answers, extra_hooks=[interpolation(k) for k in range(steps)])
    ours = edge_attribution(model, tokens, cf, answer_ids=answers, method="EAP-IG-inputs", ig_steps=steps,
                            options=SweepOptions(progress=False))
    close(ours.scores, ref)
    # one step: the gradient at the counterfactual run; clean-corrupted: the mean of that and EAP's
    one = edge_attribution(model, tokens, cf, answer_ids=answers, method="EAP-IG-inputs", ig_steps=1,
                           options=SweepOptions(progress=False))
    close(one.scores, plain_scores(model, tokens, cf, answers, grad_tokens=cf))
    eap = edge_attribution(model, tokens, cf, answer_ids=answers, method="EAP", options=SweepOptions(progress=False))
    both = edge_attribution(model, tokens, cf, answer_ids=answers, method="clean-corrupted",
                            options=SweepOptions(progress=False))
    close(both.scores, (eap.scores + one.scores) / 2)


@pytest.mark.parametrize("style, n_kv", [("gpt2", None), ("gemma", 1)])
def test_eap_ig_activations_interpolates_each_component(style, n_kv):
    """The reference interpolates hook_result (as EAP-IG does); ours interpolates hook_z: the same runs."""
    model = make_model(style, n_kv)
    tokens, cf, answers = prompts(model, seed=3)
    steps = 2
    _flags(model, True)
    with torch.no_grad():
        _, c_ref = model.run_with_cache(tokens)
        _, c_cf = model.run_with_cache(cf)
    _flags(model, False)
    comps = ["blocks.0.hook_resid_pre"] + [f"blocks.{l}.{n}" for l in range(model.cfg.n_layers)
                                           for n in ("attn.hook_result", "hook_mlp_out")]
    hooks = []
    for name in comps:
        for k in range(1, steps + 1):
            mixed = (k / steps) * c_ref[name] + (1 - k / steps) * c_cf[name]
            hooks.append((name, lambda act, *, hook, mixed=mixed: mixed.clone().requires_grad_(True)))
    ref = plain_scores(model, tokens, cf, answers, extra_hooks=hooks)
    ours = edge_attribution(model, tokens, cf, answer_ids=answers, method="EAP-IG-activations", ig_steps=steps,
                            options=SweepOptions(progress=False))
    close(ours.scores, ref)


def test_node_level_sums_each_senders_edges():
    model = make_model("llama", 2)
    tokens, cf, answers = prompts(model, seed=4)
    graph = edge_attribution(model, tokens, cf, answer_ids=answers, method="EAP-IG-inputs", ig_steps=2,
                             options=SweepOptions(progress=False))
    nodes = edge_attribution(model, tokens, cf, answer_ids=answers, method="EAP-IG-inputs", ig_steps=2, level="node",
                             options=SweepOptions(progress=False))
    layout = graph.layout
    per_sender = torch.nan_to_num(graph.scores).sum(1)
    for l in range(layout.n_layers):
        assert torch.allclose(nodes.mlps[l], per_sender[layout.mlp_forward(l)], atol=1e-6)
        for h in range(layout.n_heads):
            assert torch.allclose(nodes.heads[l, h], per_sender[layout.head_forward(l, h)], atol=1e-6)
    assert nodes.method == "edge_attribution:EAP-IG-inputs" and nodes.n_prompts == 4


def test_chunking_no_shared_prefix_and_groups_give_the_same_scores():
    model = make_model("gemma", 1)
    tokens, cf, answers = prompts(model, n=6, seed=5)
    whole = edge_attribution(model, tokens, cf, answer_ids=answers, method="EAP", options=SweepOptions(progress=False))
    small = edge_attribution(model, tokens, cf, answer_ids=answers, method="EAP",
                             options=SweepOptions(memory_mb=0.01, batch_size=4, progress=False))
    close(small.scores, whole.scores)
    cf0 = cf.clone()
    cf0[:, 0] = (tokens[:, 0] % (model.cfg.d_vocab - 1)) + 1  # differs from position 0: no prefix to share
    close(edge_attribution(model, tokens, cf0, answer_ids=answers, method="EAP",
                           options=SweepOptions(progress=False)).scores,
          plain_scores(model, tokens, cf0, answers))


def test_identical_counterfactual_scores_zero_and_bad_arguments():
    model = make_model("gpt2", None)
    tokens, _, answers = prompts(model)
    graph = edge_attribution(model, tokens, tokens, answer_ids=answers, method="EAP",
                             options=SweepOptions(progress=False))
    assert torch.nan_to_num(graph.scores).abs().max() == 0
    with pytest.raises(InputError, match="Unknown method"):
        edge_attribution(model, tokens, tokens, answer_ids=answers, method="EAP-IG")
    with pytest.raises(InputError, match="level must be"):
        edge_attribution(model, tokens, tokens, answer_ids=answers, level="neuron")
    with pytest.raises(InputError, match="ig_steps must be"):
        edge_attribution(model, tokens, tokens, answer_ids=answers, ig_steps=0)


def test_a_metric_that_does_not_depend_on_the_run_is_refused():
    """A constant metric gave every edge a score of 0 (or a raw autograd RuntimeError), like a circuit of nothing."""
    model = make_model("gpt2", None)
    tokens, cf, answers = prompts(model)
    with pytest.raises(InputError, match=r"Metric 'constant' does not depend on the run \(its values do not depend on "
                                         r"the logits it is given\), so every edge would score 0"):
        edge_attribution(model, tokens, cf, answer_ids=answers, method="EAP",
                         options=SweepOptions(metric=constant, progress=False))

    def ignores_the_logits(logits, answer_ids, alt_ids):
        return logits[:, 0] * 0.0  # depends on the graph of the run, but its gradient is exactly zero

    with pytest.raises(InputError, match=r"'ignores_the_logits' does not depend on the run \(every receiver's gradient is "
                                         r"exactly zero on the first 4 prompts\).*\(e\.g\. 'logit' or 'logit_diff'\)"):
        edge_attribution(model, tokens, cf, answer_ids=answers, method="EAP-IG-inputs",
                         options=SweepOptions(metric=ignores_the_logits, progress=False))


def constant(logits, answer_ids, alt_ids):
    return torch.ones(len(answer_ids))
