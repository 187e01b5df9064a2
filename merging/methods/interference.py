"""WUDI merging (Cheng et al. 2025, "Whoever Started the Interference Should End It", arXiv 2503.08099).

Data-free, not in mergekit 0.1.5. The paper's observation: after a short fine-tune, the rows of a
linear layer's task vector ``τ_i`` (``[out, in]``) lie close to the span of the inputs the layer saw
on task ``i``. So the interference a merged update ``τ_m`` causes on task ``i``'s inputs,
``‖(τ_m − τ_i) x‖``, is bounded through ``τ_i`` itself, and per linear layer WUDI minimises

    L(τ_m) = Σ_i ‖(τ_m − τ_i) τ_iᵀ‖²_F / ‖τ_i‖²_F

by Adam (learning rate ``lr`` 1e-5, ``steps`` 300, no weight decay: the defaults of the authors'
code as FusionBench carries it), starting from the task-arithmetic sum ``Σ_i τ_i``; the other
tensors (biases, norms, embeddings) get the mean task vector ``Σ_i τ_i / N``. θ = θ0 + τ_m.

The loss is quadratic, so its gradient is written out rather than taken by autograd:
in TransformerLens's ``[in, out]`` layout (``X_i = τ_iᵀ``, ``M = τ_mᵀ``)
``∇ = 2 Σ_i X_i X_iᵀ (M − X_i) / ‖X_i‖²``, through the ``[in, in]`` matrices ``X_i X_iᵀ`` formed
once or through the ``[out, out]`` products ``X_iᵀ (M − X_i)``, whichever costs less. Tested equal
to autograd's gradient of the loss as written above, and Adam on it to Adam on autograd's.

Linear layers: the matrices :func:`merging.methods.spectral.matrix_view` sees (per-head attention
weights as the layer's matrix, ``W_in``/``W_gate``/``W_out``, the unembedding ``W_U``), except
the embeddings ``W_E`` and ``W_pos`` (lookups, not linear layers of an input). Called without a
``key``, a 2-D tensor is a linear layer in the ``[in, out]`` layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from circuits.errors import InputError
from merging.methods.config_checks import check_config, check_no_weights
from merging.methods.mergekit_spec import INT8_MASK, MergekitParameter, MergekitSpec
from merging.methods.spectral import matrix_view
from merging.primitives import task_vectors

EMBEDDINGS = ("W_E", "W_pos")  # 2-D but lookups: merged as the mean task vector


@dataclass(frozen=True)
class WudiConfig:
    """``steps`` Adam steps at learning rate ``lr`` per linear layer (the paper's code: 300 at 1e-5)."""

    steps: int = 300
    lr: float = 1e-5

    def __post_init__(self):
        check_config(self)
        if self.steps < 0 or not 0 < self.lr <= 1:
            raise InputError(f"WudiConfig(steps={self.steps}, lr={self.lr}): steps must be >= 0 and lr in (0, 1] "
                             "(an Adam step moves each entry by about lr, and task vectors' entries are far below 1; "
                             "the paper's code: steps=300, lr=1e-5).")


# Not in mergekit: its YAML under our name wudi; no per-model weights (the paper has none).
WUDI_MERGEKIT = MergekitSpec(parameters=(MergekitParameter("steps", kind=int), MergekitParameter("lr"), INT8_MASK))


def interference_loss(merged: Tensor, tvs: Sequence[Tensor]) -> Tensor:
    """``Σ_i ‖(τ_m − τ_i) τ_iᵀ‖² / ‖τ_i‖²`` for ``[in, out]`` matrices (a zero task vector adds nothing)."""
    total = merged.new_zeros(())
    for tv in tvs:
        norm2 = tv.square().sum()
        if norm2 > 0:
            total = total + (tv.T @ (merged - tv)).square().sum() / norm2
    return total


def interference_gradient(tvs: Sequence[Tensor]) -> Callable[[Tensor], Tensor]:
    """``gradient(M)`` of :func:`interference_loss` in ``M`` for the ``[in, out]`` task matrices ``tvs``.

    ``∇ = 2 Σ_i X_i X_iᵀ (M − X_i) / ‖X_i‖²``, each difference taken first (as autograd on the loss does:
    Adam turns rounding noise in a near-zero gradient into full-size steps), through the ``[in, in]``
    matrices ``X_i X_iᵀ`` formed once when ``in ≤ 2 · out``, else through ``X_iᵀ (M − X_i)`` (``[out, out]``).
    """
    terms = [(tv, norm2) for tv, norm2 in ((tv, tv.square().sum()) for tv in tvs) if norm2 > 0]
    if not terms:
        return torch.zeros_like
    n_in, n_out = terms[0][0].shape
    if n_in <= 2 * n_out:
        grams = [(tv @ tv.T / norm2, tv) for tv, norm2 in terms]
        return lambda merged: 2 * sum(gram @ (merged - tv) for gram, tv in grams)
    return lambda merged: 2 * sum(tv @ (tv.T @ (merged - tv)) / norm2 for tv, norm2 in terms)


def wudi_delta(tvs: Sequence[Tensor], steps: int, lr: float) -> Tensor:
    """WUDI's merged task matrix (``[in, out]``): Adam on :func:`interference_loss` from ``Σ_i τ_i``."""
    gradient = interference_gradient(tvs)
    merged = torch.nn.Parameter(torch.stack(list(tvs)).sum(dim=0))
    optimizer = torch.optim.Adam([merged], lr=lr, weight_decay=0)
    for _ in range(steps):
        merged.grad = gradient(merged.detach())
        optimizer.step()
    return merged.detach()


def wudi(base: Tensor, experts: Sequence[Tensor], config: WudiConfig = WudiConfig(), *,
         weights: Sequence[float] | None = None, key: str | None = None, **_: object) -> Tensor:
    """WUDI on one tensor (``key``, the state-dict name, decides whether it is a linear layer's matrix)."""
    check_no_weights(weights, "wudi")
    tvs = task_vectors(base, experts)
    view = matrix_view(key, tvs[0])
    if view is None or (key or "").rsplit(".", 1)[-1] in EMBEDDINGS:
        delta = torch.stack(tvs).mean(dim=0)
    else:
        delta = view[1](wudi_delta([matrix_view(key, tv)[0] for tv in tvs], config.steps, config.lr))
    return (base.to(delta.dtype) + delta).to(base.dtype)
