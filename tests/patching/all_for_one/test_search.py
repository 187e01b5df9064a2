"""patching.all_for_one.search: the (L_wait, L_transfer) grid, the selection rules, held-out and cross-fitted
selection, head pruning and af1_accuracy, on tiny random models."""

import math

import pytest
import torch

from circuits.errors import InputError
from tests.tiny_models import tiny_model
from patching import SweepOptions
from patching.all_for_one import AF1Config, af1_accuracy, search_af1
from patching.all_for_one.search import (
    faithfulness_heatmap, SELECTION_RULES, cell_estimate, cross_fit_from_hits, grid_from_hits, grid_hits,
    held_out_selection, prune_transfer_heads, select_setting,
)
from patching.all_for_one.runner import check_setting
from tests.patching.all_for_one.af1_data import _data, _runner, _self_answered


def test_select_setting():
    nan = float("nan")
    grid = [[0.5, 0.95, 1.0], [0.2, 0.92, nan], [0.1, nan, nan]]
    assert select_setting(grid, 0.9) == (1, 1, True)
    assert select_setting(grid, 0.99) == (0, 2, True)
    assert select_setting([[0.3, 0.5], [0.5, nan]], 0.9) == (1, 0, False)


def test_search_and_pruning_run_end_to_end():
    model = tiny_model(style="gemma", n_layers=2)
    runner = _runner(model, AF1Config(min_faithfulness=0.5))
    result = search_af1(model, None, AF1Config(min_faithfulness=0.5), runner=runner)
    assert result.faithfulness == result.grid[result.l_wait][result.l_transfer]
    assert result.n_transfer_heads == 4 * result.l_transfer
    assert all(result.l_wait <= h.layer < result.l_wait + result.l_transfer for h in result.kept_heads)
    assert result.pruned_faithfulness >= 0.95 * result.faithfulness - 1e-9
    assert math.isclose(runner.faithfulness(result.l_wait, result.l_transfer, result.kept_heads),
                        result.pruned_faithfulness)
    kept, value, trace = prune_transfer_heads(runner, 0, 2, keep=1.0)
    assert len(trace) == 8 and value >= runner.faithfulness(0, 2) - 1e-9
    assert result.to_json()["grid"][2][1] is None
    fig = faithfulness_heatmap(result.grid, best=(result.l_wait, result.l_transfer))
    assert len(fig.data) == 2


def test_the_runner_carries_the_sweep_options_and_refuses_what_af1_does_not_use():
    model = tiny_model(style="gemma", n_layers=2)
    runner = _runner(model)
    assert runner.options == SweepOptions(progress=False) and runner.batch_size == 32
    with pytest.raises(InputError, match="search_af1 got both a runner and options"):
        search_af1(model, None, runner=runner, options=SweepOptions(progress=False))
    with pytest.raises(InputError, match=r"AF1Runner does not use the sweep option\(s\) metric"):
        af1_accuracy(model, _data(model), 1, 1, options=SweepOptions(metric="prob"))
    data = _self_answered(model, _data(model))  # every prompt answered 'correctly': all of them are evaluated
    small = af1_accuracy(model, data, 1, 1, options=SweepOptions(batch_size=3, progress=False))
    assert small == pytest.approx(af1_accuracy(model, data, 1, 1, options=SweepOptions(progress=False)))


def test_held_out_selection_and_report_use_disjoint_prompts():
    model = tiny_model(style="gemma", n_layers=2)
    runner = _runner(model)
    out = held_out_selection(runner, min_faithfulness=0.5, seed=1)
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
    hits = grid_hits(runner)
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


def test_held_out_rules_and_pre_specified_cells():
    model = tiny_model(style="gemma", n_layers=2)
    runner = _runner(model)
    hits = grid_hits(runner)
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


def test_the_heatmap_leaves_out_rows_never_evaluated_and_gives_intervals():
    from patching.all_for_one.search import faithfulness_heatmap

    nan = float("nan")
    grid = [[0.5, 0.25, nan], [nan, nan, nan], [0.75, nan, nan]]  # L_wait 1 skipped by a coarse stride
    fig = faithfulness_heatmap(grid, n_prompts=20)
    heat = fig.data[0]
    assert list(heat.y) == ["0", "2"] and len(heat.z) == 2  # no blank stripe for L_wait 1
    assert "95% Wilson [0.30, 0.70], n = 20" in heat.customdata[0][0]
