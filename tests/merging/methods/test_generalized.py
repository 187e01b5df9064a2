"""merging.methods.generalized (task arithmetic, TIES, DARE, Breadcrumbs) on 2x3 tensors against values
worked out by hand; TIES over the whole model differs from TIES per tensor."""

import pytest
import torch

from merging.methods import METHODS
from merging import merge
from merging.methods import BreadcrumbsConfig, DareLinearConfig, TaskArithmeticConfig, TiesConfig
from merging.primitives import outlier_mask, random_drop
from tests.merging.worked_example import BASE, T, TAU_A, TAU_B, run


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


def test_breadcrumbs():
    tc = T([[1.0, -2.0, 3.0], [0.0, 4.0, -0.5]])
    td = T([[0.5, 0.25, -1.0], [2.0, -3.0, 0.1]])
    # gamma 1/6 drops the largest entry; density 0.5 keeps the next 3
    assert torch.equal(outlier_mask(tc, 0.5, 1 / 6), T([[True, True, True], [False, False, False]]))
    out = METHODS["breadcrumbs"](BASE, [BASE + tc, BASE + td], BreadcrumbsConfig(gamma=1 / 6, density=0.5))
    assert torch.equal(out, BASE + T([[1.5, -2.0, 2.0], [2.0, 0.0, 0.0]]))
