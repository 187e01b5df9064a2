"""Model Breadcrumbs (Davari & Belilovsky, 2024): drop outliers and small values, then add.

Per tensor and expert, drop the ``gamma`` fraction of largest ``|τ_i|`` (outliers)
and then the smallest until ``density`` of the entries remain
(:func:`merging.primitives.outlier_mask`); ``θ = θ0 + λ Σ w_i τ̃_i`` (mergekit's
``breadcrumbs``, no sign election). Defaults ``density=0.9``, ``gamma=0.01`` as
mergekit's examples. When ``gamma·numel`` rounds to 0 (small tensors) no outlier
is dropped, and the bottom cut still applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from merging.methods.average import work_dtype
from merging.methods.task_arithmetic import combine
from merging.primitives import outlier_mask


@dataclass(frozen=True)
class BreadcrumbsConfig:
    """``gamma``: fraction of largest magnitudes dropped; ``density``: fraction kept; λ."""

    gamma: float = 0.01
    density: float = 0.9
    lam: float = 1.0


def breadcrumbs(
    base: Tensor,
    experts: Sequence[Tensor],
    config: BreadcrumbsConfig = BreadcrumbsConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """Breadcrumbs on one tensor."""
    dt = work_dtype(base)
    tvs = [e.to(dt) - base.to(dt) for e in experts]
    kept = [tv * outlier_mask(tv, config.density, config.gamma) for tv in tvs]
    return combine(base, kept, weights, config.lam, normalize=False)
