"""EAP-GP (a path steered by the gradient) and CEAP (conductance along EAP-IG's path) against plain references
written here: full-sequence runs, every path point's gradient from its own autograd call."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from circuits.errors import InputError
from circuits.graph import GraphLayout
from patching import SweepOptions
from patching.edges.attribute import _gradpath, edge_attribution, straight_direction
from patching.sweeps.metrics import get_metric
from tests.patching.edges.test_attribute import (
    STYLES, _flags, close, make_model, plain_gradients, plain_outputs, plain_scores, prompts, receivers,
)

QUIET = SweepOptions(progress=False)


def replace_input(x):
    return "blocks.0.hook_resid_pre", lambda act, *, hook: x.clone().requires_grad_(True)


def embeddings(model, tokens, cf):
    with torch.no_grad():
        return model(tokens, stop_at_layer=0), model(cf, stop_at_layer=0)


def plain_gradpath(model, tokens, cf, answers, steps):
    """GradPath written out: each step down ∇½(m(x) − m(x_cf))² over the positions after the shared prefix,
    of length ‖x_cf − x‖ / steps left; returns the points reached."""
    metric = get_metric("logit")
    emb_ref, emb_cf = embeddings(model, tokens, cf)
    prefix = int((tokens != cf).any(0).nonzero()[0])

    def value_and_grad(x):
        x = x.clone().requires_grad_(True)
        logits = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_pre", lambda act, *, hook: x)])
        values = metric.fn(logits[:, -1], answers, None)
        return values.detach(), torch.autograd.grad(values.sum(), x)[0]

    with torch.no_grad():
        m_cf = metric.fn(model(cf)[:, -1], answers, None)
    x, points = emb_ref.clone(), []
    for k in range(steps):
        values, grad = value_and_grad(x)
        direction = -(values - m_cf)[:, None, None] * grad
        direction[:, :prefix] = 0
        straight = emb_cf - x
        length = straight.flatten(1).norm(dim=1)[:, None, None] / (steps - k)
        x = x + length * direction / direction.flatten(1).norm(dim=1)[:, None, None]
        points.append(x)
    return points


def test_gradpath_on_a_straight_direction_visits_eap_igs_points():
    ref, cf = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    chunk = SimpleNamespace(emb_ref=ref, emb_cf=cf)
    passes = _gradpath(straight_direction)(None, chunk, 4)
    counted, step = [], next(passes)
    while True:  # driven as edge_attribution drives it: each pass is answered with (fake) gradients
        if step.counted:
            counted.append(step.resid)
        try:
            step = passes.send((torch.randn(2, 3, 5, 4), torch.randn(2)))
        except StopIteration:
            break
    eap_ig = [cf + (k / 4) * (ref - cf) for k in range(4)]  # EAP-IG-inputs' points, k = 0 .. steps - 1
    assert len(counted) == 4
    for point, expected in zip(counted, reversed(eap_ig)):
        torch.testing.assert_close(point, expected)


@pytest.mark.parametrize("style, n_kv", STYLES)
def test_eap_gp_equals_a_plain_gradpath(style, n_kv):
    model = make_model(style, n_kv)
    tokens, cf, answers = prompts(model, seed=3)
    points = plain_gradpath(model, tokens, cf, answers, steps=3)
    ref = plain_scores(model, tokens, cf, answers, extra_hooks=[replace_input(p) for p in points])
    ours = edge_attribution(model, tokens, cf, answer_ids=answers, method="EAP-GP", ig_steps=3, options=QUIET)
    close(ours.scores, ref)
    assert ours.meta["ig_steps"] == 3
    assert not any(hp._forward_hooks or hp._backward_hooks for hp in model.hook_dict.values())


def plain_conductance(model, tokens, cf, answers, steps):
    """Σ_k ∂m/∂in_r(x_k) · (o_s(x_k) − o_s(x_{k+1})), x_k = cf + (k/steps)(ref − cf), x_steps the reference."""
    metric = get_metric("logit")
    emb_ref, emb_cf = embeddings(model, tokens, cf)
    points = [emb_cf + (k / steps) * (emb_ref - emb_cf) for k in range(steps + 1)]
    names = list(dict.fromkeys(n for n, _ in receivers(model)))
    _flags(model, True)
    try:
        outputs = []
        for p in points:
            with model.hooks(fwd_hooks=[replace_input(p)]):
                outputs.append(plain_outputs(model, tokens))
        grads = [plain_gradients(model, tokens, answers, names, metric, replace_input(p)) for p in points[:-1]]
    finally:
        _flags(model, False)
    scores = torch.zeros(outputs[0].shape[0], len(receivers(model)))
    for b, (hook, head) in enumerate(receivers(model)):
        for k in range(steps):
            grad = grads[k][hook] if head is None else grads[k][hook][:, :, head]
            scores[:, b] += torch.einsum("fbpd,bpd->f", outputs[k] - outputs[k + 1], grad) / tokens.shape[0]
    return torch.where(GraphLayout.of(model).real_edge_mask, scores, torch.nan)


@pytest.mark.parametrize("style, n_kv", STYLES)
def test_ceap_equals_plain_conductance_and_eap_ig_on_the_input(style, n_kv):
    model = make_model(style, n_kv)
    tokens, cf, answers = prompts(model, seed=4)
    ours = edge_attribution(model, tokens, cf, answer_ids=answers, method="CEAP", ig_steps=3, options=QUIET)
    close(ours.scores, plain_conductance(model, tokens, cf, answers, steps=3))
    # the input moves linearly along the path: its edges score as EAP-IG-inputs'
    eap_ig = edge_attribution(model, tokens, cf, answer_ids=answers, method="EAP-IG-inputs", ig_steps=3, options=QUIET)
    close(ours.scores[:1], eap_ig.scores[:1])


@pytest.mark.parametrize("style, n_kv", [("gpt2", None), ("llama", 2)])
def test_ceap_is_complete_over_the_edges_into_the_logits(style, n_kv):
    """The senders' outputs sum to the final residual: their conductances sum to m(cf) − m(ref), up to the
    Riemann sum's error, which shrinks with the steps."""
    model = make_model(style, n_kv)
    tokens, cf, answers = prompts(model)
    with torch.no_grad():
        gap = float((model(cf)[:, -1] - model(tokens)[:, -1]).gather(-1, answers[:, None]).mean())
    errors = []
    for steps in (4, 64):
        scores = edge_attribution(model, tokens, cf, answer_ids=answers, method="CEAP", ig_steps=steps,
                                  options=QUIET).scores
        errors.append(abs(float(scores[:, -1].sum()) - gap))
        scale = float(scores[:, -1].abs().sum())
    assert errors[1] < errors[0] / 4 and errors[1] < 0.02 * scale


def test_ceap_refuses_a_norm_that_no_run_computes():
    model = make_model("gemma", 1)
    tokens, cf, answers = prompts(model)
    with pytest.raises(InputError, match="CEAP follows each sender's output .* Use norm='frozen'"):
        edge_attribution(model, tokens, cf, answer_ids=answers, method="CEAP", norm="recompute", options=QUIET)
