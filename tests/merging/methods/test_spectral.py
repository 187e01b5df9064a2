"""merging.methods.spectral: TSV-M, Iso-C and Iso-CTS against their papers' formulas computed plainly (numpy),
plus their properties."""

import numpy as np
import pytest
import torch

from merging.methods import IsoCConfig, IsoCtsConfig, TsvConfig
from merging.methods.spectral import iso_c, iso_cts, tsv_m
from merging.methods.spectral import matrix_view


def make(shape, n, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=gen, dtype=dtype)
    return base, [base + 0.1 * torch.randn(shape, generator=gen, dtype=dtype) for _ in range(n)]


def polar(x):
    """Nearest matrix with orthonormal columns, P Qᵀ."""
    p, _, qh = np.linalg.svd(x, full_matrices=False)
    return p @ qh


def tsv_plain(tvs):
    r = min(tvs[0].shape)
    k = max(1, r // len(tvs))
    svds = [np.linalg.svd(t, full_matrices=False) for t in tvs]
    u = np.concatenate([s[0][:, :k] for s in svds], axis=1)
    sigma = np.concatenate([s[1][:k] for s in svds])
    v = np.concatenate([s[2][:k].T for s in svds], axis=1)
    return polar(u) @ np.diag(sigma) @ polar(v).T


def iso_c_plain(tvs):
    u, s, vh = np.linalg.svd(sum(tvs), full_matrices=False)
    return s.mean() * u @ vh


def iso_cts_plain(tvs, f):
    u, s, vh = np.linalg.svd(sum(tvs), full_matrices=False)
    r = len(s)
    k = int(f * r)
    per = (r - k) // len(tvs)
    us, ss, vs = [u[:, :k]], [s[:k]], [vh[:k].T]
    for t in tvs:
        proj = t - u[:, :k] @ u[:, :k].T @ t
        ut, st, vht = np.linalg.svd(proj, full_matrices=False)
        us.append(ut[:, :per])
        ss.append(st[:per])
        vs.append(vht[:per].T)
    return np.concatenate(ss).mean() * polar(np.concatenate(us, 1)) @ polar(np.concatenate(vs, 1)).T


@pytest.mark.parametrize("shape,n", [((8, 6), 2), ((6, 9), 3), ((10, 10), 4)])
def test_against_plain_formulas(shape, n):
    base, experts = make(shape, n, seed=n)
    tvs = [(e - base).numpy() for e in experts]
    for fn, cfg, plain in [
        (tsv_m, TsvConfig(alpha=0.7), lambda t: 0.7 * tsv_plain(t)),
        (iso_c, IsoCConfig(alpha=1.3), lambda t: 1.3 * iso_c_plain(t)),
        (iso_cts, IsoCtsConfig(alpha=0.9, common_space_fraction=0.5), lambda t: 0.9 * iso_cts_plain(t, 0.5)),
        (iso_cts, IsoCtsConfig(), lambda t: iso_cts_plain(t, 0.8)),
    ]:
        out = fn(base, experts, cfg)
        np.testing.assert_allclose((out - base).numpy(), plain(tvs), atol=1e-10, err_msg=fn.__name__)


def test_iso_c_update_has_equal_singular_values():
    base, experts = make((12, 7), 3, seed=0)
    update = iso_c(base, experts, IsoCConfig(alpha=1.0)) - base
    s = torch.linalg.svdvals(update)
    assert torch.allclose(s, s.mean().expand_as(s), rtol=1e-10)
    total_sv = torch.linalg.svdvals(sum(e - base for e in experts))
    assert torch.isclose(s.mean(), total_sv.mean())
    # same singular subspaces as task arithmetic's sum
    u_ta = torch.linalg.svd(sum(e - base for e in experts), full_matrices=False)[0]
    u_iso = torch.linalg.svd(update, full_matrices=False)[0]
    assert torch.allclose(u_ta @ u_ta.T, u_iso @ u_iso.T, atol=1e-10)


def test_iso_cts_update_is_isotropic_with_common_and_task_rank():
    base, experts = make((10, 10), 2, seed=1)
    update = iso_cts(base, experts, IsoCtsConfig(common_space_fraction=0.6)) - base
    s = torch.linalg.svdvals(update)
    assert torch.allclose(s, s[0].expand_as(s), rtol=1e-10)  # k=6 common + 2 x 2 task-specific = full rank 10
    full = iso_cts(base, experts, IsoCtsConfig(common_space_fraction=1.0))
    torch.testing.assert_close(full, iso_c(base, experts, IsoCConfig()))  # no task-specific room: Iso-C


def test_tsv_m_orthogonalizes_the_task_subspaces():
    base, experts = make((9, 8), 2, seed=2)
    tvs = [e - base for e in experts]
    update = tsv_m(base, experts, TsvConfig()) - base
    k = 8 // 2
    kept = torch.cat([torch.linalg.svdvals(t)[:k] for t in tvs])
    # U⊥ and V⊥ have orthonormal columns, so the update's singular values are exactly the kept ones
    assert torch.allclose(torch.linalg.svdvals(update), kept.sort(descending=True).values, atol=1e-10)
    # tasks living in orthogonal row/column blocks are already orthogonal: TSV-M is the sum of their top-k parts
    a, b = torch.zeros(9, 8, dtype=torch.float64), torch.zeros(9, 8, dtype=torch.float64)
    a[:4, :4], b[4:8, 4:] = tvs[0][:4, :4], tvs[1][4:8, 4:]
    out = tsv_m(torch.zeros(9, 8, dtype=torch.float64), [a, b], TsvConfig())
    torch.testing.assert_close(out, a + b)  # each block has rank 4 = k: nothing is cut


def test_non_matrices_get_the_mean_task_vector_and_heads_are_one_matrix():
    base, experts = make((2, 3), 2, seed=3)
    mean = sum(e - base for e in experts) / 2
    for fn, cfg in [(tsv_m, TsvConfig(alpha=0.5)), (iso_c, IsoCConfig(alpha=0.5)), (iso_cts, IsoCtsConfig(alpha=0.5))]:
        torch.testing.assert_close(fn(base, experts, cfg, key="blocks.0.attn.b_Q"), base + 0.5 * mean)
        assert not torch.allclose(fn(base, experts, cfg), base + 0.5 * mean)  # without a key a 2-D tensor is a matrix
    # W_Q [head, d_model, d_head] is merged as the [d_model, head*d_head] matrix of the layer
    wq_base, wq_experts = make((3, 5, 2), 2, seed=4)
    out = iso_c(wq_base, wq_experts, IsoCConfig(), key="blocks.1.attn.W_Q")
    flat = lambda t: matrix_view("blocks.1.attn.W_Q", t)[0]  # noqa: E731
    assert flat(wq_base).shape == (5, 6)
    torch.testing.assert_close(flat(out), iso_c(flat(wq_base), [flat(e) for e in wq_experts], IsoCConfig()))
    wo = torch.randn(3, 2, 5)
    view, back = matrix_view("blocks.0.attn.W_O", wo)
    assert view.shape == (6, 5) and torch.equal(back(view), wo)
