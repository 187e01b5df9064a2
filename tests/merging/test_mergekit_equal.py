"""Every method mergekit 0.1.5 also has equals mergekit's own per-tensor function on random tensors (to 1e-6).

mergekit is called through its public method objects (``registry.get(name)([TensorGroup], parameters=...)``).
Random sparsifiers (DARE, DELLA) draw their masks from torch's global generator
in mergekit and from a ``torch.Generator`` here: both are seeded with the same
number, so both draw identical masks.

Cross-cutting: every method module of merging.methods (and merging.primitives' consensus mask) against
mergekit, one contract for all of them.
"""

import itertools

import pytest
import torch

from merging.methods import METHODS
from merging.methods import (
    AverageConfig,
    BreadcrumbsConfig,
    BreadcrumbsTiesConfig,
    DareLinearConfig,
    DareTiesConfig,
    DellaConfig,
    DellaLinearConfig,
    KarcherConfig,
    ModelStockConfig,
    SceConfig,
    TaskArithmeticConfig,
    TiesConfig,
)

mk_registry = pytest.importorskip("mergekit.merge_methods.registry")
from mergekit.merge_methods.base import TensorGroup  # noqa: E402

SHAPES = [(7,), (5, 8), (3, 4, 6), (16, 16)]
WEIGHTS = [[1.0, 1.0], [0.7, 0.3], [1.5, -0.5, 0.8]]


def make(shape, n, seed):
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=gen)
    return base, [base + 0.1 * torch.randn(shape, generator=gen) for _ in range(n)]


def mergekit(name, base, experts, parameters, *, with_base=True, seed=None):
    tensors = [base, *experts] if with_base else list(experts)
    group = TensorGroup.from_tensors(tensors, base_index=0 if with_base else None)
    if seed is not None:
        torch.manual_seed(seed)
    (out,) = mk_registry.get(name)([group], parameters=parameters)
    return out


def ours(name, base, experts, config, weights=None, seed=None):
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return METHODS[name](base, experts, config, weights=weights, generator=gen)


def close(a, b):
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def cases():
    for shape, weights in itertools.product(SHAPES, WEIGHTS):
        yield pytest.param(shape, weights, id=f"{'x'.join(map(str, shape))}-w{weights}")


@pytest.mark.parametrize("shape,weights", cases())
@pytest.mark.parametrize("normalize", [True, False])
def test_linear_and_task_arithmetic(shape, weights, normalize):
    base, experts = make(shape, len(weights), 0)
    close(ours("weight_average", base, experts, AverageConfig(normalize=normalize), weights),
          mergekit("linear", base, experts, {"weight": weights, "normalize": normalize}, with_base=False))
    for lam in (1.0, 0.6):
        close(ours("task_arithmetic", base, experts, TaskArithmeticConfig(lam=lam, normalize=normalize), weights),
              mergekit("task_arithmetic", base, experts, {"weight": weights, "normalize": normalize, "lambda": lam}))


DENSITIES = [0.3, 0.7, "per-model"]


def _density(d, n):
    return tuple(0.2 + 0.7 * i / max(n - 1, 1) for i in range(n)) if d == "per-model" else d


@pytest.mark.parametrize("shape,weights", cases())
@pytest.mark.parametrize("density", DENSITIES)
def test_deterministic_sparsifiers(shape, weights, density):
    base, experts = make(shape, len(weights), 1)
    d = _density(density, len(weights))
    mk_d = list(d) if isinstance(d, tuple) else d
    for name, cfg, params in [
        ("ties", TiesConfig(density=d), {}),
        ("ties", TiesConfig(density=d, normalize=False, lam=0.5), {"normalize": False, "lambda": 0.5}),
        ("breadcrumbs", BreadcrumbsConfig(density=d, gamma=0.1), {"gamma": 0.1}),
        ("breadcrumbs", BreadcrumbsConfig(density=d, rescale=True), {"rescale": True}),
        ("breadcrumbs_ties", BreadcrumbsTiesConfig(density=d, gamma=0.05, normalize=True),
         {"gamma": 0.05, "normalize": True}),
    ]:
        close(ours(name, base, experts, cfg, weights),
              mergekit(name, base, experts, {"weight": weights, "density": mk_d, **params}))


