"""Building blocks of the weight-space merges, each on one tensor: mergekit's generalized task arithmetic.

Every sparsify-and-combine merge (task arithmetic, TIES, DARE, Breadcrumbs,
DELLA and their ``_ties`` / ``_linear`` variants) is one pipeline, as in
mergekit 0.1.5's ``GeneralizedTaskArithmeticMerge``:

1. **Task vectors** ``τ_i = θ_i − θ0`` (:func:`task_vectors`), in :func:`work_dtype`.
2. **Sparsify** each ``τ_i`` (:data:`SPARSIFIERS`, :func:`sparsify`):

   * ``"none"``;
   * ``"magnitude"``: keep the top ``density`` fraction of ``|τ_i|``
     (:func:`topk_mask`; TIES' trim). ``k = max(1, floor(density · numel))`` as
     mergekit (a positive density keeps at least one entry); ties at the
     threshold go to the lower index, found in O(n) with ``kthvalue``;
   * ``"random"``: keep each entry with probability ``density`` (DARE), drawn as
     ``torch.bernoulli(full(density), generator=g)``, which with the same seed
     draws exactly mergekit's mask;
   * ``"magnitude_sampled"``: DELLA's MagPrune: per row (dim 1 of a 2-D tensor,
     1-D tensors as one row) the keep probability rises linearly with the
     magnitude rank from ``density − ε`` (smallest) to ``density + ε`` (largest);
   * ``"outlier"``: Breadcrumbs (:func:`outlier_mask`): drop the ``γ`` fraction of
     largest ``|τ_i|``, then the smallest, keeping ``density``.

   Survivors are rescaled (``rescale=True``) to the tensor's L1 norm before the
   drop (mergekit's ``rescale``), or with ``rescale_norm="inverse_density"`` by
   ``1 / p`` where ``p`` is the entry's keep probability (the DARE paper's
   ``1/(1 − drop rate)``, DELLA's ``1/p_i``; deterministic masks: ``1/density``).
3. **Weight** each sparsified ``τ_i`` by ``w_i``.
4. **Sign consensus** (:func:`consensus_mask`): ``"none"``; ``"sum"`` (TIES: elected
   sign ``sign(Σ_i w_i τ_i)``, zero counted as +); ``"count"`` (the sign most
   experts have). Entries whose sign differs from the elected one, and zeros,
   are masked out.
5. **Combine** (:func:`combine`): sum of the kept weighted entries; with
   ``normalize`` divided by ``Σ w_i`` (no consensus) or, per entry, by the
   weights of the experts kept there (the *disjoint mean*); times ``λ``; added
   to ``θ0``.

The order of floating-point operations is mergekit's, so float32 results equal
mergekit's bit for bit on generic inputs. One difference: mergekit computes in
the inputs' dtype, here half-precision inputs are computed in float32 and cast
back (:func:`work_dtype`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, get_args

import torch
from torch import Tensor

from circuits.errors import InputError
from circuits.arguments import check_option

CHUNK = 1 << 22  # elements per slice in elementwise combinations (bounds temporaries on 100M-entry tensors)
Consensus = Literal["none", "sum", "count"]
RescaleNorm = Literal["l1", "inverse_density"]
CONSENSUS: tuple[str, ...] = get_args(Consensus)
RESCALE_NORMS: tuple[str, ...] = get_args(RescaleNorm)


def work_dtype(t: Tensor) -> torch.dtype:
    """The dtype merges compute in: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def task_vectors(base: Tensor, experts: Sequence[Tensor]) -> list[Tensor]:
    """``τ_i = θ_i − θ0`` in :func:`work_dtype` (experts moved to the base's device)."""
    dt = work_dtype(base)
    b = base.to(dt)
    return [e.to(device=b.device, dtype=dt) - b for e in experts]


def per_expert(value: float | Sequence[float], n: int, name: str) -> list[float]:
    """A scalar broadcast to ``n`` experts, or a per-expert sequence checked for length (mergekit's per-model parameters)."""
    if isinstance(value, (int, float)):
        return [float(value)] * n
    values = [float(v) for v in value]
    if len(values) != n:
        raise InputError(f"{name} has {len(values)} values for {n} experts: give one value, or one per expert.")
    return values


def elementwise_chunks(tensors: Sequence[Tensor], fn, chunk: int = CHUNK) -> Tensor:
    """Apply ``fn(stacked_slice) -> slice`` to ``torch.stack(tensors)`` slice by slice; returns ``tensors[0]``'s shape.

    ``fn`` must be elementwise across the non-expert dimension; slicing the
    flattened tensors keeps the stacked temporaries to ``chunk`` entries per expert.
    """
    flat = [t.reshape(-1) for t in tensors]
    out = torch.empty_like(flat[0])
    for start in range(0, out.numel(), chunk):
        stop = min(start + chunk, out.numel())
        out[start:stop] = fn(torch.stack([f[start:stop] for f in flat]))
    return out.view_as(tensors[0])


