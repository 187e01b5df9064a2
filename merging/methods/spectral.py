"""Spectral data-free merges of 2025: TSV-M, Iso-C and Iso-CTS (not in mergekit 0.1.5).

They act on weight *matrices* through the SVD of task vectors; every other
tensor (biases, norms) gets the mean task vector ``Σ_i w_i τ_i / N``, as the
authors' code does. ``θ = θ0 + α Δ`` with ``α`` the method's scale (default 1; the
papers tune it on validation data). Per-expert weights ``w_i`` multiply the
task vectors first (an extension; the papers use none).

* **TSV-M** (Gargiulo et al., CVPR 2025, "Task Singular Vectors"): per matrix,
  ``τ_i = U_i Σ_i V_iᵀ``; keep each task's top ``k = max(1, ⌊r/N⌋)`` singular
  triplets (``r = min(m, n)``); stack ``U = [U_1,k … U_N,k]``, ``Σ``, ``V`` likewise;
  orthogonalize ``U⊥ = P Qᵀ`` from ``U = P S Qᵀ`` (the nearest matrix with
  orthonormal columns), ``V⊥`` the same; ``Δ = U⊥ Σ V⊥ᵀ``.
* **Iso-C** (Marczak et al., ICML 2025, "No Task Left Behind"): ``Δ_TA = Σ_i τ_i
  = U Σ Vᵀ``; ``Δ = σ̄ U Vᵀ`` with ``σ̄ = mean(diag Σ)``: the merged update gets a
  flat (isotropic) spectrum.
* **Iso-CTS** (same paper), as we read it: the *common* subspace is the top
  ``k = ⌊f·r⌋`` singular vectors of ``Δ_TA`` (``f = common_space_fraction``,
  0.8 as the paper); each task adds the top ``s = ⌊(r − k)/N⌋`` singular vectors
  of its task vector projected off the common left subspace,
  ``τ̄_t = τ_t − U_c U_cᵀ τ_t``; the stacked ``U = [U_c, U_1,s … U_N,s]`` and ``V``
  are orthogonalized as in TSV-M; ``Δ = σ̄ U⊥ V⊥ᵀ`` with ``σ̄`` the mean of the
  kept singular values (common and task-specific).

Which tensors are matrices: TransformerLens stores attention weights per head
(``W_Q``/``W_K``/``W_V`` ``[head, d_model, d_head]``, ``W_O`` ``[head, d_head,
d_model]``); they are viewed as the ``[d_model, head·d_head]`` (``[head·d_head,
d_model]``) matrix of the whole attention layer, as in a Hugging Face
checkpoint. Other ``W_*`` tensors with two dimensions are matrices; the rest
(biases ``b_*``, norm weights) are not. Called without a ``key``, any 2-D
tensor is a matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from merging.methods.config_checks import check_config, check_weights
from merging.methods.mergekit_spec import INT8_MASK, MergekitParameter, MergekitSpec
from merging.primitives import task_vectors

HEAD_INPUT_WEIGHTS = ("W_Q", "W_K", "W_V", "_W_K", "_W_V")


def matrix_view(key: str | None, t: Tensor) -> tuple[Tensor, Callable[[Tensor], Tensor]] | None:
    """``(matrix, back)`` with ``back(matrix)`` restoring ``t``'s layout, or None for a non-matrix tensor."""
    name = key.rsplit(".", 1)[-1] if key else None
    if name in HEAD_INPUT_WEIGHTS and t.dim() == 3:
        h, d_model, d_head = t.shape
        return t.permute(1, 0, 2).reshape(d_model, h * d_head), lambda m: m.reshape(d_model, h, d_head).permute(1, 0, 2)
    if name == "W_O" and t.dim() == 3:
        return t.reshape(-1, t.shape[-1]), lambda m: m.reshape(t.shape)
    if t.dim() == 2 and (name is None or name.startswith("W_")):
        return t, lambda m: m
    return None


def orthogonalize(x: Tensor) -> Tensor:
    """The nearest matrix with orthonormal columns: ``P Qᵀ`` from the thin SVD ``x = P S Qᵀ``."""
    p, _, qh = torch.linalg.svd(x, full_matrices=False)
    return p @ qh


