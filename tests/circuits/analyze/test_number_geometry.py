"""circuits.analyze.number_geometry: Fourier spectrum, helix fit and mod-T probes on synthetic activations
with planted structure; in the integration tier, the units digit on gemma-3-270m (what docs/results.md
reports, small)."""

import math

import pytest
import torch

from circuits.errors import InputError
from circuits.analyze.number_geometry import (
    cohen_kappa, fit_helix, fourier_spectrum, helix_basis, mod_probe, power_spectrum,
)
from circuits.analyze.number_tokens import number_activations, number_token_vectors


N = 400


def _random_embedding(features: torch.Tensor, d: int = 32, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return features @ torch.randn(features.shape[1], d, generator=generator, dtype=torch.float64)


def test_planted_periods_stand_above_the_null_and_others_do_not():
    n = torch.arange(N, dtype=torch.float64)
    features = torch.stack([torch.cos(2 * math.pi * n / 10), torch.sin(2 * math.pi * n / 10),
                            0.7 * torch.cos(2 * math.pi * n / 5)], 1)
    noise = 0.3 * torch.randn(N, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    spectrum = fourier_spectrum(_random_embedding(features) + noise, n_shuffles=100)
    assert set(spectrum.significant_periods) == {10.0, 5.0}
    assert spectrum.power_at(10) > spectrum.power_at(5) > 10 * spectrum.power_at(7)
    assert spectrum.significant_periods[0] == 10.0  # strongest first


def test_noise_has_no_significant_period_and_power_sums_to_one():
    h = torch.randn(N, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    spectrum = fourier_spectrum(h, n_shuffles=100)
    assert spectrum.significant_periods == []
    assert abs(sum(spectrum.power) - 1) < 1e-9


def test_power_spectrum_matches_parseval():
    # Summed power of the centered signal equals the time-domain variance times N (Parseval).
    h = torch.randn(51, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    centered = h - h.mean(0)
    raw = torch.fft.rfft(centered, dim=0).abs().pow(2).sum(1)[1:]
    weights = torch.full_like(raw, 2.0)  # odd N: every nonzero frequency appears twice
    assert torch.allclose((raw * weights).sum(), len(h) * centered.pow(2).sum())
    assert torch.allclose(power_spectrum(h), raw * weights / (raw * weights).sum())


def test_helix_fit_recovers_a_planted_helix_and_its_variance():
    n = list(range(N))
    clean = _random_embedding(helix_basis(n), d=64)
    noise = 0.05 * clean.std() * torch.randn(N, 64, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    fit = fit_helix(clean + noise, n)
    expected = 1 - noise.var() / (clean + noise).var()  # the helix explains all but the noise
    assert fit.rank == 8  # sin(πn) vanishes on integers
    assert abs(fit.r2_train - float(expected)) < 0.01 and fit.r2_test > 0.98
    assert fit.pca_r2_train >= fit.r2_train - 1e-9  # PCA is the in-sample optimum at equal rank
    assert fit.subspace.shape == (64, 8)
    assert torch.allclose(fit.predict(n), clean, atol=0.1 * float(clean.std()))


def test_helix_explains_little_of_a_non_helical_representation():
    n = torch.arange(N, dtype=torch.float64)
    features = torch.stack([torch.cos(2 * math.pi * n / 7), torch.sin(2 * math.pi * n / 7)], 1)
    fit = fit_helix(_random_embedding(features), n.tolist())
    assert fit.r2_train < 0.05 and fit.pca_r2_train > 0.99


def test_mod_probe_recovers_planted_modulus_and_shuffled_labels_do_not():
    n = torch.arange(N)
    onehot = torch.nn.functional.one_hot(n % 5, 5).double()
    h = _random_embedding(onehot, d=32) + 0.2 * torch.randn(N, 32, generator=torch.Generator().manual_seed(5),
                                                              dtype=torch.float64)
    real = mod_probe(h, n.tolist(), 5)
    control = mod_probe(h, n.tolist(), 5, shuffle_labels=True)
    assert real.kappa.value > 0.95 and real.kappa.n == 100
    assert abs(control.kappa.value) < 0.2 and control.kappa.high > control.kappa.low
    unrelated = mod_probe(h, n.tolist(), 2)  # n mod 5 says nothing about n mod 2
    assert abs(unrelated.kappa.value) < 0.25


def test_cohen_kappa_known_values():
    assert cohen_kappa([0, 1, 0, 1], [0, 1, 0, 1]) == 1.0
    # observed 0.5, chance 0.5 -> 0
    assert cohen_kappa([0, 0, 1, 1], [0, 1, 0, 1]) == 0.0
    with pytest.raises(InputError, match="equally long"):
        cohen_kappa([0, 1], [0])


def test_bad_inputs_are_refused_with_a_message():
    with pytest.raises(InputError, match="at least 4 numbers"):
        fourier_spectrum(torch.zeros(2, 3))
    with pytest.raises(InputError, match="rows but"):
        fit_helix(torch.randn(20, 3), list(range(19)))
    with pytest.raises(InputError, match="modulus must be at least 2"):
        mod_probe(torch.randn(20, 3), list(range(20)), 1)


def test_a_constant_representation_has_no_power_and_no_significant_period():
    spectrum = fourier_spectrum(torch.ones(40, 5), n_shuffles=10)
    assert spectrum.significant_periods == [] and max(spectrum.power) == 0 and spectrum.null_threshold == 0


@pytest.mark.integration
def test_gemma_number_token_carries_the_units_digit(gemma):
    numbers = list(range(200))
    h = number_activations(gemma, numbers, [(3, "resid_post")])[(3, "resid_post")]
    spectrum = fourier_spectrum(h, n_shuffles=30)
    # The last token is the units digit: period 10 (and 5) stand above the shuffled-n null, and n mod 10 is decodable.
    assert {10.0, 5.0} <= set(spectrum.significant_periods)
    assert mod_probe(h, numbers, 10).kappa.value > 0.9
    assert abs(mod_probe(h, numbers, 10, shuffle_labels=True).kappa.value) < 0.3
    fit = fit_helix(h, numbers)
    assert fit.r2_train <= fit.pca_r2_train + 1e-9 and 0 < fit.r2_test < 1
    token_numbers, vectors = number_token_vectors(gemma, 399, "embed")
    assert token_numbers == list(range(10)) and vectors.shape == (10, gemma.cfg.d_model)
