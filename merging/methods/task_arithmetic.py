"""Task arithmetic (Ilharco et al., 2023): ``θ = θ0 + λ Σ_i w_i τ_i``.

``normalize=True`` divides the sum by ``Σ w_i`` (mergekit's ``normalize``
option; mergekit's default for task arithmetic is ``False``, as here). With
``λ = 1/n`` and unit weights this is the weight average.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from merging.methods.average import work_dtype


@dataclass(frozen=True)
class TaskArithmeticConfig:
    """``lam``: scaling λ of the summed task vectors; ``normalize``: divide by the sum of weights."""

    lam: float = 1.0
    normalize: bool = False


def combine(base: Tensor, task_vectors: Sequence[Tensor], weights, lam: float, normalize: bool) -> Tensor:
    """``θ0 + λ Σ w_i τ_i`` (÷ Σ w_i if ``normalize``), cast to the base dtype."""
    w = list(weights) if weights is not None else [1.0] * len(task_vectors)
    dt = work_dtype(base)
    delta = sum(wi * tv.to(dt) for wi, tv in zip(w, task_vectors))
    if normalize:
        delta = delta / sum(w)
    return (base.to(dt) + lam * delta).to(base.dtype)


def task_arithmetic(
    base: Tensor,
    experts: Sequence[Tensor],
    config: TaskArithmeticConfig = TaskArithmeticConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """Task arithmetic on one tensor."""
    dt = work_dtype(base)
    tvs = [e.to(dt) - base.to(dt) for e in experts]
    return combine(base, tvs, weights, config.lam, config.normalize)
