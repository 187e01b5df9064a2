"""patching.all_for_one.runner: the AF1 model (CAMA up to L_wait, full peek for L_transfer layers, self peek
after) on tiny random models: the identity settings give the plain model, sweeps share their prefix
exactly, cross-fitted means never use the evaluated prompt; two gemma integration checks."""

import math
from fractions import Fraction

import pytest
import torch
from datasets import Dataset

from circuits.end_logits import end_logits, unembed_end
from circuits.nodes import Head
from circuits.tasks import make_row
from patching.all_for_one.cama import CamaConfig
from tests.tiny_models import tiny_model
from patching.all_for_one.template_prompts import AUTHORS_TEMPLATES, cross_fit_folds, make_template_dataset
from patching.all_for_one.runner import AF1Config, AF1Runner, af1_masks
from patching.all_for_one.search import grid_faithfulness
from tests.patching.all_for_one.af1_data import EQ, _data, _runner, _self_answered


@pytest.mark.parametrize("style,kv", [("gpt2", None), ("llama", 2), ("gemma", None)])
def test_wait_zero_full_peek_everywhere_is_the_plain_model(style, kv):
    model = tiny_model(style=style, n_layers=3, n_key_value_heads=kv)
    runner = _runner(model, AF1Config(others="full"))
    n = model.cfg.n_layers
    for logits, group in zip(runner.end_logits(0, n), runner.groups):
        assert torch.allclose(logits, end_logits(model, group.tokens), atol=1e-5)
    assert runner.faithfulness(0, n) == 1.0
    # the paper's rule (other tokens do not peek) changes the computation
    strict = _runner(model)
    changed = [not torch.allclose(a, end_logits(model, g.tokens), atol=1e-4)
               for a, g in zip(strict.end_logits(0, n), strict.groups)]
    assert all(changed)
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


@pytest.mark.parametrize("style,kv", [("llama", 2), ("gemma", None)])
def test_sweep_shares_prefix_exactly(style, kv):
    model = tiny_model(style=style, n_layers=3, n_key_value_heads=kv)
    runner = _runner(model)
    n = model.cfg.n_layers
    for w in range(n + 1):
        sweep = runner.sweep_transfer(w)
        assert len(sweep) == n - w + 1
        assert sweep == [runner.faithfulness(w, t) for t in range(n - w + 1)]
    # waiting through every layer leaves the last token only its operator-conditioned mean
    values = {v for row in grid_faithfulness(runner) for v in row if not math.isnan(v)}
    assert len(values) > 1


def test_transfer_heads_select_full_peek_per_head():
    model = tiny_model(style="gemma", n_layers=3)
    runner = _runner(model)
    all_heads = [Head(l, h) for l in (1, 2) for h in range(4)]
    a = runner.end_logits(1, 2)
    b = runner.end_logits(1, 2, transfer_heads=all_heads)
    c = runner.end_logits(1, 0)
    d = runner.end_logits(1, 2, transfer_heads=[])
    for x, y, z, u in zip(a, b, c, d):
        assert torch.allclose(x, y) and torch.allclose(z, u)
    masks = af1_masks(model, 5, 1, 1, transfer_heads=[Head(1, 2)])
    assert masks[1].shape == (4, 5, 5) and masks[1][2, -1].all() and not masks[1][0, -1].all()
    assert set(masks) == {1, 2} and masks[2][-1].tolist() == [True, False, False, False, True]
    with pytest.raises(ValueError, match="transfer layers"):
        af1_masks(model, 5, 1, 1, transfer_heads=[Head(2, 0)])


def test_cross_fitted_means_never_use_the_evaluated_prompt():
    model = tiny_model(style="gemma", n_layers=2)
    data = _self_answered(model, _data(model))  # all 100 pairs: the fit pool
    eligible = [int(a) + int(b) <= 9 for a, b in zip(data["a"], data["b"])]  # the one-token sums are evaluated
    runner = AF1Runner.cross_fitted(model, data, AF1Config(), eligible=eligible, n_folds=2)
    evaluated = [p for g in runner.groups for p in g.prompts]
    assert sorted(evaluated) == sorted(p for p, ok in zip(data["prompt"], eligible) if ok)  # each once
    assert {g.fold for g in runner.groups} == {0, 1}
    by_prompt = dict(zip(data["prompt"], data["tokens"]))
    layer = 1
    for group in runner.groups:
        assert not set(group.prompts) & group.fit_prompts
        assert len(group.fit_prompts) == 50  # the other fold of all pairs, two-digit sums included
        # an independent computation of the means from the fit prompts' cached residuals
        fit = sorted(group.fit_prompts)
        fit_tokens = torch.tensor([by_prompt[p] for p in fit])
        _, cache = model.run_with_cache(fit_tokens, names_filter=f"blocks.{layer}.hook_resid_pre")
        resid = cache[f"blocks.{layer}.hook_resid_pre"]
        means, n_used = group.means[layer].lookup(group.tokens)
        for i in range(len(group.tokens)):
            for t in torch.nonzero(~group.means[layer].kept).flatten().tolist():
                same = fit_tokens[:, t] == group.tokens[i, t]
                assert n_used[i, t] == same.sum() >= 2
                assert torch.allclose(means[i, t], resid[same, t].mean(0), atol=1e-5)
    assert runner.cama_counts()["fallback_fraction"] == 0.0
    # the folds are stratified by the second operand: 5 of the 10 first operands per fold
    folds = cross_fit_folds(data, 2, seed=0)
    for b in range(10):
        assert sorted(f for f, bb in zip(folds, data["b"]) if bb == str(b)).count(0) == 5


