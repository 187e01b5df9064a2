"""Heuristic-neuron classification recovers planted patterns and calls noise 'other'."""

import pytest
import torch

from circuits.errors import InputError
from circuits.analyze.heuristic_neurons import HEURISTIC_TYPES, census, classify_grids


def _planted() -> tuple[torch.Tensor, list[str]]:
    a, b = torch.meshgrid(torch.arange(10.0), torch.arange(10.0), indexing="ij")
    s = a + b
    grids = [
        ((a >= 3) & (a <= 5)).double() * 2.0,
        ((s >= 10) & (s <= 13)).double(),
        (s % 2 == 0).double() * 3.0,
        (a == b).double(),
        -((b >= 6)).double(),  # a neuron that is off on its pattern
    ]
    noise = torch.Generator().manual_seed(0)
    grids = [g + 0.05 * torch.randn(10, 10, generator=noise, dtype=torch.float64) for g in grids]
    grids.append(torch.randn(10, 10, generator=noise, dtype=torch.float64))  # no pattern
    return torch.stack(grids), ["operand_range", "result_range", "modulus", "identical_operands", "operand_range", "other"]


def test_planted_patterns_are_recovered():
    grids, expected = _planted()
    labels = classify_grids(grids)
    assert [l.type for l in labels] == expected
    assert labels[0].pattern == "a in 3..5" and labels[1].pattern == "a+b in 10..13"
    assert labels[2].pattern.startswith("a+b ≡") and "mod 2" in labels[2].pattern
    assert all(l.correlation > 0.95 for l in labels[:5])


def test_noise_grids_are_mostly_other():
    grids = torch.randn(50, 10, 10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    counts = census(classify_grids(grids))
    assert counts["other"]["fraction"] >= 0.9
    assert set(counts) == set(HEURISTIC_TYPES)
    assert abs(sum(c["fraction"] for c in counts.values()) - 1) < 1e-12


def test_bad_grid_is_refused():
    with pytest.raises(InputError, match="grids\\[neuron, a, b\\]"):
        classify_grids(torch.zeros(10, 10))
