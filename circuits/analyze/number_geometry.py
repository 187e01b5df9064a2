"""The geometry of number representations: Fourier spectrum, generalized helix, mod-T probes.

Input everywhere: ``h[n, d]``, one row per number (from :mod:`circuits.analyze.number_tokens`).

**Fourier spectrum** (Zhou et al. 2024). Center h over n, take the discrete Fourier
transform along n for every dimension and sum the power over dimensions:
``P(k) = Σ_d |Σ_n h[n, d] e^{-2πikn/N}|²`` for k = 1..N/2, reported as a fraction of
the total and as the period T = N/k. With N a multiple of 100 (0..399 by default) the
periods 2, 5, 10 and 100 fall on exact frequencies.

**Null.** A peak means something only against a spectrum without number structure.
We implement the *shuffled-n null*: permute the rows (which numbers go with which
vectors) ``n_shuffles`` times and recompute the spectrum; a permutation keeps every
vector, its norm and the total power, and destroys only the order over n. To control
the family-wise error over all N/2 frequencies, the threshold is the (1 − α) quantile of
the **maximum** over k of the shuffled spectra; a period "stands above the null" when
its power exceeds that threshold. (The token-frequency null of Fu et al. 2026 needs
corpus counts, which no offline model here ships; it is not implemented.)

**Helix** (Kantamneni & Tegmark 2025). Basis ``B(n) = [n, cos 2πn/T, sin 2πn/T for T in
periods]`` (n rescaled to [0, 1] for conditioning); least squares ``h − mean ≈ (B − mean) C``.
Variance explained is compared with PCA of the same rank (the basis' numerical rank: 1 + 2|periods|,
less one for T = 2, whose sine vanishes on integers), which is
the best any rank-k linear reconstruction can do in sample, so helix/PCA ≤ 1 there; on
held-out numbers (a random split of distinct values) the helix can beat PCA. The helix
subspace is span of C's rows in d-space (orthonormalised): what helix patching replaces.

**mod-T probes** (Fu et al. 2026). A linear probe (ridge classifier on standardised
features: one-hot targets, argmax of the linear score) predicts n mod T; it is trained
on some numbers and scored by Cohen's κ on the **held-out numbers** (κ = 0 at chance,
1 when perfect). The same probe on shuffled labels is the control: κ near 0 there says
the split and the probe's capacity do not manufacture accuracy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from circuits.analyze.number_catalogue import HELIX_PERIODS
from circuits.errors import InputError
from circuits.seeds import derived_seed
from circuits.stats import Estimate, bootstrap


def _as_matrix(h) -> Tensor:
    h = torch.as_tensor(h).detach().to("cpu", torch.float64)
    if h.ndim != 2 or h.shape[0] < 4:
        raise InputError(f"Expected h[n, d] with at least 4 numbers, got shape {tuple(h.shape)}.")
    return h


# ---------------------------------------------------------------------------- Fourier spectrum


def _power(rows: Float[Tensor, "... d n"]) -> Float[Tensor, "... k"]:
    """Power at k = 1..n//2 of signals along the last axis, summed over d, as fractions of the total."""
    power = torch.fft.rfft(rows, dim=-1).abs().pow(2).sum(-2)[..., 1:]
    # Frequencies strictly between 0 and N/2 appear twice in the full DFT; N/2 (even N) once.
    weights = torch.full((power.shape[-1],), 2.0, dtype=power.dtype)
    if rows.shape[-1] % 2 == 0:
        weights[-1] = 1.0
    power = power * weights
    return power / power.sum(-1, keepdim=True).clamp_min(1e-300)


def _reduced(h: Tensor) -> Tensor:
    """Centered h in the basis of its principal directions, [rank, n] and float32.

    The summed power is invariant under an orthogonal change of the d axis, and a
    permutation of rows commutes with it, so spectra and shuffled spectra are unchanged
    while the FFTs run over rank <= n signals instead of d.
    """
    centered = h - h.mean(0)
    u, s, _ = torch.linalg.svd(centered, full_matrices=False)
    keep = s > 1e-10 * s.max().clamp_min(1e-300)
    return (u[:, keep] * s[keep]).T.contiguous().float()


