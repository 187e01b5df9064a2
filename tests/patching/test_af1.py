"""AF1: CAMA + ABP model, grid search and pruning on tiny random models; one gemma integration check."""

import math
from fractions import Fraction

import pytest
import torch
from datasets import Dataset

from circuits.end_logits import end_logits, unembed_end
from circuits.nodes import Head
from circuits.tasks import make_row
from circuits.templates import Template
from patching.all_for_one.cama import CamaConfig
from tests.tiny_models import tiny_model
from patching.all_for_one.template_prompts import AUTHORS_TEMPLATES, cross_fit_folds, make_template_dataset, split_fit_eval
from patching.all_for_one.search import (
    AF1Config,
    AF1Runner,
    af1_accuracy,
    af1_masks,
    check_setting,
    faithfulness_heatmap,
    grid_faithfulness,
    SELECTION_RULES,
    cell_estimate,
    cross_fit_from_hits,
    grid_from_hits,
    grid_hits,
    held_out_selection,
    prune_transfer_heads,
    search_af1,
    select_setting,
)

EQ = Template("t-eq", "+", "equation", "{A}[+]{B}=")


def _data(model, n=None):
    rows = [make_row(model.tokenizer, EQ, Fraction(a), Fraction(b)) for a in range(10) for b in range(10)]
    return Dataset.from_list(rows[:n] if n else rows)


def _runner(model, config=AF1Config()):
    """A runner whose 'answers' are the plain model's own predictions, so faithfulness is informative."""
    fit, ev = split_fit_eval(_data(model), 0.5, seed=0)
    runner = AF1Runner(model, fit, ev, config)
    for group in runner.groups:
        group.answers = end_logits(model, group.tokens).argmax(-1)
    return runner


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
    values = {v for row in grid_faithfulness(runner, progress=False) for v in row if not math.isnan(v)}
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


def test_select_setting():
    nan = float("nan")
    grid = [[0.5, 0.95, 1.0], [0.2, 0.92, nan], [0.1, nan, nan]]
    assert select_setting(grid, 0.9) == (1, 1, True)
    assert select_setting(grid, 0.99) == (0, 2, True)
    assert select_setting([[0.3, 0.5], [0.5, nan]], 0.9) == (1, 0, False)


def test_search_and_pruning_run_end_to_end():
    model = tiny_model(style="gemma", n_layers=2)
    runner = _runner(model, AF1Config(min_faithfulness=0.5))
    result = search_af1(model, None, AF1Config(min_faithfulness=0.5), runner=runner, progress=False)
    assert result.faithfulness == result.grid[result.l_wait][result.l_transfer]
    assert result.n_transfer_heads == 4 * result.l_transfer
    assert all(result.l_wait <= h.layer < result.l_wait + result.l_transfer for h in result.kept_heads)
    assert result.pruned_faithfulness >= 0.95 * result.faithfulness - 1e-9
    assert math.isclose(runner.faithfulness(result.l_wait, result.l_transfer, result.kept_heads),
                        result.pruned_faithfulness)
    kept, value, trace = prune_transfer_heads(runner, 0, 2, keep=1.0, progress=False)
    assert len(trace) == 8 and value >= runner.faithfulness(0, 2) - 1e-9
    assert result.to_json()["grid"][2][1] is None
    fig = faithfulness_heatmap(result.grid, best=(result.l_wait, result.l_transfer))
    assert len(fig.data) == 2


def test_held_out_selection_and_report_use_disjoint_prompts():
    model = tiny_model(style="gemma", n_layers=2)
    runner = _runner(model)
    out = held_out_selection(runner, min_faithfulness=0.5, seed=1, progress=False)
    select, report = set(out["selection_prompts"]), set(out["report_prompts"])
    assert not select & report and select | report == set(range(runner.n_eval))
    assert abs(len(select) - len(report)) <= 1
    # the reported number is the chosen cell on the report half only, with its Wilson interval
    hits = runner.sweep_transfer_hits(out["l_wait"])[out["l_transfer"]]
    held = out["held_out_faithfulness"]
    assert held["n"] == len(report) and held["value"] == pytest.approx(hits[sorted(report)].float().mean().item())
    assert out["selection_faithfulness"] == pytest.approx(hits[sorted(select)].float().mean().item())
    assert held["low"] <= held["value"] <= held["high"]
    # and the chosen cell is what select_setting picks on the selection half's grid
    grid = [[float("nan")] * 3 for _ in range(3)]
    for w in range(3):
        for t, h in enumerate(runner.sweep_transfer_hits(w)):
            grid[w][t] = h[sorted(select)].float().mean().item()
    assert select_setting(grid, 0.5)[:2] == (out["l_wait"], out["l_transfer"])


