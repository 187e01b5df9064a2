"""Merge baselines on 2x3 tensors against values worked out by hand."""

import pytest
import torch

from merging import CONFIGS, METHODS, REGISTRY, merge
from merging.methods import (
    BreadcrumbsConfig,
    ConsensusConfig,
    DareLinearConfig,
    DellaLinearConfig,
    TaskArithmeticConfig,
    TiesConfig,
)
from merging.primitives import disjoint_mean, elect_sign, outlier_mask, random_drop, tall_masks, topk_mask

T = torch.tensor
BASE = torch.ones(2, 3)
TAU_A = T([[1.0, -2.0, 3.0], [0.0, 4.0, -1.0]])
TAU_B = T([[2.0, 1.0, -1.5], [-3.0, 0.0, 0.5]])
EXPERTS = [BASE + TAU_A, BASE + TAU_B]


def run(name, config=None, **kw):
    return METHODS[name](BASE, EXPERTS, config if config is not None else CONFIGS[name](), **kw)


def test_registry_records_and_views():
    assert type(METHODS) is dict and type(REGISTRY) is dict
    assert set(METHODS) == set(CONFIGS) == {n for n, r in REGISTRY.items() if not r.needs_data} == {
        "weight_average", "task_arithmetic", "ties", "dare_linear", "dare_ties", "breadcrumbs", "breadcrumbs_ties",
        "della", "della_linear", "sce", "model_stock", "karcher", "consensus_ta", "tsv_m", "iso_c", "iso_cts",
    }
    assert REGISTRY["closed_form"].needs_data and REGISTRY["ties"].mergekit == "ties"
    assert REGISTRY["weight_average"].mergekit == "linear" and REGISTRY["iso_c"].mergekit is None
    for r in REGISTRY.values():
        r.config()  # every config has defaults
        assert r.paper


def test_weight_average():
    assert torch.equal(run("weight_average"), T([[2.5, 0.5, 1.75], [-0.5, 3.0, 0.75]]))
    # weights 3:1 -> base + (3 tau_A + tau_B) / 4
    assert torch.equal(run("weight_average", weights=[3, 1]), T([[2.25, -0.25, 2.875], [0.25, 4.0, 0.375]]))


def test_task_arithmetic():
    assert torch.equal(run("task_arithmetic"), T([[4.0, 0.0, 2.5], [-2.0, 5.0, 0.5]]))
    half = run("task_arithmetic", TaskArithmeticConfig(lam=0.5))
    assert torch.equal(half, T([[2.5, 0.5, 1.75], [-0.5, 3.0, 0.75]]))
    assert torch.equal(run("task_arithmetic", TaskArithmeticConfig(normalize=True)), half)


def test_ties_per_tensor():
    # density 0.5 keeps 3 of 6: tau_A -> [[0,-2,3],[0,4,0]], tau_B -> [[2,0,-1.5],[-3,0,0]];
    # signs of the sum [[2,-2,1.5],[-3,4,0]] -> [[+,-,+],[-,+,+]]; disjoint mean -> [[2,-2,3],[-3,4,0]]
    out = run("ties", TiesConfig(density=0.5))
    assert torch.equal(out, T([[3.0, -1.0, 4.0], [-2.0, 5.0, 1.0]]))
    # lambda scales the merged task vector
    assert torch.equal(run("ties", TiesConfig(density=0.5, lam=0.5)), BASE + 0.5 * T([[2.0, -2.0, 3.0], [-3.0, 4.0, 0.0]]))
    # normalize=False sums the agreeing entries (entry [1,2]: -1 + 0.5 elects -, keeps -1)
    assert torch.equal(run("ties", TiesConfig(density=1.0, normalize=False)), T([[4.0, -1.0, 4.0], [-2.0, 5.0, 0.0]]))


def test_ties_whole_model_topk_differs_from_per_tensor():
    base = {"w": BASE, "v": torch.zeros(2)}
    experts = [{"w": BASE + TAU_A, "v": T([10.0, 9.0])}, {"w": BASE + TAU_B, "v": T([0.2, -5.0])}]
    # model scope, density 0.5 of 8 entries: A keeps {10, 9, 4, 3}, B keeps {5, 3, 2, 1.5}
    out = merge("ties", base, experts, TiesConfig(density=0.5, scope="model"), progress=False)
    assert torch.equal(out["w"], T([[3.0, 1.0, 4.0], [-2.0, 5.0, 1.0]]))
    assert torch.equal(out["v"], T([10.0, 9.0]))
    per_tensor = merge("ties", base, experts, TiesConfig(density=0.5), progress=False)
    assert torch.equal(per_tensor["v"], T([10.0, -5.0]))
    with pytest.raises(ValueError, match="scope"):
        TiesConfig(scope="layer")


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


