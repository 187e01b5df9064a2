"""merging.methods.consensus: Consensus TA (TALL masks) on 2x3 tensors against values worked out by hand."""

import pytest
import torch

from merging.methods import ConsensusConfig
from merging.primitives import tall_masks
from tests.merging.worked_example import BASE, T, TAU_A, TAU_B, run


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