def power_spectrum(h: Float[Tensor, "n d"]) -> Float[Tensor, "k"]:
    """Power at frequencies k = 1..n//2 (summed over dimensions), as fractions of the total."""
    h = _as_matrix(h)
    return _power((h - h.mean(0)).T)


@dataclass(frozen=True)
class Spectrum:
    """A power spectrum over n against the shuffled-n null."""

    n_numbers: int
    frequencies: list[int]
    periods: list[float]
    power: list[float]
    null_threshold: float  # (1 - alpha) quantile of the max over k of shuffled spectra
    null_mean: float
    alpha: float
    n_shuffles: int

    @property
    def significant_periods(self) -> list[float]:
        """Periods whose power exceeds the null threshold, strongest first."""
        hits = [(p, t) for p, t in zip(self.power, self.periods) if p > self.null_threshold]
        return [round(t, 3) for _, t in sorted(hits, reverse=True)]

    def power_at(self, period: float) -> float:
        """Power at the frequency closest to ``period``."""
        k = round(self.n_numbers / period)
        if not 1 <= k <= len(self.power):
            raise InputError(f"Period {period} is outside 2..{self.n_numbers} for {self.n_numbers} numbers.")
        return self.power[k - 1]

    def to_dict(self) -> dict:
        return {"n_numbers": self.n_numbers, "periods": self.periods, "power": self.power,
                "null_threshold": self.null_threshold, "null_mean": self.null_mean, "alpha": self.alpha,
                "n_shuffles": self.n_shuffles, "significant_periods": self.significant_periods}


def fourier_spectrum(h: Float[Tensor, "n d"], *, n_shuffles: int = 200, alpha: float = 0.05, seed: int = 0) -> Spectrum:
    """The spectrum of h over its rows (consecutive numbers) and the shuffled-n max-power null."""
    h = _as_matrix(h)
    if n_shuffles < 1 or not 0 < alpha < 1:
        raise InputError(f"Need n_shuffles >= 1 and 0 < alpha < 1, got {n_shuffles}, {alpha}.")
    power = power_spectrum(h)
    reduced = _reduced(h)
    generator = torch.Generator().manual_seed(seed)
    maxima, means = [], []
    if reduced.shape[0] == 0:  # h is constant over n: no power anywhere, shuffled or not
        maxima, means = [0.0] * n_shuffles, [0.0] * n_shuffles
    for start in range(0, n_shuffles if reduced.shape[0] else 0, 25):  # 25 shuffles per batched FFT
        perms = torch.stack([torch.randperm(h.shape[0], generator=generator)
                             for _ in range(min(25, n_shuffles - start))])
        shuffled = _power(reduced[:, perms].transpose(0, 1)).double()  # [shuffle, k]
        maxima += shuffled.max(-1).values.tolist()
        means += shuffled.mean(-1).tolist()
    n = h.shape[0]
    frequencies = list(range(1, len(power) + 1))
    return Spectrum(n_numbers=n, frequencies=frequencies, periods=[n / k for k in frequencies],
                    power=power.tolist(), null_threshold=float(np.quantile(maxima, 1 - alpha)),
                    null_mean=float(np.mean(means)), alpha=alpha, n_shuffles=n_shuffles)


# ---------------------------------------------------------------------------- helix


def helix_basis(values: Sequence[int] | Tensor, periods: Sequence[float] = HELIX_PERIODS, scale: float | None = None) -> Float[Tensor, "n basis"]:
    """[n/scale, cos 2πn/T, sin 2πn/T for T in periods] per value (scale defaults to max |n|)."""
    n = torch.as_tensor(values, dtype=torch.float64)
    if not periods or any(t <= 0 for t in periods):
        raise InputError(f"Periods must be positive and at least one, got {list(periods)}.")
    scale = float(n.abs().max().clamp_min(1.0)) if scale is None else scale
    columns = [n / scale]
    for t in periods:
        columns += [torch.cos(2 * math.pi * n / t), torch.sin(2 * math.pi * n / t)]
    return torch.stack(columns, dim=1)


