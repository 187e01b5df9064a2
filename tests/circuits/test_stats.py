"""Intervals against hand-computed values: Wilson, percentile bootstrap, two-way bootstrap, paired difference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from circuits.stats import bootstrap, bootstrap_two_way, paired_difference, proportion, wilson_interval


def test_wilson_matches_hand_computed_values():
    # 8 of 10 at 95% (z = 1.959964): centre 0.716742, half-width 0.226577
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.490162, abs=1e-5) and high == pytest.approx(0.943318, abs=1e-5)
    # 0 of 10: the interval starts at 0 and reaches z^2 / (n + z^2) = 0.277533
    low, high = wilson_interval(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(0.277533, abs=1e-5)
    estimate = proportion(np.array([1] * 8 + [0] * 2))
    assert (estimate.value, estimate.n, estimate.interval) == (0.8, 10, "wilson")
    assert math.isnan(wilson_interval(0, 0)[0])


def test_percentile_bootstrap_on_two_prompts():
    # resampled means of [0, 1] are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4: the 2.5% / 97.5% quantiles are 0 and 1
    estimate = bootstrap(np.array([0.0, 1.0]), n_resamples=4000)
    assert (estimate.value, estimate.low, estimate.high, estimate.n) == (0.5, 0.0, 1.0, 2)
    constant = bootstrap(np.full(5, 0.25))
    assert constant.low == constant.high == 0.25
    one = bootstrap(np.array([3.0]))
    assert one.interval == "none" and math.isnan(one.low)


def test_two_way_bootstrap_resamples_prompts_and_repeats():
    # one prompt, two seeds: only the seeds vary; means 0, 0.5, 1 as above
    by_seeds = bootstrap_two_way(np.array([[0.0, 1.0]]), n_resamples=4000)
    assert (by_seeds.value, by_seeds.low, by_seeds.high, by_seeds.n) == (0.5, 0.0, 1.0, 1)
    by_prompts = bootstrap_two_way(np.array([[0.0], [1.0]]), n_resamples=4000)
    assert (by_prompts.low, by_prompts.high, by_prompts.n) == (0.0, 1.0, 2)
    assert bootstrap_two_way(np.ones((3, 4))).low == 1.0
    # resampling both axes gives a wider interval than the prompts alone when the seeds disagree
    rng = np.random.default_rng(0)
    table = (rng.random((40, 10)) < np.linspace(0.3, 0.9, 10)).astype(float)
    both = bootstrap_two_way(table)
    prompts_only = bootstrap(table.mean(1))
    assert both.value == pytest.approx(prompts_only.value)
    assert both.high - both.low > prompts_only.high - prompts_only.low
    with pytest.raises(ValueError, match="prompts, repeats"):
        bootstrap_two_way(np.ones(3))


def test_paired_difference_is_the_bootstrap_of_differences():
    a, b = np.array([1.0, 1.0, 0.0, 1.0]), np.array([0.0, 1.0, 0.0, 0.0])
    assert paired_difference(a, b) == bootstrap(a - b)
    with pytest.raises(ValueError, match="one value per prompt"):
        paired_difference(a, b[:3])
