"""merging.methods (the registry): its records and views; every method on identical experts gives the base
plus the task vector."""

import torch

from merging.methods import CONFIGS, METHODS, REGISTRY
from merging.methods import (
    BreadcrumbsConfig, ConsensusConfig, DareLinearConfig, DellaLinearConfig, TaskArithmeticConfig, TiesConfig,
)


def test_registry_records_and_views():
    assert type(METHODS) is dict and type(REGISTRY) is dict
    assert set(METHODS) == set(CONFIGS) == {n for n, r in REGISTRY.items() if not r.needs_data} == {
        "weight_average", "task_arithmetic", "ties", "dare_linear", "dare_ties", "breadcrumbs", "breadcrumbs_ties",
        "della", "della_linear", "sce", "model_stock", "karcher", "slerp", "nuslerp", "multislerp", "nearswap",
        "arcee_fusion", "ram", "ramplus_tl", "passthrough", "consensus_ta", "tsv_m", "iso_c", "iso_cts", "wudi",
    }
    assert REGISTRY["closed_form"].needs_data and REGISTRY["ties"].mergekit == "ties"
    assert REGISTRY["weight_average"].mergekit == "linear" and REGISTRY["iso_c"].mergekit is None
    for r in REGISTRY.values():
        r.config()  # every config has defaults
        assert r.paper


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
    for name in ("sce", "model_stock", "karcher", "nuslerp", "multislerp"):  # means of identical inputs, up to rounding
        torch.testing.assert_close(METHODS[name](base, [expert, expert], CONFIGS[name]()), expected, msg=name)
    for name in ("slerp", "nearswap"):  # base to one expert: t = 1 gives the expert
        torch.testing.assert_close(METHODS[name](base, [expert], CONFIGS[name](t=1.0 if name == "slerp" else 1e6)),
                                   expert, msg=name)