def test_count_consensus_equals_mergekit_get_mask():
    from mergekit.merge_methods.generalized_task_arithmetic import get_mask

    from merging.primitives import consensus_mask

    gen = torch.Generator().manual_seed(3)
    deltas = torch.randn(5, 6, 7, generator=gen) * (torch.rand(5, 6, 7, generator=gen) > 0.3)
    for method in ("sum", "count"):
        assert torch.equal(consensus_mask(deltas, method), get_mask(deltas, method))


@pytest.mark.parametrize("shape,weights", cases())
@pytest.mark.parametrize("density", DENSITIES)
def test_random_sparsifiers_with_the_same_seed(shape, weights, density):
    base, experts = make(shape, len(weights), 2)
    d = _density(density, len(weights))
    mk_d = list(d) if isinstance(d, tuple) else d
    for name, cfg, params in [
        ("dare_linear", DareLinearConfig(density=d), {}),
        ("dare_linear", DareLinearConfig(density=d, rescale=False, lam=0.8), {"rescale": False, "lambda": 0.8}),
        ("dare_ties", DareTiesConfig(density=d), {}),
        ("dare_ties", DareTiesConfig(density=d, normalize=True), {"normalize": True}),
        ("della", DellaConfig(density=d, epsilon=0.1), {"epsilon": 0.1}),
        ("della_linear", DellaLinearConfig(density=d, epsilon=0.05, rescale=False), {"epsilon": 0.05, "rescale": False}),
    ]:
        for seed in (0, 11):
            close(ours(name, base, experts, cfg, weights, seed=seed),
                  mergekit(name, base, experts, {"weight": weights, "density": mk_d, **params}, seed=seed))


def test_inverse_density_rescale_is_the_dare_papers():
    """mergekit lacks 1/(1 − p): it equals mergekit's un-rescaled DARE with each task vector divided by its density."""
    base, experts = make((6, 9), 2, 4)
    ours_out = ours("dare_linear", base, experts, DareLinearConfig(density=(0.25, 0.5), rescale_norm="inverse_density"),
                    seed=5)
    scaled = [base + (e - base) / d for e, d in zip(experts, (0.25, 0.5))]
    ref = mergekit("dare_linear", base, scaled, {"weight": [1.0, 1.0], "density": [0.25, 0.5], "rescale": False}, seed=5)
    close(ours_out, ref)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n", [2, 3])
def test_sce_model_stock_karcher(shape, n):
    base, experts = make(shape, n, 5)
    for topk in (1.0, 0.5):
        close(ours("sce", base, experts, SceConfig(select_topk=topk)),
              mergekit("sce", base, experts, {"select_topk": topk}))
    for filter_wise in (False, True):
        close(ours("model_stock", base, experts, ModelStockConfig(filter_wise=filter_wise)),
              mergekit("model_stock", base, experts, {"filter_wise": filter_wise}))
    close(ours("karcher", base, experts, KarcherConfig(include_base=True)), mergekit("karcher", base, experts, {}))
    close(ours("karcher", base, experts, KarcherConfig()), mergekit("karcher", base, experts, {}, with_base=False))
    close(ours("karcher", base, experts, KarcherConfig(max_iter=3, tol=1e-3)),
          mergekit("karcher", base, experts, {"max_iter": 3, "tol": 1e-3}, with_base=False))


def test_model_stock_with_opposite_experts_keeps_the_base():
    base = torch.zeros(4, 5)
    tau = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    out = ours("model_stock", base, [base + tau, base - tau], ModelStockConfig())
    close(out, mergekit("model_stock", base, [base + tau, base - tau], {}))
    close(out, base)  # cos = −1, 1 + (N−1)cos = 0: the singular case keeps the base
