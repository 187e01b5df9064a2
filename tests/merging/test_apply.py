"""merging.apply (``merge``: a registry method on whole models, tensor by tensor): every method gives a
loadable state dict, random methods are seeded per tensor; in the integration tier, task arithmetic on
gemma-3-270m."""

import pytest
import torch

from merging.methods import METHODS, REGISTRY
from merging import merge
from merging.methods import DareLinearConfig, TaskArithmeticConfig
from tests.tiny_models import tiny_model
from merging.state_dicts import is_buffer


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


@pytest.mark.parametrize("style", ["gpt2", "gemma"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_gives_a_loadable_state_dict(perturb, style, method):
    base = tiny_model(style=style)
    experts = [perturb(base, seed=1), perturb(base, seed=2)][:REGISTRY[method].max_experts]
    merged = merge(method, base, experts, progress=False)
    target = tiny_model(style=style, seed=5)
    target.load_state_dict(merged)  # strict: every parameter and buffer present, right shapes
    assert torch.isfinite(target(target.to_tokens("1+2="))).all()


@pytest.fixture(scope="module")
def gemma_experts(gemma):
    """Two experts: small random task vectors on blocks 0-3, every other tensor shared with the base."""
    out = []
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        sd = {}
        for k, v in gemma.state_dict().items():
            tuned = k.startswith(tuple(f"blocks.{l}." for l in range(4))) and not is_buffer(k)
            sd[k] = v + 0.02 * v.std() * torch.randn(v.shape, generator=gen) if tuned else v
        out.append(sd)
    return out


@pytest.mark.integration
def test_task_arithmetic_on_gemma(gemma, gemma_experts):
    merged = merge("task_arithmetic", gemma, gemma_experts, TaskArithmeticConfig(lam=0.5), progress=False)
    base = gemma.state_dict()
    k = "blocks.0.mlp.W_in"
    expected = base[k] + 0.5 * ((gemma_experts[0][k] - base[k]) + (gemma_experts[1][k] - base[k]))
    assert torch.allclose(merged[k], expected, atol=1e-6)
    assert torch.equal(merged["embed.W_E"], base["embed.W_E"])
