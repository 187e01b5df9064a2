"""merging.methods.interference: the written-out gradient equals autograd's on the loss as the paper writes it (in the
``[out, in]`` layout of a linear layer), the Adam steps equal the same Adam driven by autograd, the loss falls, task
vectors on disjoint inputs are left at their sum (the loss's optimum, 0), and non-matrix tensors get the mean."""

import pytest
import torch

from circuits.errors import InputError
from merging import merge
from merging.methods import WudiConfig
from merging.methods.interference import interference_gradient, interference_loss, wudi, wudi_delta


def randn(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def paper_loss(merged_out_in, tvs_out_in):
    """Σ_i ‖(τ_m − τ_i) τ_iᵀ‖² / ‖τ_i‖² with the [out, in] matrices of a linear layer, as the paper writes it."""
    stacked = torch.stack(tvs_out_in)
    product = torch.matmul(merged_out_in.unsqueeze(0) - stacked, stacked.transpose(1, 2))
    norms = stacked.reshape(len(tvs_out_in), -1).norm(dim=-1).square()
    return (product.square() / norms.view(-1, 1, 1)).sum()


@pytest.mark.parametrize("shape", [(6, 5), (4, 9), (40, 3)])  # [in, out]: the [in, in] route and the [out, out] one
def test_the_gradient_equals_autograd_on_the_papers_loss(shape):
    tvs = [randn(shape, i).double() for i in range(3)] + [torch.zeros(shape, dtype=torch.float64)]
    merged = randn(shape, 9).double().requires_grad_()
    loss = paper_loss(merged.T, [tv.T for tv in tvs[:3]])  # a zero task vector adds nothing to the loss
    (expected,) = torch.autograd.grad(loss, merged)
    torch.testing.assert_close(interference_gradient(tvs)(merged.detach()), expected)
    torch.testing.assert_close(interference_loss(merged.detach(), tvs), loss.detach())


def test_the_adam_steps_equal_adam_on_autograd_and_the_loss_falls():
    tvs = [randn((7, 5), 10 + i) for i in range(3)]
    ours = wudi_delta(tvs, steps=40, lr=1e-2)
    reference = torch.nn.Parameter(sum(tvs).T.clone())  # the paper's [out, in] layout
    optimizer = torch.optim.Adam([reference], lr=1e-2)
    for _ in range(40):
        optimizer.zero_grad()
        paper_loss(reference, [tv.T for tv in tvs]).backward()
        optimizer.step()
    torch.testing.assert_close(ours, reference.detach().T, atol=1e-5, rtol=1e-5)
    start = interference_loss(sum(tvs), tvs)
    assert interference_loss(wudi_delta(tvs, steps=10, lr=1e-2), tvs) < start
    assert interference_loss(ours, tvs) < 0.8 * start


def test_task_vectors_on_disjoint_inputs_stay_at_their_sum():
    """Rows of the input space no other task touches: every (τ_m − τ_i) τ_iᵀ is 0 at the sum, the loss's optimum."""
    tvs = [torch.zeros(6, 4) for _ in range(3)]
    for i, tv in enumerate(tvs):
        tv[2 * i:2 * i + 2] = randn((2, 4), i)
    assert interference_loss(sum(tvs), tvs) == 0
    assert torch.equal(wudi_delta(tvs, steps=20, lr=1e-2), sum(tvs))


def test_wudi_on_tensors_optimises_linear_layers_and_averages_the_rest():
    base = randn((2, 6, 3), 20)  # TransformerLens's W_Q [head, d_model, d_head]: the [6, 6] matrix of the layer
    experts = [base + randn((2, 6, 3), 21 + i) for i in range(2)]
    config = WudiConfig(steps=5, lr=1e-2)
    out = wudi(base, experts, config, key="blocks.0.attn.W_Q")
    as_matrix = [(e - base).permute(1, 0, 2).reshape(6, 6) for e in experts]
    expected = wudi_delta(as_matrix, 5, 1e-2).reshape(6, 2, 3).permute(1, 0, 2)
    torch.testing.assert_close(out, base + expected)
    for key in ("blocks.0.attn.b_Q", "embed.W_E"):  # a bias, an embedding (a lookup, not a linear layer)
        b, es = base[0], [e[0] for e in experts]
        torch.testing.assert_close(wudi(b, es, config, key=key), b + ((es[0] - b) + (es[1] - b)) / 2)


def test_merge_runs_wudi_and_refuses_bad_settings():
    base = {"blocks.0.mlp.W_in": randn((4, 6), 30)}
    experts = [{"blocks.0.mlp.W_in": base["blocks.0.mlp.W_in"] + randn((4, 6), 31 + i)} for i in range(3)]
    merged = merge("wudi", base, experts, WudiConfig(steps=3), progress=False)["blocks.0.mlp.W_in"]
    torch.testing.assert_close(merged, wudi(base["blocks.0.mlp.W_in"], [e["blocks.0.mlp.W_in"] for e in experts],
                                            WudiConfig(steps=3), key="blocks.0.mlp.W_in"))
    with pytest.raises(InputError, match=r"WudiConfig\(steps=-1, lr=1e-05\): steps must be >= 0 and lr in \(0, 1\]"):
        WudiConfig(steps=-1)
    with pytest.raises(InputError, match=r"lr=1e\+38\): steps must be >= 0 and lr in \(0, 1\]"):
        WudiConfig(lr=1.0e38)  # was torch's "value cannot be converted to type float without overflow"
    with pytest.raises(InputError, match="wudi takes no per-expert weights"):
        merge("wudi", base, experts, weights=[1.0, 2.0, 1.0], progress=False)