def orthonormal_columns(matrix: Float[Tensor, "d k"], tol: float = 1e-8) -> Float[Tensor, "d r"]:
    """An orthonormal basis of the column space (rank-revealing through the SVD)."""
    u, s, _ = torch.linalg.svd(matrix.to(torch.float64), full_matrices=False)
    return u[:, s > tol * s.max().clamp_min(1e-300)]


def pca_subspace(h: Float[Tensor, "n d"], rank: int) -> Float[Tensor, "d rank"]:
    """The top-``rank`` principal directions of h (centered over rows)."""
    h = _as_matrix(h)
    _, _, vt = torch.linalg.svd(h - h.mean(0), full_matrices=False)
    return vt[:rank].T


def _explained(h: Tensor, reconstruction: Tensor, mean: Tensor) -> float:
    total = float((h - mean).pow(2).sum())
    if total <= 0:  # a constant representation: there is no variance to explain
        return math.nan
    return float(1 - (h - reconstruction).pow(2).sum() / total)


@dataclass(frozen=True)
class HelixFit:
    """Least-squares helix fit h ≈ mean + (B(n) − B̄) C and its PCA comparison."""

    periods: tuple[float, ...]
    rank: int
    coef: Tensor = field(repr=False)  # [basis, d]
    h_mean: Tensor = field(repr=False)
    basis_mean: Tensor = field(repr=False)
    scale: float
    r2_train: float
    pca_r2_train: float
    r2_test: float
    pca_r2_test: float
    n_train: int
    n_test: int

    @property
    def subspace(self) -> Float[Tensor, "d r"]:
        """Orthonormal basis of span(C): the directions the helix occupies in activation space."""
        return orthonormal_columns(self.coef.T)

    def predict(self, values) -> Float[Tensor, "n d"]:
        return self.h_mean + (helix_basis(values, self.periods, self.scale) - self.basis_mean) @ self.coef

    def to_dict(self) -> dict:
        return {"periods": list(self.periods), "rank": self.rank, "r2_train": self.r2_train,
                "pca_r2_train": self.pca_r2_train, "r2_test": self.r2_test, "pca_r2_test": self.pca_r2_test,
                "n_train": self.n_train, "n_test": self.n_test}


