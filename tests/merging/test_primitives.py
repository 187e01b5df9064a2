"""merging.primitives on small tensors against values worked out by hand: sign election, disjoint mean,
top-k and outlier masks (ties broken like a stable sort), chunked elementwise combinations."""

import torch

from merging.primitives import disjoint_mean, elect_sign, outlier_mask, topk_mask
from tests.merging.worked_example import T


def test_sign_election_counts_zero_as_plus_and_disjoint_mean():
    tvs = T([[[1.0, -1.0, 0.0]], [[-1.0, -1.0, 0.0]]])
    sign = elect_sign(tvs)
    assert torch.equal(sign, T([[1.0, -1.0, 1.0]]))
    # entry 0: only +1 agrees -> 1; entry 1: both -1 -> -1; entry 2: nobody -> 0
    assert torch.equal(disjoint_mean(tvs, sign), T([[1.0, -1.0, 0.0]]))
    assert torch.equal(disjoint_mean(tvs, sign, weights=[1.0, 3.0]), T([[1.0, -1.0, 0.0]]))


def test_topk_mask_keeps_at_least_one_entry():
    x = T([0.1, -3.0, 2.0])
    assert torch.equal(topk_mask(x, 0.2), T([False, True, False]))  # floor(0.6)=0 -> 1 kept
    assert torch.equal(topk_mask(x, 0.7), T([False, True, True]))
    assert torch.equal(topk_mask(x, 0.0, threshold=2.0), T([False, True, True]))


def test_breadcrumbs_gamma_rounding_to_zero_keeps_top_entries():
    # gamma * numel = 0.6 rounds to 0: nothing is cut at the top (mergekit's sort[n_bot:-0] would keep nothing)
    tc = T([[1.0, -2.0, 3.0], [0.0, 4.0, -0.5]])
    assert torch.equal(outlier_mask(tc, 0.5, 0.1), T([[False, True, True], [False, True, False]]))
    # too many outliers for the density: fewer are cut
    assert int(outlier_mask(tc, 5 / 6, 0.5).sum()) == 5


def test_masks_break_ties_like_a_stable_descending_sort():
    x = T([[1.0, -3.0, 3.0], [1.0, 0.0, -1.0]])
    # |x| descending, ties to the lower index: 3 (idx 1), 3 (idx 2), 1 (idx 0), 1 (idx 3), 1 (idx 5), 0
    assert torch.equal(topk_mask(x, 0.5), T([[True, True, True], [False, False, False]]))
    assert torch.equal(topk_mask(x, 4 / 6), T([[True, True, True], [True, False, False]]))
    # breadcrumbs: ranks 1..3 (drop the first 3, keep the next 3)
    assert torch.equal(outlier_mask(x, 0.5, 1 / 6), T([[True, False, True], [True, False, False]]))


def test_elementwise_chunks_match_unchunked():
    from merging.primitives import elementwise_chunks

    gen = torch.Generator().manual_seed(0)
    tvs = [torch.randn(5, 7, generator=gen) for _ in range(3)]
    fn = lambda s: disjoint_mean(s, elect_sign(s))  # noqa: E731
    assert torch.equal(elementwise_chunks(tvs, fn, chunk=4), fn(torch.stack(tvs)))