def test_dare_drops_and_rescales():
    gen = torch.Generator().manual_seed(0)
    x = torch.arange(1.0, 2001.0)
    inv = random_drop(x, 0.75, rescale="inverse", generator=gen)
    kept = inv != 0
    assert torch.equal(inv[kept], 4.0 * x[kept])  # survivors times 1/(1-p)
    assert 0.2 < kept.float().mean() < 0.3
    l1 = random_drop(x, 0.75, rescale="l1", generator=torch.Generator().manual_seed(1))
    assert torch.allclose(l1.abs().sum(), x.abs().sum())
    factor = x.sum() / x[l1 != 0].sum()
    assert torch.allclose(l1[l1 != 0], factor * x[l1 != 0])
    # density 1 is task arithmetic; seeded -> reproducible; different seeds differ
    assert torch.equal(run("dare_linear", DareLinearConfig(density=1.0)), run("task_arithmetic"))
    inverse = DareLinearConfig(density=0.5, rescale_norm="inverse_density")
    a = run("dare_linear", inverse, generator=torch.Generator().manual_seed(3))
    b = run("dare_linear", inverse, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    # each entry of the merged delta is a sum of {0, 2 tau_A} and {0, 2 tau_B}
    d = a - BASE
    options = torch.stack([0 * TAU_A, 2 * TAU_A, 2 * TAU_B, 2 * TAU_A + 2 * TAU_B])
    assert ((options - d).abs() < 1e-6).any(0).all()


def test_dare_merge_is_seeded_per_tensor_and_order_independent():
    base = {"a": torch.zeros(50), "b": torch.zeros(50)}
    experts = [{"a": torch.ones(50), "b": torch.ones(50)}]
    one = merge("dare_linear", base, experts, DareLinearConfig(density=0.5, seed=7), progress=False)
    rev = merge("dare_linear", {"b": base["b"], "a": base["a"]}, experts, DareLinearConfig(density=0.5, seed=7),
                progress=False)
    other = merge("dare_linear", base, experts, DareLinearConfig(density=0.5, seed=8), progress=False)
    assert torch.equal(one["a"], rev["a"]) and torch.equal(one["b"], rev["b"])
    assert not torch.equal(one["a"], other["a"])
    assert not torch.equal(one["a"], one["b"])  # different tensors get different masks


def test_breadcrumbs():
    tc = T([[1.0, -2.0, 3.0], [0.0, 4.0, -0.5]])
    td = T([[0.5, 0.25, -1.0], [2.0, -3.0, 0.1]])
    # gamma 1/6 drops the largest entry; density 0.5 keeps the next 3
    assert torch.equal(outlier_mask(tc, 0.5, 1 / 6), T([[True, True, True], [False, False, False]]))
    out = METHODS["breadcrumbs"](BASE, [BASE + tc, BASE + td], BreadcrumbsConfig(gamma=1 / 6, density=0.5))
    assert torch.equal(out, BASE + T([[1.5, -2.0, 2.0], [2.0, 0.0, 0.0]]))


def test_breadcrumbs_gamma_rounding_to_zero_keeps_top_entries():
    # gamma * numel = 0.6 rounds to 0: nothing is cut at the top (mergekit's sort[n_bot:-0] would keep nothing)
    tc = T([[1.0, -2.0, 3.0], [0.0, 4.0, -0.5]])
    assert torch.equal(outlier_mask(tc, 0.5, 0.1), T([[False, True, True], [False, True, False]]))
    # too many outliers for the density: fewer are cut
    assert int(outlier_mask(tc, 5 / 6, 0.5).sum()) == 5


def test_consensus_ta():
    # tau_MTL = [[3,-1,1.5],[-3,4,-0.5]]; with lambda 0.5:
    # mask_A = |tau_A| >= 0.5|tau_B| = [[T,T,T],[F,T,T]]; mask_B = |tau_B| >= 0.5|tau_A| = [[T,T,T],[T,F,T]]
    masks = tall_masks(torch.stack([TAU_A, TAU_B]), [0.5, 0.5])
    assert torch.equal(masks[0], T([[True, True, True], [False, True, True]]))
    assert torch.equal(masks[1], T([[True, True, True], [True, False, True]]))
    out = run("consensus_ta", ConsensusConfig(tall_lambda=0.5, k=2))
    assert torch.equal(out, BASE + T([[3.0, -1.0, 1.5], [0.0, 0.0, -0.5]]))
    assert torch.equal(run("consensus_ta", ConsensusConfig(tall_lambda=0.5, k=1)), run("task_arithmetic"))
    with pytest.raises(ValueError, match="tall_lambda"):
        run("consensus_ta", ConsensusConfig(tall_lambda=(0.5,)))


def test_identical_experts_give_base_plus_task_vector():
    torch.manual_seed(0)
    base = torch.randn(4, 5)
    expert = base + 0.1 * torch.randn(4, 5)
    expected = base + (expert - base)
    configs = {
        "weight_average": None,
        "task_arithmetic": TaskArithmeticConfig(normalize=True),
        "ties": TiesConfig(density=1.0),
        "dare_linear": DareLinearConfig(lam=0.5),
        "breadcrumbs": BreadcrumbsConfig(gamma=0.0, density=1.0, lam=0.5),
        "della_linear": DellaLinearConfig(lam=0.5),
        "consensus_ta": ConsensusConfig(lam=0.5),
    }
    for name, cfg in configs.items():
        out = METHODS[name](base, [expert, expert], cfg if cfg is not None else CONFIGS[name]())
        assert torch.equal(out, expert if name == "weight_average" else expected), name
        assert out.dtype == base.dtype
    for name in ("sce", "model_stock", "karcher"):  # averages of identical inputs, up to rounding
        torch.testing.assert_close(METHODS[name](base, [expert, expert], CONFIGS[name]()), expected, msg=name)


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
