"""Shared building blocks of the weight-space merges, each on one tensor.

The baselines in :mod:`merging.methods` are compositions of these:

* :func:`topk_mask` keeps the ``density`` fraction of largest-magnitude
  entries (TIES' *trim*). ``k = floor(density · numel)`` as mergekit 0.1.5; where
  that rounds to 0 for a small tensor and ``density > 0`` we keep 1 entry
  (mergekit asserts instead), so a bias vector is never silently wiped.
  Ties at the threshold go to the lower index (a stable descending sort's
  order), found in O(n) with ``kthvalue``. With an explicit
  ``threshold`` (whole-model top-k, as FusionBench) it keeps ``|x| >= threshold``.
* :func:`elect_sign` is TIES' sign election: ``sign(Σ_i w_i τ̂_i)`` with a zero
  sum counted as ``+`` (mergekit's ``sum`` consensus).
* :func:`disjoint_mean` averages, per entry, only the experts whose (nonzero)
  entry agrees with the elected sign, weighted by ``w_i``; entries nobody keeps
  are 0 (mergekit's ``normalize=True``).
* :func:`random_drop` is DARE's Bernoulli drop with rescaling by ``1/(1−p)``
  (the DARE paper) or to keep the L1 norm (mergekit's ``rescale_sum``), seeded
  through a ``torch.Generator``.
* :func:`outlier_mask` is Breadcrumbs: drop the ``γ`` fraction of largest
  magnitudes and then the smallest until ``density`` remains. mergekit 0.1.5
  indexes ``sort[n_bot:-n_top]``, which keeps *nothing* when ``γ·numel``
  rounds to 0; here the top cut is ``int(γ·numel)`` (possibly 0, then only the
  bottom is cut) with explicit end indices.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


CHUNK = 1 << 22  # elements per slice in elementwise combinations (bounds temporaries on 100M-entry tensors)


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
    """Boolean mask of the top ``density`` fraction of ``|x|`` (or of ``|x| >= threshold``)."""
    if threshold is not None:
        return x.abs() >= threshold
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density}.")
    if density >= 1.0:
        return torch.ones_like(x, dtype=torch.bool)
    if density == 0.0:
        return torch.zeros_like(x, dtype=torch.bool)
    k = max(1, int(density * x.numel()))
    return _largest_k(x.abs().reshape(-1).float(), k).view_as(x)


def kth_largest_magnitude(values: Tensor, density: float) -> float:
    """The magnitude threshold that keeps the top ``density`` fraction of ``values`` (a flat tensor)."""
    n = values.numel()
    k = max(1, int(density * n))
    return float(torch.kthvalue(values.abs().float(), n - k + 1).values)


def elect_sign(task_vectors: Tensor, weights: Sequence[float] | None = None) -> Tensor:
    """Elected sign per entry, +1 or −1: ``sign(Σ_i w_i τ_i)`` with 0 counted as +1.

    ``task_vectors`` is ``[n_experts, *shape]``.
    """
    tv = task_vectors if weights is None else task_vectors * stack_weights(weights, task_vectors[0])
    return torch.where(tv.sum(0) >= 0, 1.0, -1.0).to(task_vectors.dtype)


def disjoint_mean(task_vectors: Tensor, sign: Tensor, weights: Sequence[float] | None = None) -> Tensor:
    """Weighted mean, per entry, over experts whose entry is nonzero with the elected ``sign``."""
    n = task_vectors.shape[0]
    w = stack_weights(weights if weights is not None else [1.0] * n, task_vectors[0])
    agree = (torch.sign(task_vectors) == sign).to(task_vectors.dtype)
    total = (task_vectors * w * agree).sum(0)
    divisor = (w * agree).sum(0)
    divisor = torch.where(divisor.abs() < 1e-8, torch.ones_like(divisor), divisor)
    return total / divisor


def random_drop(
    x: Tensor, drop_rate: float, *, rescale: str = "inverse", generator: torch.Generator | None = None
) -> Tensor:
    """Drop each entry with probability ``drop_rate``; rescale the survivors.

    ``rescale``: ``"inverse"`` multiplies by ``1/(1−p)`` (DARE), ``"l1"`` restores
    the L1 norm of ``x`` (mergekit's ``rescale_sum``), ``"none"`` leaves them.
    """
    if not 0.0 <= drop_rate < 1.0:
        raise ValueError(f"drop_rate must be in [0, 1), got {drop_rate}.")
    if rescale not in ("inverse", "l1", "none"):
        raise ValueError(f"rescale must be 'inverse', 'l1' or 'none', got {rescale!r}.")
    if drop_rate == 0.0:
        return x.clone()
    work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    keep = torch.rand(work.shape, generator=generator, device="cpu").to(work.device) >= drop_rate
    out = work * keep
    if rescale == "inverse":
        out = out / (1.0 - drop_rate)
    elif rescale == "l1":
        before, after = work.abs().sum(), out.abs().sum()
        if before >= 1e-8 and after >= 1e-8:
            out = out * (before / after)
    return out.to(x.dtype)


def outlier_mask(x: Tensor, density: float, gamma: float) -> Tensor:
    """Breadcrumbs mask: drop the top ``gamma`` fraction of ``|x|``, then the smallest, keeping ``density``."""
    if not (0.0 <= gamma <= 1.0 and 0.0 <= density <= 1.0):
        raise ValueError(f"gamma and density must be in [0, 1], got gamma={gamma}, density={density}.")
    n = x.numel()
    n_keep = int(density * n)
    n_top = int(gamma * n)  # may round to 0 for small tensors: then no outlier is cut
    n_top = min(n_top, n - n_keep)  # too many to cut: cut fewer outliers, keep `density`
    flat = x.abs().reshape(-1).float()
    # ranks [n_top, n_top + n_keep) of the descending order
    mask = _largest_k(flat, n_top + n_keep) & ~_largest_k(flat, n_top)
    return mask.view_as(x)


def tall_masks(task_vectors: Tensor, lambdas: Sequence[float], multitask: Tensor | None = None) -> Tensor:
    """TALL masks (Wang et al. 2024): ``mask_t = |τ_t| >= λ_t |τ_MTL − τ_t|``, ``τ_MTL = Σ_i τ_i``.

    Returns a boolean ``[n_experts, *shape]`` tensor.
    """
    mtl = task_vectors.sum(0) if multitask is None else multitask
    lam = stack_weights(lambdas, task_vectors[0])
    return task_vectors.abs() >= lam * (mtl.unsqueeze(0) - task_vectors).abs()
