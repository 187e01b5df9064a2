"""Weight averaging ("model soup"): ``θ = Σ_i w_i θ_i / Σ_i w_i``.

The base is not used (it is a valid merge target only because experts share
it); weights default to 1 (the plain mean). Computed in float32 (float64 for
float64 inputs) and cast back to the base dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class AverageConfig:
    """Weight averaging has no hyper-parameters (expert weights are passed to :func:`merging.merge`)."""


def work_dtype(t: Tensor) -> torch.dtype:
    """The dtype merges compute in: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def average(
    base: Tensor,
    experts: Sequence[Tensor],
    config: AverageConfig = AverageConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """``Σ w_i θ_i / Σ w_i`` for one tensor."""
    w = list(weights) if weights is not None else [1.0] * len(experts)
    dt = work_dtype(base)
    total = sum(wi * e.to(dt) for wi, e in zip(w, experts))
    return (total / sum(w)).to(base.dtype)
