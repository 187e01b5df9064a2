"""merging.methods.sce: select (largest variance), calculate (mean-square weights), erase (sign consensus) on a
4-entry example worked out by hand."""

import pytest
import torch

from circuits.errors import InputError
from merging.methods.sce import SceConfig, sce_weights, select_calculate_erase, variance_mask

T = torch.tensor
BASE = torch.ones(4)
TAU_A, TAU_B = T([3.0, -1.0, 2.0, 0.0]), T([1.0, 1.0, -4.0, 0.0])


def test_sce_by_hand():
    # weights: mean squares 14/4 and 18/4 of their sum -> 0.4375, 0.5625
    assert sce_weights(torch.stack([TAU_A, TAU_B])).tolist() == [0.4375, 0.5625]
    # elected signs of the sum [4, 0, -2, 0]: +, + (0 counts as +), -, +; zero entries never agree
    # entry 0: both agree -> (3 * 0.4375 + 1 * 0.5625) / 1; entry 1: only B -> 1; entry 2: only B -> -4; entry 3: none
    out = select_calculate_erase(BASE, [BASE + TAU_A, BASE + TAU_B], SceConfig(select_topk=1.0))
    torch.testing.assert_close(out, BASE + T([1.875, 1.0, -4.0, 0.0]))


def test_selection_keeps_the_largest_variance_entries():
    # variances over the two experts: 1, 1, 9, 0 (three nonzero): top half of 3 -> 1 entry, the third
    assert variance_mask(torch.stack([TAU_A, TAU_B]), 0.5).tolist() == [0.0, 0.0, 1.0, 0.0]
    # only entry 2 survives: weights 4/4 and 16/4 -> 0.2, 0.8; the elected sign is B's -> -4
    out = select_calculate_erase(BASE, [BASE + TAU_A, BASE + TAU_B], SceConfig(select_topk=0.5))
    torch.testing.assert_close(out, BASE + T([0.0, 0.0, -4.0, 0.0]))


def test_identical_zero_task_vectors_weigh_uniformly_and_weights_are_refused():
    assert sce_weights(torch.zeros(3, 2)).tolist() == pytest.approx([1 / 3] * 3)
    with pytest.raises(InputError, match="sce takes no per-expert weights"):
        select_calculate_erase(BASE, [BASE + TAU_A, BASE + TAU_B], weights=[1.0, 2.0])
    with pytest.raises(InputError, match="select_topk"):
        SceConfig(select_topk=0.0)
