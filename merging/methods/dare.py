"""DARE (Yu et al., 2024): drop and rescale task vectors, then add them.

Each entry of each ``τ_i`` is dropped with probability ``p`` (``drop_rate``) and
the survivors are rescaled: ``"inverse"`` multiplies by ``1/(1−p)`` (the DARE
paper; unbiased in expectation), ``"l1"`` restores each tensor's L1 norm
(mergekit's ``rescale_sum``). The result is combined by task arithmetic,
``θ0 + λ Σ w_i τ̃_i`` (mergekit's ``dare_linear``); ``consensus=True`` elects
signs and takes the disjoint mean instead (``dare_ties``).

Randomness is reproducible and order-independent: :func:`merging.merge` seeds a
``torch.Generator`` per tensor from ``(seed, key)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from merging.methods.average import work_dtype
from merging.methods.task_arithmetic import combine
from merging.primitives import disjoint_mean, elect_sign, random_drop


@dataclass(frozen=True)
class DareConfig:
    """``drop_rate`` p (0.9 as the DARE paper's LLM runs), ``rescale``, λ, ``seed``, ``consensus``."""

    drop_rate: float = 0.9
    rescale: str = "inverse"
    lam: float = 1.0
    seed: int = 0
    consensus: bool = False

    def __post_init__(self):
        if self.rescale not in ("inverse", "l1", "none"):
            raise ValueError(f"DareConfig.rescale must be 'inverse', 'l1' or 'none', got {self.rescale!r}.")
        if not 0.0 <= self.drop_rate < 1.0:
            raise ValueError(f"DareConfig.drop_rate must be in [0, 1), got {self.drop_rate}.")


def dare(
    base: Tensor,
    experts: Sequence[Tensor],
    config: DareConfig = DareConfig(),
    *,
    weights: Sequence[float] | None = None,
    generator: torch.Generator | None = None,
    **_: object,
) -> Tensor:
    """DARE on one tensor (``generator`` drives the drops)."""
    dt = work_dtype(base)
    dropped = [
        random_drop(e.to(dt) - base.to(dt), config.drop_rate, rescale=config.rescale, generator=generator)
        for e in experts
    ]
    if not config.consensus:
        return combine(base, dropped, weights, config.lam, normalize=False)
    stacked = torch.stack(dropped)
    merged = disjoint_mean(stacked, elect_sign(stacked, weights), weights)
    return (base.to(dt) + config.lam * merged).to(base.dtype)
