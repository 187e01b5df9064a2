"""Frequency filter, subspace patching and neuron knockout against hand-written hooks on a tiny model."""

import math

import pytest
import torch

from circuits.errors import InputError
from circuits.end_logits import unembed_end
from circuits.analyze.number_geometry import fit_helix, orthonormal_columns
from circuits.analyze.number_tokens import arithmetic_activations, arithmetic_prompts
from tests.tiny_models import tiny_model
from patching.node_level.number_interventions import (
    evaluate_end,
    fourier_filter,
    fraction_moved,
    frequency_band,
    frequency_filter_edit,
    neuron_attribution,
    neuron_knockout_edit,
    subspace_patch_edit,
    top_neurons,
)

HOOK = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def model():
    return tiny_model(style="gemma", n_layers=2)


@pytest.fixture(scope="module")
def pairs(model):
    clean = arithmetic_prompts(model, [(a, 3) for a in range(10, 22)])
    cf = arithmetic_prompts(model, [(a + 37, 3) for a in range(10, 22)])
    return clean, cf


def _logits_by_hand(model, tokens, hook_fn):
    with torch.no_grad():
        resid = model.run_with_hooks(torch.tensor([tokens]), fwd_hooks=[(HOOK, hook_fn)],
                                     stop_at_layer=model.cfg.n_layers)[:, -1]
        return unembed_end(model, resid)[0]


def test_subspace_patch_equals_patching_the_subspace_by_hand(model, pairs):
    clean, cf = pairs
    cf_rows = arithmetic_activations(model, cf, [(0, "resid_post")])[(0, "resid_post")]
    basis = orthonormal_columns(torch.randn(model.cfg.d_model, 3, generator=torch.Generator().manual_seed(0)))
    answers = [r["answer_token_ids"][0] for r in clean.rows]
    alts = [r["answer_token_ids"][0] for r in cf.rows]
    patched = evaluate_end(model, clean.tokens(), answers, alt_ids=alts, edit=subspace_patch_edit(HOOK, cf_rows, basis))
    q = basis.float()
    for i, row in enumerate(clean.rows):
        def by_hand(act, *, hook):
            act = act.clone()
            act[0, -1] = act[0, -1] + (cf_rows[i] - act[0, -1]) @ q @ q.T
            return act
        logits = _logits_by_hand(model, row["tokens"], by_hand)
        expected = logits[answers[i]] - logits[alts[i]]
        assert abs(float(patched["logit_diff"][i]) - float(expected)) < 1e-4


def test_whole_layer_patch_at_the_last_layer_gives_the_counterfactual_logits(model, pairs):
    clean, cf = pairs
    last = (model.cfg.n_layers - 1, "resid_post")
    cf_rows = arithmetic_activations(model, cf, [last])[last]
    answers = [r["answer_token_ids"][0] for r in clean.rows]
    alts = [r["answer_token_ids"][0] for r in cf.rows]
    name = f"blocks.{last[0]}.hook_resid_post"
    base_clean = evaluate_end(model, clean.tokens(), answers, alt_ids=alts)["logit_diff"]
    base_cf = evaluate_end(model, cf.tokens(), answers, alt_ids=alts)["logit_diff"]
    whole = evaluate_end(model, clean.tokens(), answers, alt_ids=alts, edit=subspace_patch_edit(name, cf_rows, None))
    torch.testing.assert_close(whole["logit_diff"], base_cf, rtol=1e-4, atol=1e-4)
    empty = torch.zeros(model.cfg.d_model, 0)  # an empty subspace changes nothing
    none = evaluate_end(model, clean.tokens(), answers, alt_ids=alts, edit=subspace_patch_edit(name, cf_rows, empty))
    torch.testing.assert_close(none["logit_diff"], base_clean, rtol=1e-4, atol=1e-4)
    moved = fraction_moved(base_clean, base_cf, whole["logit_diff"])
    assert abs(moved.value - 1) < 1e-4


