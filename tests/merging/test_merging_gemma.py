"""Integration: closed-form merging and a baseline on the real gemma-3-270m (unprocessed)."""

import pytest
import torch
from torch.func import functional_call

from merging import SubmoduleMergeConfig, TaskArithmeticConfig, merge, merge_submodules
from merging.state_dicts import is_buffer

pytestmark = pytest.mark.integration


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


def test_attn_mlp_merge_on_gemma(gemma, gemma_experts):
    tasks = [[f"{a} + {b} = " for a, b in [(1, 2), (3, 4), (5, 1), (2, 2)]],
             [f"{a} - {b} = " for a, b in [(9, 2), (7, 4), (5, 1), (3, 2)]]]
    result = merge_submodules(gemma, gemma_experts, tasks, SubmoduleMergeConfig(level="attn_mlp", n_samples=4), progress=False)
    assert result.alphas.values.shape == (2 * gemma.cfg.n_layers, 2)
    a = result.alphas
    assert torch.equal(a["L10.mlp"], torch.zeros(2, dtype=torch.float64))  # untouched blocks: G = 0
    assert ((a["L0.attn"] > 0.2) & (a["L0.attn"] < 0.8)).all()  # independent experts: roughly half each
    ref = gemma.state_dict()
    assert result.state_dict.keys() == ref.keys()
    assert all(result.state_dict[k].shape == ref[k].shape for k in ref)
    tokens = gemma.to_tokens("2 + 3 = ")
    params = {k: v for k, v in result.state_dict.items() if not is_buffer(k)}
    assert torch.isfinite(functional_call(gemma, params, (tokens,))).all()


def test_task_arithmetic_on_gemma(gemma, gemma_experts):
    merged = merge("task_arithmetic", gemma, gemma_experts, TaskArithmeticConfig(lam=0.5), progress=False)
    base = gemma.state_dict()
    k = "blocks.0.mlp.W_in"
    expected = base[k] + 0.5 * ((gemma_experts[0][k] - base[k]) + (gemma_experts[1][k] - base[k]))
    assert torch.allclose(merged[k], expected, atol=1e-6)
    assert torch.equal(merged["embed.W_E"], base["embed.W_E"])