def test_cross_fit_scores_every_prompt_under_a_cell_chosen_on_the_other_half():
    model = tiny_model(style="gemma", n_layers=2)
    runner = _runner(model)
    hits = grid_hits(runner, progress=False)
    out = held_out_selection(runner, min_faithfulness=0.5, seed=1, hits=hits)
    halves = {"a": out["selection_prompts"], "b": out["report_prompts"]}
    for name, rule in out["cross_fit"].items():
        assert [(f["select_on"], f["report_on"]) for f in rule["folds"]] == [("a", "b"), ("b", "a")]
        pooled = []
        for i in range(runner.n_eval):
            # prompt i is reported under the cell chosen by the fold whose selection half excludes it
            fold = next(f for f in rule["folds"] if i in halves[f["report_on"]])
            assert i not in halves[fold["select_on"]]
            assert rule["prompt_cells"][i] == [fold["l_wait"], fold["l_transfer"]]
            grid = grid_from_hits(hits, 2, torch.tensor(halves[fold["select_on"]]))
            assert SELECTION_RULES[name](grid, 0.5) == (fold["l_wait"], fold["l_transfer"])
            pooled.append(float(hits[(fold["l_wait"], fold["l_transfer"])][i]))
        est = rule["pooled_faithfulness"]
        assert est["n"] == runner.n_eval and est["value"] == pytest.approx(sum(pooled) / len(pooled))
        first, second = ((f["l_wait"], f["l_transfer"]) for f in rule["folds"])
        assert rule["cells_agree"] == (first == second)
    # the first fold is the one-split estimate
    assert out["cross_fit"]["longest_wait"]["folds"][0]["held_out_faithfulness"] == out["held_out_faithfulness"]
    assert out["cross_fit_faithfulness"] == out["cross_fit"]["longest_wait"]["pooled_faithfulness"]


def test_cross_fit_by_hand_when_the_halves_disagree():
    # 4 prompts, halves A = {0, 1}, B = {2, 3}; cell (0, 1) wins on A, cell (1, 0) wins on B
    hits = {(0, 0): torch.tensor([0, 0, 0, 0]), (0, 1): torch.tensor([1, 1, 0, 1]),
            (1, 0): torch.tensor([0, 1, 1, 1])}
    out = cross_fit_from_hits(hits, 1, torch.tensor([0, 1]), torch.tensor([2, 3]), min_faithfulness=0.9)
    best = out["most_faithful"]
    assert [(f["l_wait"], f["l_transfer"]) for f in best["folds"]] == [(0, 1), (1, 0)] and not best["cells_agree"]
    # B scored under (0, 1): hits 0, 1; A scored under (1, 0): hits 0, 1 -> 2 of 4 (in-sample best would be 3 of 4)
    assert best["pooled_faithfulness"]["value"] == 0.5 and best["pooled_faithfulness"]["n"] == 4
    assert best["prompt_cells"] == [[1, 0], [1, 0], [0, 1], [0, 1]]
    # the paper's rule: the longest wait reaching 90% on A is (0, 1); on B it is (1, 0)
    assert out["longest_wait"]["prompt_cells"] == best["prompt_cells"]


def _self_answered(model, data):
    """``data`` with each prompt's answer set to the plain model's own prediction: every prompt is 'correct'."""
    predictions = end_logits(model, torch.tensor(data["tokens"])).argmax(-1).tolist()
    return data.remove_columns("answer_token_ids").add_column("answer_token_ids", [[p] for p in predictions])


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


def test_held_out_rules_and_pre_specified_cells():
    model = tiny_model(style="gemma", n_layers=2)
    runner = _runner(model)
    hits = grid_hits(runner, progress=False)
    out = held_out_selection(runner, min_faithfulness=0.5, seed=3, hits=hits)
    assert set(out["rules"]) == set(SELECTION_RULES)
    report = sorted(out["report_prompts"])
    best = out["rules"]["most_faithful"]
    assert best["held_out_faithfulness"]["value"] == pytest.approx(
        hits[(best["l_wait"], best["l_transfer"])][report].float().mean().item())
    assert out["rules"]["longest_wait"]["l_wait"] == out["l_wait"]
    cell = cell_estimate(hits, 1, 1)["faithfulness"]
    assert cell["n"] == runner.n_eval and cell["value"] == pytest.approx(runner.faithfulness(1, 1))
    with pytest.raises(ValueError, match="compute its l_wait"):
        cell_estimate(hits, 2, 1)


def test_af1_accuracy_on_correct_prompts_and_errors():
    model = tiny_model(style="llama", n_layers=2)
    data = _data(model)
    # A random model gets some prompts right by chance at best; make sure the path runs or errors clearly.
    try:
        value = af1_accuracy(model, data, 1, 1)
        assert 0.0 <= value <= 1.0
    except ValueError as err:
        assert "evaluation prompt" in str(err)
    with pytest.raises(ValueError, match="l_wait=3"):
        check_setting(model, 3, 0)
    with pytest.raises(ValueError, match="at most n_layers"):
        af1_accuracy(model, data, 1, 2)
    with pytest.raises(ValueError, match="out of range"):
        af1_accuracy(model, data, -1, 0)
    with pytest.raises(ValueError, match="empty"):
        af1_accuracy(model, data.select([]), 0, 1)
    with pytest.raises(ValueError, match="fit_fraction"):
        AF1Config(fit_fraction=1.0)


def test_split_is_disjoint_and_stratified():
    model = tiny_model()
    data = make_template_dataset(model, [EQ, AUTHORS_TEMPLATES[1]], n_per_template=30)
    fit, ev = split_fit_eval(data, 0.5, seed=1)
    assert not set(fit["prompt"]) & set(ev["prompt"])
    assert len(fit) + len(ev) == len(data)
    assert set(fit["template_id"]) == set(ev["template_id"]) == {"t-eq", "af1-verbal"}


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
