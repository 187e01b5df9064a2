"""Intervals for every number the toolkit reports: Wilson for proportions, percentile bootstrap for the rest.

Every accuracy, faithfulness or effect an experiment writes carries its sample size
and a 95% interval. Two kinds cover the toolkit's needs:

* a **proportion** (accuracy: k of n prompts right) gets the Wilson score interval,
  which stays inside [0, 1] and behaves at 0/n and n/n, where the normal
  approximation collapses to a zero-width interval;
* any other **statistic over prompts** (a mean effect, a faithfulness ratio, an area
  under a curve, a paired difference) gets the percentile bootstrap: resample the
  prompts with replacement, recompute the statistic, take the 2.5% and 97.5%
  quantiles of the resampled values.

Resampling is over prompts (axis 0), the unit the experiments sample. Seeds are
explicit so a report is reproducible. :class:`Estimate` is the record that goes into
``results.json``: ``{"value", "low", "high", "n", "interval"}``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import torch

from circuits.errors import InputError

DEFAULT_RESAMPLES = 2000


@dataclass(frozen=True)
class Estimate:
    """A measured value with its 95% interval and sample size."""

    value: float
    low: float
    high: float
    n: int
    interval: str  # "wilson", "bootstrap" or "none" (n too small for an interval)

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.value:.4g} [{self.low:.4g}, {self.high:.4g}] (n={self.n})"


def _as_numpy(values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float64).numpy()
    return np.asarray(values, dtype=np.float64)


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise InputError(f"confidence must lie strictly between 0 and 1, got {confidence!r}.")


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for ``successes`` out of ``n`` (``(nan, nan)`` when n = 0)."""
    _check_confidence(confidence)
    if n < 0 or successes < 0 or successes > n:
        raise InputError(f"Need 0 <= successes <= n, got successes={successes}, n={n}.")
    if n == 0:
        return math.nan, math.nan
    z = _normal_quantile(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # at 0 or n successes the bound is exactly 0 or 1 (the formula leaves float rounding there)
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def resolvable_difference(n: int, baseline: float, confidence: float = 0.95) -> float:
    """The power of a proportion measured on ``n`` items against a ``baseline`` measured on the same ``n``: the
    smallest excess ``k / n − baseline`` whose Wilson interval lies wholly above the baseline's (``round(baseline
    · n)`` of ``n``). A true value closer to the baseline than this cannot be told from it on ``n`` items; ``inf``
    where no ``k`` can (``n`` too small, or the baseline too near 1)."""
    if n < 1 or not 0.0 <= baseline <= 1.0:
        raise InputError(f"Need n >= 1 items and a baseline proportion in [0, 1], got n={n}, baseline={baseline}.")
    baseline_high = wilson_interval(round(baseline * n), n, confidence)[1]
    for k in range(n + 1):
        if wilson_interval(k, n, confidence)[0] > baseline_high:
            return k / n - baseline
    return math.inf


def items_to_resolve(difference: float, baseline: float, confidence: float = 0.95, *, start: int = 8,
                     limit: int = 1 << 16) -> int | None:
    """The fewest items, doubling from ``start``, on which :func:`resolvable_difference` against ``baseline`` is at
    most ``difference`` (None: not within ``limit``)."""
    n = start
    while n <= limit:
        if resolvable_difference(n, baseline, confidence) <= difference:
            return n
        n *= 2
    return None


def _normal_quantile(q: float) -> float:
    # Inverse of the standard normal CDF via erfinv; exact to float precision.
    return math.sqrt(2.0) * float(torch.special.erfinv(torch.tensor(2 * q - 1, dtype=torch.float64)))


def proportion(correct, confidence: float = 0.95) -> Estimate:
    """Accuracy of a boolean vector (one entry per prompt) with its Wilson interval."""
    values = _as_numpy(correct).reshape(-1)
    n = int(values.size)
    k = int(round(values.sum()))
    low, high = wilson_interval(k, n, confidence)
    return Estimate(value=k / n if n else math.nan, low=low, high=high, n=n, interval="wilson")


def bootstrap_samples(
    values,
    statistic: Callable[[np.ndarray], float] | None = None,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> np.ndarray:
    """The statistic recomputed on ``n_resamples`` resamples of ``values``' rows (prompts).

    ``values`` is [n] or [n, ...]; ``statistic`` maps such an array to a float and
    defaults to the mean over axis 0 (vectorised). Paired statistics (a difference of
    two arms on the same prompts, a ratio of two sums) pass both arms as columns so
    the same prompts are drawn for both.
    """
    array = _as_numpy(values)
    n = array.shape[0] if array.ndim else 0
    if n == 0:
        raise InputError("Cannot bootstrap an empty sample: pass at least one prompt's value.")
    if n_resamples < 1:
        raise InputError(f"n_resamples must be >= 1, got {n_resamples}.")
    rng = np.random.default_rng(seed)
    index = rng.integers(0, n, size=(n_resamples, n))
    if statistic is None:
        return array[index].mean(axis=1).reshape(n_resamples, -1).squeeze(-1)
    return np.array([statistic(array[row]) for row in index], dtype=np.float64)


def bootstrap(
    values,
    statistic: Callable[[np.ndarray], float] | None = None,
    *,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Estimate:
    """The statistic on ``values`` with its percentile-bootstrap interval over prompts.

    With one prompt there is nothing to resample: the interval is ``(nan, nan)`` and
    ``interval="none"``, so a report cannot mistake it for a precise number.
    """
    _check_confidence(confidence)
    array = _as_numpy(values)
    n = int(array.shape[0]) if array.ndim else 0
    if n == 0:
        raise InputError("Cannot estimate a statistic of an empty sample: pass at least one prompt's value.")
    value = float(array.mean(axis=0)) if statistic is None else float(statistic(array))
    if n == 1:
        return Estimate(value=value, low=math.nan, high=math.nan, n=1, interval="none")
    samples = bootstrap_samples(array, statistic, n_resamples=n_resamples, seed=seed)
    samples = samples[np.isfinite(samples)]
    if samples.size == 0:
        return Estimate(value=value, low=math.nan, high=math.nan, n=n, interval="none")
    tail = (1 - confidence) / 2
    low, high = np.quantile(samples, [tail, 1 - tail])
    return Estimate(value=value, low=float(low), high=float(high), n=n, interval="bootstrap")


def paired_difference(a, b, *, confidence: float = 0.95, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Estimate:
    """mean(a) − mean(b) over the same prompts, with a paired bootstrap interval."""
    a_array, b_array = _as_numpy(a).reshape(-1), _as_numpy(b).reshape(-1)
    if a_array.shape != b_array.shape:
        raise InputError(
            f"A paired difference needs one value per prompt in both arms, got {a_array.size} and {b_array.size}."
        )
    return bootstrap(a_array - b_array, confidence=confidence, n_resamples=n_resamples, seed=seed)


def bootstrap_two_way(
    values, *, confidence: float = 0.95, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> Estimate:
    """Mean of a [n_prompts, n_repeats] table with a bootstrap interval over prompts *and* repeats.

    Each resample draws the prompts (rows) and, independently, the repeats (columns, e.g. the
    random head sets of a random-rank knockout) with replacement and takes the mean of the
    drawn cells, so the interval covers both sources of variation. ``n`` is the number of prompts.
    """
    _check_confidence(confidence)
    table = _as_numpy(values)
    if table.ndim != 2 or 0 in table.shape:
        raise InputError(f"bootstrap_two_way needs a non-empty [prompts, repeats] table, got shape {table.shape}.")
    if n_resamples < 1:
        raise InputError(f"n_resamples must be >= 1, got {n_resamples}.")
    n_rows, n_cols = table.shape
    value = float(table.mean())
    if n_rows * n_cols == 1:
        return Estimate(value=value, low=math.nan, high=math.nan, n=n_rows, interval="none")
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, n_rows, size=(n_resamples, n_rows))
    cols = rng.integers(0, n_cols, size=(n_resamples, n_cols))
    # mean over drawn cells = mean over drawn rows of the row sums restricted to drawn columns
    col_counts = np.stack([np.bincount(c, minlength=n_cols) for c in cols])  # [resample, col]
    row_counts = np.stack([np.bincount(r, minlength=n_rows) for r in rows])  # [resample, row]
    samples = np.einsum("sr,rc,sc->s", row_counts, table, col_counts) / (n_rows * n_cols)
    tail = (1 - confidence) / 2
    low, high = np.quantile(samples, [tail, 1 - tail])
    return Estimate(value=value, low=float(low), high=float(high), n=n_rows, interval="bootstrap over prompts and repeats")
