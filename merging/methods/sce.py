"""SCE (Wan et al., 2024, "FuseChat"): select, calculate, erase; mergekit's ``sce``.

1. **Select**: keep the ``select_topk`` fraction of entries where the task
   vectors vary most across experts (largest variance over experts, counted
   among the entries with nonzero variance); 1.0 keeps all.
2. **Calculate**: each expert's weight is the mean square of its (selected)
   task vector, normalised to sum 1 (uniform when all are ~0).
3. **Erase**: TIES' sign election (``sum``) masks the disagreeing entries;
   ``θ = θ0 + Σ_i η_i m_i τ_i / max(Σ_i η_i m_i, 1e-6)``.

No λ and no per-expert weights, as mergekit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from merging.methods.config_checks import check_config, check_no_weights
from merging.methods.mergekit_spec import INT8_MASK, MergekitParameter, MergekitSpec
from merging.primitives import consensus_mask, task_vectors


@dataclass(frozen=True)
class SceConfig:
    """``select_topk``: fraction of highest-variance entries kept (mergekit's default 1.0 keeps all)."""

    select_topk: float = 1.0

    def __post_init__(self):
        check_config(self)


SCE_MERGEKIT = MergekitSpec(parameters=(MergekitParameter("select_topk"), INT8_MASK))  # no weights, as mergekit


def variance_mask(tvs: Tensor, fraction: float) -> Tensor:
    """Mask of the ``fraction`` of entries with the largest variance over experts (``tvs``: ``[n, ...]``)."""
    if fraction >= 1:
        return torch.ones_like(tvs[0])
    var = torch.var(tvs, dim=0, unbiased=False)
    k = int(torch.count_nonzero(var) * fraction)
    mask = torch.zeros_like(var)
    if k > 0:
        mask.view(-1)[torch.topk(var.abs().view(-1), k=k, largest=True).indices] = 1
    return mask


def sce_weights(tvs: Tensor) -> Tensor:
    """Per-expert weight: mean square of its task vector over the sum of them (uniform when the sum is ~0)."""
    w = tvs.square().reshape(tvs.shape[0], -1).mean(dim=1)
    total = float(w.sum())
    return torch.ones_like(w) / w.shape[0] if abs(total) < 1e-6 else w / total


def select_calculate_erase(
    base: Tensor,
    experts: Sequence[Tensor],
    config: SceConfig = SceConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """SCE on one tensor."""
    check_no_weights(weights, "sce")
    tvs = torch.stack(task_vectors(base, experts))
    if config.select_topk < 1:
        tvs = tvs * variance_mask(tvs, config.select_topk).unsqueeze(0)
    erase = consensus_mask(tvs, "sum").to(tvs.dtype)
    eta = sce_weights(tvs).view(-1, *([1] * (tvs.dim() - 1)))
    kept = eta * erase
    merged = (tvs * kept).sum(dim=0) / kept.sum(dim=0).clamp(min=1e-6)
    return (base.to(tvs.dtype) + merged).to(base.dtype)
