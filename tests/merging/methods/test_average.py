"""merging.methods.average: the weighted average on 2x3 tensors against values worked out by hand."""

import torch

from tests.merging.worked_example import T, run


def test_weight_average():
    assert torch.equal(run("weight_average"), T([[2.5, 0.5, 1.75], [-0.5, 3.0, 0.75]]))
    # weights 3:1 -> base + (3 tau_A + tau_B) / 4
    assert torch.equal(run("weight_average", weights=[3, 1]), T([[2.25, -0.25, 2.875], [0.25, 4.0, 0.375]]))
