"""Merges of whole weights rather than task vectors: weight average, Karcher mean, Model Stock.

* **Weight average** ("model soup", mergekit's ``linear``): ``Σ_i w_i θ_i / Σ_i w_i``
  (``normalize=False``: the plain weighted sum). The base is not used.
* **Karcher mean** (mergekit's ``karcher``): the weighted Riemannian mean of the
  weights' directions on the unit sphere, found by up to ``max_iter`` steps of
  ``m ← exp_m(Σ_i a_i log_m(u_i))`` with ``u_i = θ_i/‖θ_i‖``, then scaled by
  ``Σ_i a_i ‖θ_i‖``; uniform ``a_i``. mergekit feeds the base model in as one
  more input when the config names one (``include_base=True`` here; the YAML
  loader sets it).
* **Model Stock** (Jang et al., 2024): with ``cos θ`` the mean pairwise cosine of
  the experts' task vectors (per tensor, or per row with ``filter_wise``),
  ``t = N cos θ / (1 + (N − 1) cos θ)`` and ``θ = t · mean_i θ_i + (1 − t) θ0``;
  where ``1 + (N−1) cos θ ≈ 0`` the base is kept. Needs at least 2 experts
  (mergekit asks for 2 plus the base).

The numerics follow mergekit 0.1.5's functions step for step, tested equal in float32 and float64; bfloat16 and
float16 inputs are computed in float32 and rounded once (mergekit computes in the inputs' dtype), so there the
two can differ by rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from circuits.errors import InputError
from merging.methods.config_checks import check_config, check_no_weights, check_weights
from merging.methods.mergekit_spec import INT8_MASK, MergekitParameter, MergekitSpec
from merging.primitives import work_dtype


@dataclass(frozen=True)
class AverageConfig:
    """``normalize``: divide by ``Σ w_i`` (mergekit's ``linear`` default True)."""

    normalize: bool = True


# mergekit's linear: every listed model is an input (a named base must be listed, with its weight).
AVERAGE_MERGEKIT = MergekitSpec(
    parameters=(MergekitParameter("normalize", kind=bool), INT8_MASK),
    needs_base=False,
    takes_weights=True,
    needs_weights=True,
)


def weight_average(
    base: Tensor,
    experts: Sequence[Tensor],
    config: AverageConfig = AverageConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """``Σ w_i θ_i / Σ w_i`` for one tensor, accumulated in float32 (float64 for float64)."""
    w = check_weights(weights, len(experts), normalized=config.normalize)
    dt = work_dtype(base)
    acc = torch.zeros_like(base, dtype=dt)
    for wi, e in zip(w, experts):
        acc.addcmul_(e.to(device=acc.device, dtype=dt), torch.tensor(wi, dtype=dt, device=acc.device))
    if config.normalize:
        acc.div_(sum(w))
    return acc.to(base.dtype)


@dataclass(frozen=True)
class KarcherConfig:
    """``max_iter`` and ``tol`` of the fixed-point iteration; ``include_base``: the base is one more input."""

    max_iter: int = 10
    tol: float = 1e-5
    include_base: bool = False

    def __post_init__(self):
        check_config(self)
        if self.max_iter < 1 or self.tol <= 0:
            raise InputError(f"KarcherConfig needs max_iter >= 1 and tol > 0, got {self.max_iter}, {self.tol}.")


# mergekit's karcher: every listed model is an input; a base_model not among them is one more input.
KARCHER_MERGEKIT = MergekitSpec(
    parameters=(
        MergekitParameter("max_iter", kind=int),
        MergekitParameter("tol"),
        MergekitParameter("include_base", kind=bool),  # ours
        INT8_MASK,
    ),
    needs_base=False,
    unlisted_base_field="include_base",
)


def karcher_mean(tensors: Sequence[Tensor], alphas: Sequence[float], max_iter: int = 10, tol: float = 1e-5) -> Tensor:
    """Weighted Karcher mean of ``tensors`` on the unit sphere, scaled by the weighted mean norm."""
    if len(tensors) == 1:
        return tensors[0]
    dt = work_dtype(tensors[0])
    norms = [torch.linalg.vector_norm(t.to(dt)) for t in tensors]
    units = [torch.zeros_like(t) if float(n) == 0.0 else (t / n).to(t.dtype) for t, n in zip(tensors, norms)]
    valid = [i for i, n in enumerate(norms) if float(n) > tol]
    if not valid:
        return torch.zeros_like(tensors[0])
    total = sum(alphas[i] for i in valid)
    a = [alphas[i] / total for i in valid]
    u = [units[i] for i in valid]
    mean = torch.zeros_like(u[0])
    for ai, ui in zip(a, u):
        mean += ai * ui
    mean_norm = torch.linalg.vector_norm(mean.to(dt))
    mean = u[0].clone() if float(mean_norm) < tol else (mean / mean_norm).to(mean.dtype)
    for _ in range(max_iter):
        tangent = torch.zeros_like(mean)
        for ai, ui in zip(a, u):
            dot = torch.clamp(torch.dot(mean.flatten(), ui.flatten()), -1.0, 1.0)
            theta = torch.arccos(dot)
            if float(theta) < tol:
                continue
            tangent += ai * (theta / torch.sin(theta)) * (ui - dot * mean)
        step = torch.linalg.vector_norm(tangent.to(dt))
        if float(step) < tol:
            break
        mean = (torch.cos(step) * mean + torch.sin(step) * (tangent / step)).to(mean.dtype)
        unit_norm = torch.linalg.vector_norm(mean.to(dt))
        if float(unit_norm) > tol:
            mean = (mean / unit_norm).to(mean.dtype)
    return sum(ai * n for ai, n in zip(alphas, norms)) * mean


def karcher(
    base: Tensor,
    experts: Sequence[Tensor],
    config: KarcherConfig = KarcherConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """Karcher mean of the experts (and the base with ``include_base``) for one tensor; uniform weights as mergekit."""
    check_no_weights(weights, "karcher")
    tensors = ([base] if config.include_base else []) + [e.to(base.device) for e in experts]
    return karcher_mean(tensors, [1.0 / len(tensors)] * len(tensors), config.max_iter, config.tol).to(base.dtype)


@dataclass(frozen=True)
class ModelStockConfig:
    """``filter_wise``: one interpolation ratio per row (dim 0) instead of per tensor."""

    filter_wise: bool = False


MODEL_STOCK_MERGEKIT = MergekitSpec(parameters=(MergekitParameter("filter_wise", kind=bool), INT8_MASK))


def model_stock(
    base: Tensor,
    experts: Sequence[Tensor],
    config: ModelStockConfig = ModelStockConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """Model Stock on one tensor."""
    if len(experts) < 2:
        raise InputError(f"model_stock needs at least 2 experts (the angle between them sets the ratio), got {len(experts)}.")
    check_no_weights(weights, "model_stock")
    dt = work_dtype(base)
    w0 = base.to(dt)
    ws = [e.to(device=base.device, dtype=dt) for e in experts]
    if config.filter_wise:
        if w0.dim() == 1:
            w0, ws = w0.unsqueeze(0), [w.unsqueeze(0) for w in ws]
    else:
        w0, ws = w0.reshape(-1), [w.reshape(-1) for w in ws]
    offsets = [w - w0 for w in ws]
    cos = []
    for i, a in enumerate(offsets):
        for b in offsets[i + 1:]:
            norm_product = torch.norm(a, dim=-1) * torch.norm(b, dim=-1)
            cos.append(((a * b).sum(dim=-1) / norm_product.clamp(min=1e-6)).clamp(-1, 1))
    cos_theta = torch.stack(cos).mean(dim=0).unsqueeze(-1)
    n = len(ws)
    denominator = 1 + (n - 1) * cos_theta
    singular = denominator.abs() < 1e-6
    safe = torch.where(singular, torch.ones_like(denominator), denominator)
    t = torch.where(singular, torch.zeros_like(cos_theta), (n * cos_theta) / safe)
    mean = sum(ws) / n
    return (t * mean + (1 - t) * w0).reshape(base.shape).to(base.dtype)
