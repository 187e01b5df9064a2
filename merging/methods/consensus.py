"""Consensus task arithmetic (Wang et al., 2024, "Localizing Task Information"); not in mergekit.

TALL masks ``mask_t = |τ_t| >= λ_t |τ_MTL − τ_t|`` with ``τ_MTL = Σ_i τ_i`` mark the
entries where task ``t`` matters relative to the others. Entries selected by at
least ``k`` masks (``k = 2``: drop "selfish" weights used by one task only, and
the unused ones) are kept: ``θ = θ0 + λ · (Σ_i w_i τ_i) ⊙ [Σ_t mask_t >= k]``.

``tall_lambda`` is λ_t (one value for all tasks, or one per expert); the paper
picks λ_t per task on validation data from {0.2, ..., 0.6}; the default 0.4 is
the middle of that range. The masks use the unweighted ``τ_MTL``. ``k`` must not
exceed the number of experts (no entry could be kept).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from circuits.errors import InputError
from merging.methods.config_checks import check_config, check_weights
from merging.methods.mergekit_spec import INT8_MASK, MergekitParameter, MergekitSpec
from merging.primitives import elementwise_chunks, per_expert, stack_weights, tall_masks, task_vectors, work_dtype


@dataclass(frozen=True)
class ConsensusConfig:
    """``tall_lambda``: λ_t (float or one per expert); ``k``: masks that must agree; ``lam``: λ."""

    tall_lambda: float | tuple[float, ...] = 0.4
    k: int = 2
    lam: float = 1.0

    def __post_init__(self):
        check_config(self)
        if self.k < 1:
            raise InputError(f"ConsensusConfig.k={self.k}: at least 1 mask must select an entry.")


# Not in mergekit: its YAML under our name consensus_ta; weights optional (default 1), the base is θ0.
CONSENSUS_MERGEKIT = MergekitSpec(
    parameters=(
        MergekitParameter("tall_lambda"),
        MergekitParameter("k", kind=int),
        MergekitParameter("lambda", "lam"),
        INT8_MASK,
    ),
    takes_weights=True,
)


def consensus_task_arithmetic(
    base: Tensor,
    experts: Sequence[Tensor],
    config: ConsensusConfig = ConsensusConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """Consensus TA on one tensor."""
    n = len(experts)
    if config.k > n:
        raise InputError(
            f"ConsensusConfig.k={config.k} but only {n} experts: an entry can be selected by at most {n} masks, "
            f"so nothing would be kept. Use k <= {n} (k=2 is the paper's)."
        )
    lambdas = per_expert(config.tall_lambda, n, "ConsensusConfig.tall_lambda")
    w = check_weights(weights, n)

    def keep_consensus(stacked: Tensor) -> Tensor:  # stacked: [n_experts, chunk] task vectors
        keep = tall_masks(stacked, lambdas).sum(0) >= config.k
        return (stacked * stack_weights(w, stacked[0])).sum(0) * keep

    merged = elementwise_chunks(task_vectors(base, experts), keep_consensus)
    return (base.to(work_dtype(base)) + config.lam * merged).to(base.dtype)
