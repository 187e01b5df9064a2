"""merging.lines: LiNeS scales each layer's merged task vector linearly with depth; the default changes nothing."""

import torch

from merging.lines import LinesConfig
from merging import merge
from merging.methods import TaskArithmeticConfig


def test_lines_scales_each_layer_linearly(gpt2_model, perturb):
    experts = [perturb(gpt2_model, seed=1), perturb(gpt2_model, seed=2)]
    plain = merge("task_arithmetic", gpt2_model, experts, TaskArithmeticConfig(), progress=False)
    scaled = merge("task_arithmetic", gpt2_model, experts, TaskArithmeticConfig(), lines=LinesConfig(0.2, 0.6),
                   progress=False)
    base = gpt2_model.state_dict()
    n_layers = gpt2_model.cfg.n_layers
    assert n_layers >= 2
    for key, value in scaled.items():
        if key.endswith(("IGNORE", "mask")):
            assert torch.equal(value, base[key])
            continue
        if key.startswith("blocks."):
            depth = int(key.split(".")[1])
        else:
            depth = 0 if key.startswith(("embed", "pos_embed")) else n_layers - 1
        lam = 0.2 + 0.6 * depth / (n_layers - 1)
        torch.testing.assert_close(value, base[key] + lam * (plain[key] - base[key]), msg=key)
    same = merge("ties", gpt2_model, experts, lines=LinesConfig(), progress=False)
    assert all(torch.equal(same[k], v) for k, v in merge("ties", gpt2_model, experts, progress=False).items())
