"""Number representations on gemma-3-270m (integration tier): what docs/results.md reports, small."""

import pytest

from circuits.analyze.number_geometry import fit_helix, fourier_spectrum, mod_probe
from circuits.analyze.number_tokens import number_activations, number_token_vectors


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