def test_helix_subspace_from_a_fit_patches_like_its_projection(model, pairs):
    clean, cf = pairs
    h = torch.randn(200, model.cfg.d_model, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    fit = fit_helix(h, list(range(200)))
    q = fit.subspace
    assert torch.allclose(q.T @ q, torch.eye(q.shape[1], dtype=q.dtype), atol=1e-8)
    cf_rows = torch.randn(len(clean.rows), model.cfg.d_model)
    edit = subspace_patch_edit(HOOK, cf_rows, q)
    old = torch.randn(3, model.cfg.d_model)
    ((_, hook),) = edit([0, 1, 2])
    new = hook(old[:, None, :].clone(), hook=None)[:, -1]
    expected = old + (cf_rows[:3] - old) @ q.float() @ q.float().T
    torch.testing.assert_close(new, expected, rtol=1e-5, atol=1e-5)


def test_fourier_filter_removes_a_planted_period_and_keep_all_is_identity():
    s = torch.arange(100, dtype=torch.float64)
    slow, fast = torch.cos(2 * math.pi * s / 50), torch.cos(2 * math.pi * s / 5)
    means = torch.stack([slow + fast, 3 + fast], 1)
    high = frequency_band(100, max_period=10)
    filtered = fourier_filter(means, high, "remove")
    torch.testing.assert_close(filtered, torch.stack([slow, torch.full_like(s, 3.0)], 1))
    torch.testing.assert_close(fourier_filter(means, range(1, 51), "keep"), means)
    torch.testing.assert_close(fourier_filter(means, high, "keep"), torch.stack([fast, 3 + fast], 1))
    with pytest.raises(InputError, match="outside 1..50"):
        fourier_filter(means, [0])


def test_frequency_filter_edit_shifts_each_prompt_by_its_results_filtered_mean():
    results = [0, 1, 2, 3, 3, 1, 0, 2]
    outputs = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))
    edit, values = frequency_filter_edit("x", outputs, results, [1, 2], mode="remove")
    assert values == [0, 1, 2, 3]
    ((_, hook),) = edit(list(range(8)))
    new = hook(outputs[:, None, :].clone(), hook=None)[:, -1]
    overall = torch.stack([outputs[torch.tensor(results) == v].mean(0) for v in values]).mean(0)
    for v in values:  # removing every frequency leaves each result's mean at the overall mean
        rows = torch.tensor(results) == v
        torch.testing.assert_close(new[rows].mean(0), overall, rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match="never occur"):
        frequency_filter_edit("x", outputs[:2], [0, 5], [1])


def test_neuron_attribution_gradient_matches_finite_differences(model):
    prompts = arithmetic_prompts(model, [(2, 3), (4, 4)])
    digits = [model.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    answers = [r["answer_token_ids"][0] for r in prompts.rows]
    scores, acts = neuron_attribution(model, prompts.tokens(), answers, [0, 1], candidate_ids=digits)
    assert scores.shape == (2, model.cfg.d_mlp) and acts.shape == (2, 2, model.cfg.d_mlp)
    (layer, neuron), = top_neurons(scores, [0, 1], 1)
    means = {layer: acts[:, [0, 1].index(layer)].mean(0)}
    edit = neuron_knockout_edit([(layer, neuron)], means)
    knocked = evaluate_end(model, prompts.tokens(), answers, alt_ids=[digits[0]] * 2, edit=edit)
    base = evaluate_end(model, prompts.tokens(), answers, alt_ids=[digits[0]] * 2)
    assert not torch.allclose(knocked["logit_diff"], base["logit_diff"])  # the top neuron matters

    def metric_with(value, row):
        def set_value(act, *, hook):
            act = act.clone()
            act[0, -1, neuron] = value
            return act
        with torch.no_grad():
            resid = model.run_with_hooks(torch.tensor([row["tokens"]]), stop_at_layer=model.cfg.n_layers,
                                         fwd_hooks=[(f"blocks.{layer}.mlp.hook_post", set_value)])[:, -1]
            logits = unembed_end(model, resid)[0]
        return float(logits[row["answer_token_ids"][0]] - logits[digits].mean())

    eps, j = 1e-2, [0, 1].index(layer)
    estimates = []
    for i, row in enumerate(prompts.rows):
        a = float(acts[i, j, neuron])
        grad = (metric_with(a + eps, row) - metric_with(a - eps, row)) / (2 * eps)
        estimates.append(abs((a - float(acts[:, j, neuron].mean())) * grad))
    assert abs(sum(estimates) / 2 - float(scores[j, neuron])) < 1e-2 * max(1.0, float(scores[j, neuron]))


def test_no_hook_survives_an_edit_that_raises(model, pairs):
    clean, _ = pairs
    answers = [r["answer_token_ids"][0] for r in clean.rows]

    def failing(chunk):
        def hook(tensor, *, hook):
            raise RuntimeError("edit failed")
        return [(HOOK, hook)]

    with pytest.raises(RuntimeError, match="edit failed"):
        evaluate_end(model, clean.tokens(), answers, edit=failing)
    assert all(not hp.fwd_hooks and not hp.bwd_hooks for hp in model.hook_dict.values())
    neuron_attribution(model, clean.tokens()[:2], answers[:2], [0], candidate_ids=answers[:2])
    assert all(not hp.fwd_hooks and not hp.bwd_hooks for hp in model.hook_dict.values())
