"""TIES-merging (Yadav et al., 2023): trim, elect sign, disjoint mean.

1. **Trim**: keep the top ``density`` fraction of each ``|τ_i|`` (0.2 in Dai et
   al.'s setting), zero the rest.
2. **Elect**: per entry, ``s = sign(Σ_i w_i τ̂_i)``, zero counted as ``+``.
3. **Disjoint mean**: average the nonzero ``τ̂_i`` entries whose sign is ``s``
   (weighted by ``w_i``); ``θ = θ0 + λ · mean``.

Scope of the top-k: ``"tensor"`` (default) trims every tensor on its own, as
mergekit 0.1.5; ``"model"`` uses one magnitude threshold per expert over all
merged parameters, as FusionBench (which flattens the whole state dict).
The model scope needs a pre-pass (:func:`ties_thresholds`) that holds one
expert's flattened ``|τ_i|`` in memory at a time. ``normalize=False`` sums the
agreeing entries instead of averaging them (mergekit's option).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from merging.methods.average import work_dtype
from merging.primitives import disjoint_mean, elect_sign, elementwise_chunks, kth_largest_magnitude, stack_weights, topk_mask


@dataclass(frozen=True)
class TiesConfig:
    """``density``: fraction kept by the trim; ``lam``: λ; ``scope``: ``"tensor"`` or ``"model"`` top-k."""

    density: float = 0.2
    lam: float = 1.0
    scope: str = "tensor"
    normalize: bool = True

    def __post_init__(self):
        if self.scope not in ("tensor", "model"):
            raise ValueError(f"TiesConfig.scope must be 'tensor' or 'model', got {self.scope!r}.")
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"TiesConfig.density must be in (0, 1], got {self.density}.")


def ties(
    base: Tensor,
    experts: Sequence[Tensor],
    config: TiesConfig = TiesConfig(),
    *,
    weights: Sequence[float] | None = None,
    thresholds: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """TIES on one tensor; ``thresholds`` (one per expert) switch the trim to whole-model top-k."""
    if config.scope == "model" and thresholds is None:
        raise ValueError("TIES with scope='model' needs per-expert thresholds: use merging.merge or ties_thresholds.")
    dt = work_dtype(base)
    trimmed = []
    for i, e in enumerate(experts):
        tv = e.to(dt) - base.to(dt)
        thr = thresholds[i] if config.scope == "model" else None
        trimmed.append(tv.mul_(topk_mask(tv, config.density, threshold=thr)))
    w = list(weights) if weights is not None else [1.0] * len(experts)

    def combine(stacked: Tensor) -> Tensor:
        sign = elect_sign(stacked, w)
        if config.normalize:
            return disjoint_mean(stacked, sign, w)
        agree = torch.sign(stacked) == sign
        return (stacked * agree * stack_weights(w, stacked[0])).sum(0)

    merged = elementwise_chunks(trimmed, combine)
    return (base.to(dt) + config.lam * merged).to(base.dtype)


def ties_thresholds(base, experts, keys: Sequence[str], density: float) -> list[float]:
    """Per-expert magnitude threshold keeping the top ``density`` of ``|τ_i|`` over all ``keys``.

    ``base`` and ``experts`` are :class:`merging.state_dicts.StateDictSource`.
    """
    out = []
    for e in experts:
        flat = torch.cat([(e.get(k).float() - base.get(k).float()).abs().reshape(-1) for k in keys])
        out.append(kth_largest_magnitude(flat, density))
        del flat
    return out