def stack_weights(weights: Sequence[float], like: Tensor) -> Tensor:
    """Weights as a ``[n_experts, 1, ..., 1]`` tensor broadcastable against a stack of ``like``."""
    w = torch.tensor(list(weights), dtype=like.dtype, device=like.device)
    return w.view(-1, *([1] * like.dim()))


# ---------------------------------------------------------------- masks


def _largest_k(flat: Tensor, k: int) -> Tensor:
    """Boolean mask of the ``k`` largest entries of the 1-D ``flat``; ties go to the lower index.

    Same selection as a stable descending ``argsort(...)[:k]`` but O(n) through
    ``kthvalue``, which matters for 100M-entry embedding matrices.
    """
    n = flat.numel()
    if k <= 0:
        return torch.zeros(n, dtype=torch.bool, device=flat.device)
    if k >= n:
        return torch.ones(n, dtype=torch.bool, device=flat.device)
    thr = torch.kthvalue(flat.cpu() if flat.device.type == "mps" else flat, n - k + 1).values.to(flat.device)
    mask = flat > thr
    need = k - int(mask.sum())
    if need > 0:
        ties = torch.nonzero(flat == thr).squeeze(1)[:need]
        mask[ties] = True
    return mask


def topk_mask(x: Tensor, density: float, *, threshold: float | None = None) -> Tensor:
    """Boolean mask of the top ``density`` fraction of ``|x|`` (or of ``|x| >= threshold``).

    ``k = max(1, floor(density · numel))`` for ``0 < density < 1``, as mergekit
    0.1.5's ``magnitude``; ``density >= 1`` keeps all, ``density <= 0`` none.
    An explicit ``threshold`` (a whole-model top-k, as FusionBench's TIES) keeps
    ``|x| >= threshold``.
    """
    if threshold is not None:
        return x.abs() >= threshold
    if density >= 1.0:
        return torch.ones_like(x, dtype=torch.bool)
    if density <= 0.0 or x.numel() == 0:
        return torch.zeros_like(x, dtype=torch.bool)
    k = max(1, int(density * x.numel()))
    return _largest_k(x.abs().reshape(-1).float(), k).view_as(x)


def kth_largest_magnitude(values: Tensor, density: float) -> float:
    """The magnitude threshold that keeps the top ``density`` fraction of ``values`` (a flat tensor)."""
    n = values.numel()
    k = max(1, int(density * n))
    return float(torch.kthvalue(values.abs().float(), n - k + 1).values)


def outlier_mask(x: Tensor, density: float, gamma: float) -> Tensor:
    """Breadcrumbs mask: drop the top ``gamma`` fraction of ``|x|``, then the smallest, keeping ``density``.

    Keeps the descending magnitude ranks ``[n_top, n_top + n_keep)`` with
    ``n_keep = floor(density · numel)`` and ``n_top = floor(gamma · numel)``,
    lowered to ``numel − n_keep`` when both do not fit: exactly mergekit 0.1.5's
    ``magnitude_outliers`` (which keeps ``sort_ascending[n_bot : n_bot + n_keep]``).
    ``density >= 1`` keeps everything, as mergekit. When ``gamma · numel``
    rounds to 0 (small tensors) no outlier is cut, only the bottom.
    """
    if density >= 1.0:
        return torch.ones_like(x, dtype=torch.bool)
    n = x.numel()
    n_keep = int(density * n)
    n_top = min(int(gamma * n), n - n_keep)
    flat = x.abs().reshape(-1).float()
    mask = _largest_k(flat, n_top + n_keep) & ~_largest_k(flat, n_top)
    return mask.view_as(x)