def test_fallback_fraction_of_a_runner_by_hand():
    model = tiny_model(style="gemma", n_layers=2)
    fit = Dataset.from_list([make_row(model.tokenizer, EQ, Fraction(a), Fraction(b)) for a, b in [(0, 1), (1, 1), (2, 2)]])
    ev = Dataset.from_list([make_row(model.tokenizer, EQ, Fraction(3), Fraction(b)) for b in (1, 2)])
    counts = AF1Runner(model, fit, ev).cama_counts()
    # replaced positions "+", B, "=" (BOS and A keep their own values): 6 pairs; B = 2 has one fit prompt
    assert counts["n_replaced"] == 6 and counts["fallback_fraction"] == pytest.approx(1 / 6)
    assert counts["prompts_with_fallback"] == 0.5 and counts["min"] == 2  # the fallback itself uses all 3


def test_cross_fit_errors():
    model = tiny_model(style="gemma", n_layers=2)
    data = _data(model, 10)
    with pytest.raises(ValueError, match="n_folds >= 2"):
        cross_fit_folds(data, 1)
    with pytest.raises(ValueError, match="stratify"):
        cross_fit_folds(data, 2, stratify="nope")
    with pytest.raises(ValueError, match="eligible has 3 entries"):
        AF1Runner.cross_fitted(model, data, eligible=[True] * 3)
    with pytest.raises(ValueError, match="No row of the data is eligible"):
        AF1Runner.cross_fitted(model, data, eligible=[False] * 10)
    with pytest.raises(ValueError, match="cannot change the CAMA settings"):
        _runner(model).with_config(cama=CamaConfig(min_count=3))


@pytest.mark.parametrize("style,kv", [("gemma", None), ("llama", 2)])
def test_without_cama_and_with_full_peek_after_the_wait_is_the_plain_model(style, kv):
    model = tiny_model(style=style, n_layers=3, n_key_value_heads=kv)
    runner = _runner(model)
    plain = runner.with_config(ablate_wait=False, others="full")
    for w in (1, 2):
        for logits, group in zip(plain.end_logits(w, 3 - w), plain.groups):
            assert torch.allclose(logits, end_logits(model, group.tokens), atol=1e-5)
        # with CAMA the same setting differs: the masks alone are not what changes the output
        assert not all(torch.allclose(a, end_logits(model, g.tokens), atol=1e-4)
                       for a, g in zip(runner.with_config(others="full").end_logits(w, 3 - w), runner.groups))
    assert runner.config.ablate_wait and plain.prompts == runner.prompts


@pytest.mark.integration
def test_af1_on_gemma(gemma):
    data = make_template_dataset(gemma, AUTHORS_TEMPLATES[:1], n_per_template=55, n_shots=2, seed=0)
    runner = AF1Runner.from_dataset(gemma, data, AF1Config(others="full"), layers=[0, 12])
    assert runner.n_eval >= 5
    n = gemma.cfg.n_layers
    assert runner.faithfulness(0, n) == 1.0  # the identity setting
    # the END-only shortcut agrees with full forwards on the real model (MQA, local layers, qk-norm)
    ends = runner.sweep_end_resid(0, 12)
    for t in (0, 3, n - 12):
        assert torch.allclose(unembed_end(gemma, ends[t]), runner.end_logits(12, t)[0], atol=1e-3)
    # nothing reaches the last token after layer 12: it keeps only its own "=" mean
    assert runner.faithfulness(12, 0) <= runner.constant_baseline + 1e-6


@pytest.mark.integration
def test_cross_fitted_af1_data_on_gemma(gemma):
    # the search data of experiments.af1: all pairs of three formats; one-token sums evaluated
    data = make_template_dataset(gemma, AUTHORS_TEMPLATES[:3], n_per_template=100, single_token_answers=False)
    eligible = [len(ids) == 1 for ids in data["answer_token_ids"]]
    runner = AF1Runner.cross_fitted(gemma, data, AF1Config(), eligible=eligible, layers=[9])
    assert runner.n_eval_total == 165 and runner.n_eval >= 45  # 46 measured (13 + 18 + 15)
    assert runner.cama_counts()["fallback_fraction"] == 0.0
    assert all(not set(g.prompts) & g.fit_prompts for g in runner.groups)
