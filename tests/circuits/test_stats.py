"""Intervals against hand-computed values: Wilson, percentile bootstrap, two-way bootstrap, paired difference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from circuits.errors import InputError
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


def _wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    """Wilson's score interval from its quadratic: the p with |k/n - p| = 1.96 sqrt(p(1-p)/n), solved by bisection."""
    z, phat = 1.959963984540054, k / n

    def outside(p):
        return (phat - p) ** 2 > z * z * p * (1 - p) / n

    def root(lo, hi, rising):  # the boundary between inside and outside on [lo, hi]
        for _ in range(200):
            mid = (lo + hi) / 2
            if outside(mid) == rising:
                hi = mid
            else:
                lo = mid
        return (lo + hi) / 2

    low = 0.0 if k == 0 else root(0.0, phat, rising=False)
    high = 1.0 if k == n else root(phat, 1.0, rising=True)
    return low, high


@pytest.mark.parametrize("n, baseline", [(16, 0.1), (64, 0.1), (256, 0.02), (40, 0.5), (12, 0.0)])
def test_the_resolvable_difference_is_the_first_count_whose_interval_clears_the_baselines(n, baseline):
    from circuits.stats import resolvable_difference

    base_high = _wilson_by_hand(round(baseline * n), n)[1]
    first = next((k for k in range(n + 1) if _wilson_by_hand(k, n)[0] > base_high + 1e-12), None)
    assert resolvable_difference(n, baseline) == pytest.approx(first / n - baseline)


def test_too_few_items_resolve_nothing_and_more_items_resolve_less():
    from circuits.stats import items_to_resolve, resolvable_difference

    assert resolvable_difference(4, 0.9) == float("inf")
    powers = [resolvable_difference(n, 0.1) for n in (16, 64, 256)]
    assert powers == sorted(powers, reverse=True) and powers[-1] < 0.1
    needed = items_to_resolve(0.2, 0.1)
    assert resolvable_difference(needed, 0.1) <= 0.2 < resolvable_difference(needed // 2, 0.1)
    with pytest.raises(InputError):
        resolvable_difference(0, 0.1)