def _split_values(values: Tensor, test_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Boolean train/test masks over rows: whole distinct values go to one side."""
    distinct = torch.unique(values)
    if not 0 <= test_fraction < 1:
        raise InputError(f"test_fraction must lie in [0, 1), got {test_fraction}.")
    n_test = int(round(test_fraction * len(distinct)))
    perm = distinct[torch.randperm(len(distinct), generator=torch.Generator().manual_seed(seed))]
    test = torch.isin(values, perm[:n_test])
    return ~test, test


def fit_helix(h: Float[Tensor, "n d"], values: Sequence[int], periods: Sequence[float] = HELIX_PERIODS, *,
              test_fraction: float = 0.2, seed: int = 0) -> HelixFit:
    """Fit the helix on the training numbers; variance explained in and out of sample vs PCA of equal rank."""
    h = _as_matrix(h)
    values_t = torch.as_tensor(list(values), dtype=torch.float64)
    if values_t.numel() != h.shape[0]:
        raise InputError(f"Got {h.shape[0]} rows but {values_t.numel()} values.")
    train, test = _split_values(values_t, test_fraction, seed)
    scale = float(values_t.abs().max().clamp_min(1.0))
    basis = helix_basis(values_t, periods, scale)
    if int(train.sum()) <= basis.shape[1]:
        raise InputError(f"The helix has {basis.shape[1]} basis functions; fit it on more than that many numbers.")
    h_mean, b_mean = h[train].mean(0), basis[train].mean(0)
    # sin(2πn/2) vanishes on integers, so the basis can be rank deficient: solve through a
    # truncated pseudo-inverse (LAPACK's default rcond keeps the ~1e-13 column and blows up).
    centered = basis[train] - b_mean
    rank = int(torch.linalg.matrix_rank(centered, rtol=1e-8))
    coef = torch.linalg.pinv(centered, rtol=1e-8) @ (h[train] - h_mean)
    fitted = h_mean + (basis - b_mean) @ coef
    q = pca_subspace(h[train], rank)
    pca = h_mean + (h - h_mean) @ q @ q.T
    r2_test = pca_test = math.nan
    if int(test.sum()) > 0:
        r2_test = _explained(h[test], fitted[test], h_mean)
        pca_test = _explained(h[test], pca[test], h_mean)
    return HelixFit(tuple(periods), rank, coef, h_mean, b_mean, scale,
                    _explained(h[train], fitted[train], h_mean), _explained(h[train], pca[train], h_mean),
                    r2_test, pca_test, int(train.sum()), int(test.sum()))


# ---------------------------------------------------------------------------- mod-T probes


def cohen_kappa(predicted, actual) -> float:
    """Cohen's κ between two label vectors: (p_observed − p_chance) / (1 − p_chance)."""
    predicted, actual = np.asarray(predicted).reshape(-1), np.asarray(actual).reshape(-1)
    if predicted.shape != actual.shape or predicted.size == 0:
        raise InputError(f"Need two equally long, non-empty label vectors, got {predicted.size} and {actual.size}.")
    labels, codes = np.unique(np.concatenate([predicted, actual]), return_inverse=True)
    p_codes, a_codes = codes[:predicted.size], codes[predicted.size:]
    observed = float(np.mean(p_codes == a_codes))
    n = predicted.size
    chance = float(np.dot(np.bincount(p_codes, minlength=len(labels)), np.bincount(a_codes, minlength=len(labels)))) / n**2
    return 1.0 if chance >= 1.0 else (observed - chance) / (1 - chance)


@dataclass(frozen=True)
class ProbeResult:
    """A mod-T probe's held-out Cohen's κ (bootstrap over held-out rows) and accuracy."""

    modulus: int
    kappa: Estimate
    accuracy: float
    shuffled_labels: bool

    def to_dict(self) -> dict:
        return {"modulus": self.modulus, "kappa": self.kappa.to_dict(), "accuracy": self.accuracy,
                "shuffled_labels": self.shuffled_labels}


def mod_probe(h: Float[Tensor, "n d"], values: Sequence[int], modulus: int, *, test_fraction: float = 0.25,
              ridge: float = 1.0, shuffle_labels: bool = False, seed: int = 0) -> ProbeResult:
    """Ridge-classifier probe of ``value mod modulus``, trained on some numbers, κ on the held-out ones."""
    if modulus < 2:
        raise InputError(f"The modulus must be at least 2, got {modulus}.")
    h = _as_matrix(h)
    values_t = torch.as_tensor(list(values), dtype=torch.long)
    labels = values_t % modulus
    if shuffle_labels:  # the control: same numbers, same split, labels permuted across rows
        shuffler = torch.Generator().manual_seed(derived_seed(seed, "shuffled labels"))  # the split keeps ``seed``
        labels = labels[torch.randperm(len(labels), generator=shuffler)]
    train, test = _split_values(values_t.double(), test_fraction, seed)
    if int(test.sum()) == 0:
        raise InputError("No held-out numbers: raise test_fraction.")
    mean, std = h[train].mean(0), h[train].std(0).clamp_min(1e-8)
    x = (h - mean) / std
    x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    targets = torch.nn.functional.one_hot(labels, modulus).double()
    xt = x[train]
    # Dual form (n_train x n_train) is the cheaper solve when d exceeds the number of training rows.
    gram = xt @ xt.T + ridge * torch.eye(len(xt), dtype=x.dtype)
    weights = xt.T @ torch.linalg.solve(gram, targets[train])
    predicted = (x[test] @ weights).argmax(1).numpy()
    actual = labels[test].numpy()
    pairs = np.stack([predicted, actual], 1)
    kappa = bootstrap(pairs, lambda rows: cohen_kappa(rows[:, 0], rows[:, 1]), n_resamples=500, seed=seed)
    return ProbeResult(modulus, kappa, float(np.mean(predicted == actual)), shuffle_labels)
