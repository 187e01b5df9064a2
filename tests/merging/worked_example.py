"""The tests' hand-worked merge example: a 2x3 base, two task vectors and ``run`` (a registry method on them)."""

import torch

from merging.methods import CONFIGS, METHODS


T = torch.tensor
BASE = torch.ones(2, 3)
TAU_A = T([[1.0, -2.0, 3.0], [0.0, 4.0, -1.0]])
TAU_B = T([[2.0, 1.0, -1.5], [-3.0, 0.0, 0.5]])
EXPERTS = [BASE + TAU_A, BASE + TAU_B]


def run(name, config=None, **kw):
    return METHODS[name](BASE, EXPERTS, config if config is not None else CONFIGS[name](), **kw)
