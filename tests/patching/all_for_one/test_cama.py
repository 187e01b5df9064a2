"""CAMA on tiny random models and hand-made activations."""

from fractions import Fraction

import pytest
import torch
from datasets import Dataset

from circuits.end_logits import end_logits
from circuits.tasks import make_row
from circuits.templates import Template
from tests.tiny_models import tiny_model
from patching.all_for_one.cama import (
    CamaConfig,
    fit_cama,
    fit_cama_means,
    group_rows,
    residuals,
    resid_hook_name,
    self_context_positions,
)

EQ = Template("t-eq", "+", "equation", "{A}[+]{B}=")
VERBAL = Template("t-verbal", "+", "statement", "The [sum] of {A} and {B} is ")


@pytest.fixture(scope="module")
def model():
    return tiny_model(style="gemma", n_layers=3)


def _dataset(model, templates=(EQ,), pairs=None):
    pairs = pairs or [(a, b) for a in range(4) for b in range(3)]
    return Dataset.from_list([make_row(model.tokenizer, t, Fraction(a), Fraction(b)) for t in templates for a, b in pairs])


def test_means_from_a_prompts_own_activations_leave_it_unchanged(model):
    ds = _dataset(model, pairs=[(3, 5)])
    tokens = torch.tensor(ds["tokens"])
    plain = end_logits(model, tokens)
    for layer in range(model.cfg.n_layers + 1):
        means = fit_cama(model, ds, layer, CamaConfig(min_count=1, keep_self_context=False))
        (group,) = means.values()
        hook = (resid_hook_name(model, layer), group[layer].hook(tokens))
        assert torch.allclose(end_logits(model, tokens, fwd_hooks=[hook]), plain, atol=1e-5), layer


def test_context_aware_means_and_fallback():
    # 4 prompts of 3 positions: BOS, x, y; d_model 2
    tokens = torch.tensor([[0, 5, 7], [0, 6, 7], [0, 5, 8], [0, 6, 9]])
    resid = torch.arange(24, dtype=torch.float32).reshape(4, 3, 2)
    means = fit_cama_means(tokens, resid, layer=1, config=CamaConfig(min_count=2, keep_self_context=False))
    got, n_used = means.lookup(torch.tensor([[0, 5, 7], [0, 6, 9]]))
    assert torch.allclose(got[0, 1], (resid[0, 1] + resid[2, 1]) / 2)  # token 5 at position 1
    assert torch.allclose(got[0, 2], (resid[0, 2] + resid[1, 2]) / 2)  # token 7 at position 2
    assert torch.allclose(got[1, 2], resid[:, 2].mean(0))  # token 9 seen once < min_count: position mean
    assert n_used.tolist() == [[0, 2, 2], [0, 2, 4]]  # BOS kept: 0
    # unseen token value also falls back
    _, n_used = means.lookup(torch.tensor([[0, 4, 7]]))
    assert n_used[0, 1] == 4
    applied = means.apply(resid, tokens)
    assert torch.equal(applied[:, 0], resid[:, 0])
    with pytest.raises(ValueError, match="3 tokens"):
        means.lookup(torch.zeros(1, 4, dtype=torch.long))


def test_self_context_positions():
    tokens = torch.tensor([[0, 5, 1, 2, 3], [0, 5, 1, 4, 3], [0, 5, 1, 2, 6]])
    # positions 1..3 see only constant earlier tokens; 4 sees a varying token at 3
    assert self_context_positions(tokens).tolist() == [False, True, True, True, False]
    means = fit_cama_means(tokens, torch.randn(3, 5, 4), 0)
    assert means.kept.tolist() == [True, True, True, True, False]


def test_cama_erases_cross_token_information(model):
    ds = _dataset(model)
    layer = 2
    (means,) = fit_cama(model, ds, layer, CamaConfig(min_count=1)).values()
    tokens = torch.tensor(ds["tokens"])
    resid = residuals(model, tokens, [layer])[layer]
    out = means[layer].apply(resid, tokens)
    b_pos, end = ds[0]["b_pos"][0], len(ds[0]["tokens"]) - 1
    # prompts sharing b get the same residual at b's position whatever a was
    same_b = [i for i, row in enumerate(ds) if row["b"] == ds[0]["b"]]
    assert len(same_b) > 1
    assert torch.allclose(out[same_b, b_pos], out[same_b[0], b_pos].expand(len(same_b), -1))
    assert not torch.allclose(resid[same_b, b_pos], resid[same_b[0], b_pos].expand(len(same_b), -1))
    # '=' is the same token everywhere: its mean is over all prompts
    assert torch.allclose(out[:, end], resid[:, end].mean(0).expand(len(ds), -1), atol=1e-6)
    # the first operand's context is only itself: untouched
    a_pos = ds[0]["a_pos"][0]
    assert means[layer].kept[a_pos] and torch.equal(out[:, a_pos], resid[:, a_pos])


def test_groups_by_template_and_layout(model):
    ds = _dataset(model, templates=(EQ, VERBAL), pairs=[(1, 2), (3, 4), (12, 5)])
    groups = group_rows(ds)
    assert len(groups) == 4  # EQ one-digit, EQ with a two-digit operand, VERBAL x 2
    fitted = fit_cama(model, ds, [0, 2])
    assert set(fitted) == set(groups)
    assert all(set(v) == {0, 2} for v in fitted.values())


def test_bad_input(model):
    ds = _dataset(model)
    with pytest.raises(ValueError, match="out of range"):
        fit_cama(model, ds, model.cfg.n_layers + 1)
    with pytest.raises(ValueError, match="out of range"):
        resid_hook_name(model, -1)
    with pytest.raises(ValueError, match="empty"):
        fit_cama(model, ds.select([]), 0)
    with pytest.raises(ValueError, match="non-empty"):
        fit_cama_means(torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, 3, 2), 0)
    with pytest.raises(ValueError, match="min_count"):
        CamaConfig(min_count=0)
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_uses_value_mean_flags_fallbacks():
    tokens = torch.tensor([[0, 5, 7], [0, 6, 7], [0, 5, 8], [0, 6, 9]])
    means = fit_cama_means(tokens, torch.randn(4, 3, 2), 1, CamaConfig(min_count=2, keep_self_context=False))
    assert means.uses_value_mean(torch.tensor([[0, 5, 9], [0, 4, 7]])).tolist() == [[False, True, False],
                                                                                 [False, False, True]]


def test_fallback_mask_by_hand():
    # fit: position 1 sees 5 (x2) and 6 (x2); position 2 sees 7 (x2), 8 and 9 once each
    tokens = torch.tensor([[0, 5, 7], [0, 6, 7], [0, 5, 8], [0, 6, 9]])
    means = fit_cama_means(tokens, torch.randn(4, 3, 2), 1, CamaConfig(min_count=2, keep_self_context=False))
    evaluated = torch.tensor([[0, 5, 9], [0, 4, 7], [0, 6, 7]])
    # 9 occurs once (< min_count), 4 never: both fall back; BOS is kept, never a fallback
    assert means.fallback_mask(evaluated).tolist() == [[False, False, True], [False, True, False], [False, False, False]]
    # 2 of the 6 replaced (prompt, position) pairs; and the fallback uses the position mean
    assert means.fallback_mask(evaluated)[:, ~means.kept].float().mean().item() == pytest.approx(2 / 6)
    looked_up, n_used = means.lookup(evaluated)
    assert torch.allclose(looked_up[0, 2], means.position_mean[2]) and n_used[0, 2] == 4 and n_used[0, 1] == 2
