"""Consensus task arithmetic (Wang et al., 2024, "Localizing Task Information").

TALL masks ``mask_t = |τ_t| >= λ_t |τ_MTL − τ_t|`` with ``τ_MTL = Σ_i τ_i`` mark the
entries where task ``t`` matters relative to the others. Entries selected by at
least ``k`` masks (``k = 2``: drop "selfish" weights used by one task only, and
the unused ones) are kept: ``θ = θ0 + λ · (Σ_i w_i τ_i) ⊙ [Σ_t mask_t >= k]``.

``tall_lambda`` is λ_t (one value for all tasks, or one per expert); the paper
picks λ_t per task on validation data from {0.2, ..., 0.6}; the default 0.4 is
the middle of that range. The masks use the unweighted ``τ_MTL`` of the brief.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from merging.methods.average import work_dtype
from merging.primitives import elementwise_chunks, stack_weights, tall_masks


@dataclass(frozen=True)
class ConsensusConfig:
    """``tall_lambda``: λ_t (float or one per expert); ``k``: masks that must agree; ``lam``: λ."""

    tall_lambda: float | tuple[float, ...] = 0.4
    k: int = 2
    lam: float = 1.0


def consensus(
    base: Tensor,
    experts: Sequence[Tensor],
    config: ConsensusConfig = ConsensusConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """Consensus TA on one tensor."""
    dt = work_dtype(base)
    n = len(experts)
    lambdas = [config.tall_lambda] * n if isinstance(config.tall_lambda, (int, float)) else list(config.tall_lambda)
    if len(lambdas) != n:
        raise ValueError(f"ConsensusConfig.tall_lambda has {len(lambdas)} values for {n} experts.")
    w = list(weights) if weights is not None else [1.0] * n

    def combine(stacked: Tensor) -> Tensor:  # stacked: [n_experts, chunk] task vectors
        keep = tall_masks(stacked, lambdas).sum(0) >= config.k
        return (stacked * stack_weights(w, stacked[0])).sum(0) * keep

    merged = elementwise_chunks([e.to(dt) - base.to(dt) for e in experts], combine)
    return (base.to(dt) + config.lam * merged).to(base.dtype)