def _bernoulli(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """``torch.bernoulli(probs)`` drawn on the CPU from ``generator`` (reproducible on any device)."""
    return torch.bernoulli(probs.cpu(), generator=generator).to(probs.device)


def random_keep_probs(x: Tensor, density: float) -> Tensor:
    """DARE's keep probability: ``density`` everywhere (float32, as mergekit's draw)."""
    return torch.full(x.shape, float(density), dtype=torch.float32, device=x.device)


def magnitude_keep_probs(x: Tensor, density: float, epsilon: float) -> Tensor:
    """DELLA's MagPrune keep probabilities, shaped like ``x`` (mergekit's ``della_magprune``).

    Per row (dim 1; a 1-D tensor is one row) rank the magnitudes ``1..n``;
    ``p = density − ε + 2ε (rank − 1)/(n − 1)``: the largest entry is kept with
    ``density + ε``, the smallest with ``density − ε``. A row of one entry gets
    ``density − ε`` (mergekit divides 0 by 0 there).
    """
    if not (0.0 < density - epsilon and density + epsilon < 1.0):
        raise InputError(
            f"DELLA needs density ± epsilon inside (0, 1), got density={density}, epsilon={epsilon}: "
            "lower epsilon or move density away from 0 and 1."
        )
    rows = x.unsqueeze(0) if x.dim() < 2 else x
    ranks = rows.abs().argsort(dim=1).argsort(dim=1).to(torch.float32) + 1
    lo, hi = ranks.min(dim=1, keepdim=True).values, ranks.max(dim=1, keepdim=True).values
    span = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    rank_norm = ((ranks - lo) / span).clamp(0, 1)
    return ((density - epsilon) + rank_norm * 2 * epsilon).reshape(x.shape)


def rescale_l1(x: Tensor, masked: Tensor, eps: float = 1e-7) -> Tensor:
    """``masked`` scaled to ``x``'s L1 norm (mergekit's ``rescale``); unchanged when either norm is below ``eps``."""
    before, after = x.abs().sum(), masked.abs().sum()
    if before < eps or after < eps:
        return masked
    return masked * (before / after)


def _magnitude(x: Tensor, density: float, **_) -> tuple[Tensor, Tensor | float]:
    return topk_mask(x, density).to(x.dtype), float(density)


def _random(x: Tensor, density: float, *, generator=None, **_) -> tuple[Tensor, Tensor | float]:
    if density >= 1.0:
        return torch.ones_like(x), 1.0
    return _bernoulli(random_keep_probs(x, density), generator).to(x.dtype), float(density)


def _magnitude_sampled(x: Tensor, density: float, *, epsilon: float = 0.15, generator=None, **_):
    if density >= 1.0:
        return torch.ones_like(x), 1.0
    probs = magnitude_keep_probs(x, density, epsilon)
    return _bernoulli(probs, generator).to(x.dtype), probs.to(x.dtype)


def _outlier(x: Tensor, density: float, *, gamma: float = 0.01, **_) -> tuple[Tensor, Tensor | float]:
    return outlier_mask(x, density, gamma).to(x.dtype), float(density)


SPARSIFIERS: dict[str, Callable[..., tuple[Tensor, Tensor | float]]] = {
    "magnitude": _magnitude,
    "random": _random,
    "magnitude_sampled": _magnitude_sampled,
    "outlier": _outlier,
}
"""``name -> fn(x, density, *, gamma, epsilon, generator) -> (mask, keep probability)``."""


def sparsify(
    x: Tensor,
    method: str,
    density: float,
    *,
    gamma: float = 0.01,
    epsilon: float = 0.15,
    rescale: bool = False,
    rescale_norm: RescaleNorm = "l1",
    generator: torch.Generator | None = None,
) -> Tensor:
    """One task vector sparsified by ``method`` (:data:`SPARSIFIERS` or ``"none"``) and optionally rescaled."""
    if method == "none":
        return x
    if method not in SPARSIFIERS:
        raise InputError(f"Unknown sparsification {method!r}; choose 'none' or one of {sorted(SPARSIFIERS)}.")
    if density >= 1.0:  # mergekit returns the tensor untouched (no rescale) at density 1
        return x
    mask, keep_prob = SPARSIFIERS[method](x, density, gamma=gamma, epsilon=epsilon, generator=generator)
    masked = x * mask
    if not rescale:
        return masked
    if rescale_norm == "l1":
        return rescale_l1(x, masked)
    if rescale_norm == "inverse_density":
        return masked / keep_prob
    check_option("rescale_norm", rescale_norm, RescaleNorm)
    raise AssertionError("unreachable: every RescaleNorm is handled above")


def random_drop(
    x: Tensor, drop_rate: float, *, rescale: str = "inverse", generator: torch.Generator | None = None
) -> Tensor:
    """DARE's drop with probability ``drop_rate`` (= 1 − density); ``rescale`` ``"inverse"``, ``"l1"`` or ``"none"``."""
    if not 0.0 <= drop_rate < 1.0:
        raise InputError(f"drop_rate must be in [0, 1), got {drop_rate}.")
    modes = {"inverse": (True, "inverse_density"), "l1": (True, "l1"), "none": (False, "l1")}
    if rescale not in modes:
        raise InputError(f"rescale must be 'inverse', 'l1' or 'none', got {rescale!r}.")
    do, norm = modes[rescale]
    work = x.to(work_dtype(x))
    return sparsify(work, "random", 1.0 - drop_rate, rescale=do, rescale_norm=norm, generator=generator).to(x.dtype)


# ---------------------------------------------------------------- sign consensus and combination


def consensus_mask(weighted: Tensor, method: str = "sum") -> Tensor:
    """Which entries of the weighted task vectors ``[n_experts, ...]`` agree with the elected sign.

    ``"sum"``: elected sign ``sign(Σ_i w_i τ_i)``; ``"count"``: the sign of the
    majority of ``sign(w_i τ_i)``; zero counts as + in both (mergekit's ``get_mask``).
    Zero entries never agree.
    """
    sign = weighted.sign()
    if method == "sum":
        elected = (weighted.sum(dim=0) >= 0).to(weighted.dtype) * 2 - 1
    elif method == "count":
        elected = (sign.sum(dim=0) >= 0).to(weighted.dtype) * 2 - 1
    else:
        check_option("sign consensus", method, ("sum", "count"))
    return sign == elected


def elect_sign(task_vectors: Tensor, weights: Sequence[float] | None = None) -> Tensor:
    """Elected sign per entry, +1 or −1: ``sign(Σ_i w_i τ_i)`` with 0 counted as +1 (``task_vectors``: ``[n, ...]``)."""
    tv = task_vectors if weights is None else task_vectors * stack_weights(weights, task_vectors[0])
    return torch.where(tv.sum(0) >= 0, 1.0, -1.0).to(task_vectors.dtype)


def disjoint_mean(task_vectors: Tensor, sign: Tensor, weights: Sequence[float] | None = None) -> Tensor:
    """Weighted mean, per entry, over experts whose nonzero entry has the elected ``sign`` (0 where none)."""
    n = task_vectors.shape[0]
    w = stack_weights(weights if weights is not None else [1.0] * n, task_vectors[0])
    agree = (torch.sign(task_vectors) == sign).to(task_vectors.dtype)
    divisor = (w * agree).sum(0)
    divisor = torch.where(divisor == 0, torch.ones_like(divisor), divisor)
    return (task_vectors * w * agree).sum(0) / divisor


def combine(
    base: Tensor,
    deltas: Sequence[Tensor],
    weights: Sequence[float] | None = None,
    *,
    consensus: Consensus = "none",
    normalize: bool = False,
    lam: float = 1.0,
) -> Tensor:
    """``θ0 + λ · Σ_i w_i δ_i [· consensus mask] [/ divisor]`` in the base dtype (mergekit's ``merge_group``).

    ``deltas`` are the (sparsified) task vectors in :func:`work_dtype`. Without
    consensus the divisor is ``Σ w_i`` (kept at 1 when ``|Σ w_i| < 1e-8``); with
    it, per entry, ``Σ`` of the weights of the agreeing experts (1 where none).
    """
    check_option("sign consensus", consensus, Consensus)
    n = len(deltas)
    w_list = [1.0] * n if weights is None else list(weights)
    dt = work_dtype(base)
    b = base.to(dt)

    def mix(stacked: Tensor) -> Tensor:  # stacked: [n_experts, chunk]
        w = stack_weights(w_list, stacked[0])
        weighted = stacked * w
        if consensus != "none":
            mask = consensus_mask(weighted, consensus).to(weighted.dtype)
            mixed = (weighted * mask).sum(dim=0)
            divisor = (w * mask).sum(dim=0)
            divisor[divisor == 0] = 1
        else:
            mixed = weighted.sum(dim=0)
            divisor = w.sum(dim=0).expand_as(mixed).clone()
            divisor[divisor.abs() < 1e-8] = 1
        if normalize:
            mixed = mixed / divisor
        return mixed

    mixed = elementwise_chunks([d.to(device=b.device, dtype=dt) for d in deltas], mix)
    if lam != 1:
        mixed = mixed * lam
    return (b + mixed).to(base.dtype)


def tall_masks(task_vectors: Tensor, lambdas: Sequence[float], multitask: Tensor | None = None) -> Tensor:
    """TALL masks (Wang et al. 2024): ``mask_t = |τ_t| >= λ_t |τ_MTL − τ_t|``, ``τ_MTL = Σ_i τ_i``.

    Returns a boolean ``[n_experts, *shape]`` tensor.
    """
    mtl = task_vectors.sum(0) if multitask is None else multitask
    lam = stack_weights(lambdas, task_vectors[0])
    return task_vectors.abs() >= lam * (mtl.unsqueeze(0) - task_vectors).abs()
