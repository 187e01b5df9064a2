"""experiments.merge.stats: the experts' validation bar, and the closed form against the baselines as paired
differences over the pooled test prompts (per seed, and through the per-prompt mean over seeds)."""

import pytest

from experiments.merge.stats import closed_form_groups, compare, expert_bar, verdict_text

TASKS = ["add", "mul"]


def _test(add, mul):
    return {"test": {"tasks": {"add": {"exact_hits": add}, "mul": {"exact_hits": mul}}}}


MODELS = {
    "closed form (attn_mlp, seed 0)": {"positions": "all", **_test([1, 1, 0, 1], [1, 0])},  # 4 of 6
    "closed form (attn_mlp, seed 1)": {"positions": "all", **_test([1, 0, 0, 1], [0, 0])},  # 2 of 6
    "closed form (attn_mlp, answer-side, seed 0)": {"positions": "answer", **_test([0, 0, 0, 1], [1, 1])},
    "closed form (attn_mlp) [add+mul]": {"positions": "all", **_test([1, 1, 1, 1], [1, 1])},  # a pair: not a seed
    "task_arithmetic": _test([0, 0, 0, 1], [0, 0]),  # 1 of 6
    "weight_average": _test([1, 1, 1, 1], [1, 1]),
}


def test_closed_form_seeds_are_grouped_by_positions():
    assert closed_form_groups(MODELS) == {"all": ["closed form (attn_mlp, seed 0)", "closed form (attn_mlp, seed 1)"],
                                          "answer": ["closed form (attn_mlp, answer-side, seed 0)"]}


def test_paired_differences_by_hand():
    out = compare(MODELS, TASKS)
    every = out["all"]
    assert every["seed_accuracies"] == pytest.approx([4 / 6, 2 / 6])
    assert every["seed_mean"] == pytest.approx(0.5) and every["seed_spread"] == pytest.approx(2 / 6)
    ta = every["minus"]["task_arithmetic"]
    # per-prompt mean over seeds [1, .5, 0, 1, .5, 0] minus task arithmetic's [0, 0, 0, 1, 0, 0]
    assert ta["seed_mean"]["value"] == pytest.approx(0.5 - 1 / 6) and ta["seed_mean"]["n"] == 6
    assert [d["value"] for d in ta["per_seed"]] == pytest.approx([4 / 6 - 1 / 6, 2 / 6 - 1 / 6])
    assert ta["seed_mean"]["low"] <= ta["seed_mean"]["value"] <= ta["seed_mean"]["high"]
    assert every["minus"]["weight_average"]["seed_mean"]["value"] == pytest.approx(-0.5)
    assert set(every["minus"]) == {"task_arithmetic", "weight_average"}  # no TIES run: no TIES comparison
    text = verdict_text({"models": MODELS, "comparisons": out}, "circuit-aware")
    assert "(all positions, 2 seed(s))" in text and "task arithmetic: difference +0.333" in text and "n=6" in text


def test_the_expert_bar():
    val = lambda exact: {"val": {"tasks": {"add": {"exact": exact, "n": 10}}}}  # noqa: E731
    bar = expert_bar({"base": val(0.2), "expert add": val(0.7), "weight_average": val(0.75)}, ["add"], 0.4)["add"]
    assert bar["gain_over_base"] == pytest.approx(0.5) and bar["beats_base_by_target"] is True
    assert bar["beats_weight_average"] is False and bar["n_val"] == 10
