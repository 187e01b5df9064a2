"""Merges along great circles rather than straight lines: SLERP, NuSLERP, Multi-SLERP, plus NearSwap.

A straight average of two weight tensors is shorter than either when they point
in different directions; interpolating on the sphere keeps the norm profile.

* **SLERP** (mergekit's ``slerp``): ``θ = sin((1−t)Ω)/sin Ω · θ0 + sin(tΩ)/sin Ω · θ1``
  with ``Ω`` the angle between the base ``θ0`` (``t = 0``) and the one expert
  ``θ1`` (``t = 1``), the whole tensor as one vector. When ``|cos Ω| > 0.9995``
  (nearly colinear or opposite) it falls back to the straight line ``(1−t)θ0 + tθ1``.
* **NuSLERP** (mergekit's ``nuslerp``): SLERP between exactly two experts with
  ``t = w_2 / (w_1 + w_2)`` from their weights (0.5 when the weights sum to ~0);
  with a base (``use_base``) it interpolates their task vectors and adds the
  base back. ``nuslerp_flatten``: the whole tensor is one vector; else each row
  (``nuslerp_row_wise``, dim 0) or each column (the last dim) separately. The rows and
  columns are those of TransformerLens' layout (``W_Q [n_heads, d_model, d_head]``,
  ``W_in [d_model, d_mlp]``), not those of the Hugging Face checkpoint mergekit reads
  (``[out, in]``): the flattened default is the same merge, the per-row and per-column
  modes are not (they agree with mergekit on the tensors as given, not on the checkpoint).
* **Multi-SLERP** (mergekit's ``multislerp``): the weighted barycentre of N
  experts on the unit sphere (one step of the exponential map from their
  normalised weighted mean), scaled by their weighted mean norm; with a base,
  of their task vectors.
* **NearSwap** (mergekit's ``nearswap``): per entry, the expert's value where it
  is within ``t`` of the base's, a blend ``t/|θ1 − θ0|`` towards it elsewhere.

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
from merging.methods.config_checks import check_config, check_no_weights, check_weights, warn_outside
from merging.methods.mergekit_spec import MergekitParameter, MergekitSpec
from merging.primitives import work_dtype

DOT_THRESHOLD = 0.9995  # |cos Ω| above this: SLERP takes the straight line (mergekit's dot_threshold)
NORM_EPS = 1e-8  # a norm at or below this is taken as 1 (SLERP) / the colinearity tolerance (NuSLERP)


def _one_expert(experts: Sequence[Tensor], method: str) -> Tensor:
    if len(experts) != 1:
        raise InputError(f"{method} merges the base with exactly one other model, got {len(experts)} experts: "
                         "merge two models at a time, or use multislerp for more.")
    return experts[0]


@dataclass(frozen=True)
class SlerpConfig:
    """``t``: 0 keeps the base, 1 gives the expert (mergekit requires it in a YAML)."""

    t: float = 0.5

    def __post_init__(self):
        check_config(self)
        warn_outside(self, "t", 0.0, 1.0, "slerp extrapolates beyond the base and the expert")


SLERP_MERGEKIT = MergekitSpec(parameters=(MergekitParameter("t", required=True),))


def slerp(
    base: Tensor,
    experts: Sequence[Tensor],
    config: SlerpConfig = SlerpConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """Spherical interpolation from the base (``t=0``) to the one expert (``t=1``) on one tensor."""
    check_no_weights(weights, "slerp")
    dt = work_dtype(base)
    a = base.to(dt).reshape(-1)
    b = _one_expert(experts, "slerp").to(device=base.device, dtype=dt).reshape(-1)
    t = torch.tensor(config.t, dtype=dt, device=base.device)
    if a.numel() == 0:
        return ((1 - t) * a + t * b).reshape(base.shape).to(base.dtype)
    norm_a = torch.linalg.vector_norm(a)
    norm_b = torch.linalg.vector_norm(b)
    norm_a = torch.where(norm_a > NORM_EPS, norm_a, 1)
    norm_b = torch.where(norm_b > NORM_EPS, norm_b, 1)
    dot = ((a / norm_a) * (b / norm_b)).sum().clamp(-1, 1)  # normalised first: the raw dot may overflow
    linear = dot.abs() > DOT_THRESHOLD
    theta = torch.acos(torch.where(linear, 0, dot))
    sin_theta = torch.sin(theta)
    coef_a = torch.where(linear, 1 - t, torch.sin((1 - t) * theta) / sin_theta)
    coef_b = torch.where(linear, t, torch.sin(t * theta) / sin_theta)
    return (coef_a * a + coef_b * b).reshape(base.shape).to(base.dtype)


@dataclass(frozen=True)
class NuSlerpConfig:
    """``nuslerp_flatten``: the whole tensor is one vector; else per row (``nuslerp_row_wise``) or per column.

    ``use_base``: interpolate the task vectors ``θ_i − θ0`` and add the base back
    (a YAML sets it from whether it names ``base_model``).
    """

    nuslerp_row_wise: bool = False
    nuslerp_flatten: bool = True
    use_base: bool = True


# mergekit's nuslerp and multislerp: base_model optional; given, it is the origin of the task vectors.
NUSLERP_MERGEKIT = MergekitSpec(
    parameters=(MergekitParameter("nuslerp_row_wise", kind=bool), MergekitParameter("nuslerp_flatten", kind=bool)),
    needs_base=False,
    optional_base_field="use_base",
    takes_weights=True,
    needs_weights=True,
)


def _nuslerp_pair(t: float, v0: Tensor, v1: Tensor, *, dim: int, flatten: bool) -> Tensor:
    """SLERP from ``v0`` to ``v1`` along ``dim`` (each slice one vector), or of the whole tensors with ``flatten``."""
    shape = v0.shape
    if flatten:
        v0, v1 = v0.reshape(-1), v1.reshape(-1)
    elif dim != -1:
        v0, v1 = v0.transpose(dim, -1), v1.transpose(dim, -1)
    u0 = v0 / torch.norm(v0, dim=-1, keepdim=True).clamp(min=1e-7)
    u1 = v1 / torch.norm(v1, dim=-1, keepdim=True).clamp(min=1e-7)
    cos_theta = torch.sum(u0 * u1, dim=-1, keepdim=True).clamp(-1, 1)
    colinear = (1 - cos_theta.square()) <= NORM_EPS**2
    theta = torch.acos(torch.where(colinear, 0, cos_theta))  # finite on the unselected branch too
    spherical = (torch.sin((1 - t) * theta) * v0 + torch.sin(t * theta) * v1) / torch.sin(theta)
    out = torch.where(colinear, (1 - t) * v0 + t * v1, spherical)
    if dim != -1 and not flatten:
        out = out.transpose(dim, -1)
    return out.reshape(shape)


def nuslerp(
    base: Tensor,
    experts: Sequence[Tensor],
    config: NuSlerpConfig = NuSlerpConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """NuSLERP of two experts (their task vectors with ``use_base``) on one tensor, ``t = w_2 / (w_1 + w_2)``."""
    if len(experts) != 2:
        raise InputError(f"nuslerp merges exactly two models (besides an optional base), got {len(experts)} experts; "
                         "use multislerp for more.")
    w = check_weights(weights, 2)
    total = sum(w)
    t = 0.5 if abs(total) < 1e-6 else w[1] / total
    dim = 0 if config.nuslerp_row_wise else -1
    v0, v1 = (e.to(base.device) for e in experts)
    if not config.use_base:
        return _nuslerp_pair(t, v0, v1, dim=dim, flatten=config.nuslerp_flatten)
    return base + _nuslerp_pair(t, v0 - base, v1 - base, dim=dim, flatten=config.nuslerp_flatten)


@dataclass(frozen=True)
class MultiSlerpConfig:
    """``normalize_weights``: divide the weights by their sum; ``eps`` guards the norms.

    ``use_base``: interpolate the task vectors ``θ_i − θ0`` and add the base back
    (a YAML sets it from whether it names ``base_model``).
    """

    normalize_weights: bool = True
    eps: float = 1e-8
    use_base: bool = True

    def __post_init__(self):
        check_config(self)
        warn_outside(self, "eps", 0.0, None, "a negative guard can make a norm's divisor 0 or negative")


MULTISLERP_MERGEKIT = MergekitSpec(
    parameters=(MergekitParameter("normalize_weights", kind=bool), MergekitParameter("eps")),
    needs_base=False,
    optional_base_field="use_base",
    takes_weights=True,
    needs_weights=True,
)


def multislerp(
    base: Tensor,
    experts: Sequence[Tensor],
    config: MultiSlerpConfig = MultiSlerpConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """Weighted barycentre on the sphere of the experts (their task vectors with ``use_base``) for one tensor."""
    w = check_weights(weights, len(experts), normalized=config.normalize_weights)
    if len(experts) == 1:
        return experts[0].to(base.device)
    eps = config.eps
    stacked = torch.stack([e.to(base.device) for e in experts])
    if config.use_base:
        stacked = stacked - base
    flat = stacked.reshape(len(experts), -1)
    a = torch.tensor(w, dtype=stacked.dtype, device=stacked.device)
    if config.normalize_weights:
        a = a / a.sum()
    norms = torch.norm(flat, dim=-1, keepdim=True)
    units = flat / (norms + eps)
    mean = (units * a.view(-1, 1)).sum(0)
    mean_norm = torch.norm(mean)
    origin = base if config.use_base else torch.zeros_like(base)
    if mean_norm < eps:
        if len(experts) == 2:  # two opposite vectors: the straight line
            return (stacked[0] * a[0] + stacked[1] * a[1]).reshape(base.shape) + origin
        raise InputError(f"multislerp: the weighted mean direction of the {len(experts)} models is zero (weights {w} "
                         "balance opposite vectors exactly); use different weights.")
    mean = mean / mean_norm
    tangents = units - (units * mean).sum(-1, keepdim=True) * mean  # projected onto the tangent space at the mean
    tangent = (tangents * a.view(-1, 1)).sum(0)
    step = torch.norm(tangent) + eps
    out = (mean * torch.cos(step) + tangent * (torch.sin(step) / step)) * (norms.squeeze(-1) * a).sum()
    return out.reshape(base.shape) + origin


@dataclass(frozen=True)
class NearswapConfig:
    """``t``: the distance below which the expert's value is taken whole (mergekit requires it in a YAML)."""

    t: float = 0.5

    def __post_init__(self):
        check_config(self)
        warn_outside(self, "t", 0.0, None, "no entry is near enough to swap, so the result is the base")


NEARSWAP_MERGEKIT = MergekitSpec(parameters=(MergekitParameter("t", required=True),))


def nearswap(
    base: Tensor,
    experts: Sequence[Tensor],
    config: NearswapConfig = NearswapConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """NearSwap on one tensor: blend weight ``clamp(t / |θ1 − θ0|, 0, 1)`` towards the one expert, per entry."""
    check_no_weights(weights, "nearswap")
    expert = _one_expert(experts, "nearswap").to(base.device)
    blend = (config.t / torch.abs(base - expert).clamp(min=1e-6)).clamp(min=0, max=1)
    return blend * expert + (1 - blend) * base