def tsv_delta(tvs: Sequence[Tensor]) -> Tensor:
    """TSV-M's merged update of one matrix from the task matrices ``tvs``."""
    r = min(tvs[0].shape)
    k = max(1, r // len(tvs))
    us, ss, vs = [], [], []
    for tv in tvs:
        u, s, vh = torch.linalg.svd(tv, full_matrices=False)
        us.append(u[:, :k])
        ss.append(s[:k])
        vs.append(vh[:k].T)
    u_perp, v_perp = orthogonalize(torch.cat(us, dim=1)), orthogonalize(torch.cat(vs, dim=1))
    return u_perp @ torch.diag(torch.cat(ss)) @ v_perp.T


def iso_c_delta(tvs: Sequence[Tensor]) -> Tensor:
    """Iso-C's merged update: the task-arithmetic sum with every singular value set to their mean."""
    u, s, vh = torch.linalg.svd(sum(tvs), full_matrices=False)
    return s.mean() * (u @ vh)


def iso_cts_delta(tvs: Sequence[Tensor], common_space_fraction: float = 0.8) -> Tensor:
    """Iso-CTS's merged update: common subspace of the sum plus task-specific directions, isotropic spectrum."""
    u, s, vh = torch.linalg.svd(sum(tvs), full_matrices=False)
    r = s.numel()
    k = int(common_space_fraction * r)
    per_task = (r - k) // len(tvs)
    if per_task == 0:
        return s.mean() * (u @ vh) if k == r else s[:k].mean() * (u[:, :k] @ vh[:k])
    u_c = u[:, :k]
    us, ss, vs = [u_c], [s[:k]], [vh[:k].T]
    for tv in tvs:
        ut, st, vht = torch.linalg.svd(tv - u_c @ (u_c.T @ tv), full_matrices=False)
        us.append(ut[:, :per_task])
        ss.append(st[:per_task])
        vs.append(vht[:per_task].T)
    u_perp, v_perp = orthogonalize(torch.cat(us, dim=1)), orthogonalize(torch.cat(vs, dim=1))
    return torch.cat(ss).mean() * (u_perp @ v_perp.T)


@dataclass(frozen=True)
class TsvConfig:
    """``alpha``: scale of the merged update."""

    alpha: float = 1.0

    def __post_init__(self):
        check_config(self)


@dataclass(frozen=True)
class IsoCConfig(TsvConfig):
    """``alpha``: scale of the isotropic update."""


@dataclass(frozen=True)
class IsoCtsConfig(TsvConfig):
    """``alpha``; ``common_space_fraction``: share of the rank given to the common subspace."""

    common_space_fraction: float = 0.8


# Not in mergekit: their YAML under our names tsv_m, iso_c, iso_cts; weights optional (default 1).
TSV_MERGEKIT = MergekitSpec(parameters=(MergekitParameter("alpha"), INT8_MASK), takes_weights=True)
ISO_CTS_MERGEKIT = MergekitSpec(
    parameters=(MergekitParameter("alpha"), MergekitParameter("common_space_fraction"), INT8_MASK),
    takes_weights=True,
)


def _spectral(base, experts, weights, key, alpha: float, delta_fn) -> Tensor:
    w = check_weights(weights, len(experts))
    tvs = [wi * tv for wi, tv in zip(w, task_vectors(base, experts))]
    if not any(bool(tv.any()) for tv in tvs):  # nothing changed (e.g. frozen embeddings): skip the SVDs
        return base.clone()
    views = [matrix_view(key, tv) for tv in tvs]
    if views[0] is None:
        delta = sum(tvs) / len(tvs)
    else:
        # SVDs in float64: in float32 a near-degenerate spectrum picks device-dependent subspaces (Iso-CTS on a
        # tiny model: CUDA and CPU 7e-5 apart in float32, 1e-12 in float64)
        delta = views[0][1](delta_fn([m.double() for m, _ in views]))
    return (base.to(delta.dtype) + alpha * delta).to(base.dtype)


def tsv_m(base: Tensor, experts: Sequence[Tensor], config: TsvConfig = TsvConfig(), *,
          weights: Sequence[float] | None = None, key: str | None = None, **_: object) -> Tensor:
    """TSV-M on one tensor (``key``, the state-dict name, decides whether it is a matrix)."""
    return _spectral(base, experts, weights, key, config.alpha, tsv_delta)


def iso_c(base: Tensor, experts: Sequence[Tensor], config: IsoCConfig = IsoCConfig(), *,
          weights: Sequence[float] | None = None, key: str | None = None, **_: object) -> Tensor:
    """Iso-C on one tensor."""
    return _spectral(base, experts, weights, key, config.alpha, iso_c_delta)


def iso_cts(base: Tensor, experts: Sequence[Tensor], config: IsoCtsConfig = IsoCtsConfig(), *,
            weights: Sequence[float] | None = None, key: str | None = None, **_: object) -> Tensor:
    """Iso-CTS on one tensor."""
    return _spectral(base, experts, weights, key, config.alpha,
                     lambda tvs: iso_cts_delta(tvs, config.common_space_fraction))
