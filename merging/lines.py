"""LiNeS (Wang et al., ICLR 2025): layer-increasing scaling of a merged task vector, on top of any merge.

Shallow layers hold general features that fine-tuning and merging should
disturb least. LiNeS rescales the update of layer ``ℓ`` of ``L`` (``ℓ = 1..L``):

    λ(ℓ) = α + β (ℓ − 1)/(L − 1),        θ_ℓ ← θ0_ℓ + λ(ℓ) (θ_ℓ − θ0_ℓ)

where ``θ`` is the merged model of any method (for task arithmetic, ``θ − θ0``
is the summed task vector of the paper's multi-task setting). The paper tunes
``α`` and ``β`` on validation data; the defaults here (1, 0) leave the merge as
it is. Which layer a TransformerLens parameter belongs to, as we read the
paper: ``blocks.{i}.*`` is layer ``i + 1``; the embeddings (``embed``,
``pos_embed``) take the first layer's scale and the final norm and
unembedding the last layer's. ``L = 1`` uses ``α``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from merging.methods.config_checks import check_config
from merging.primitives import work_dtype

_BLOCK = re.compile(r"^blocks\.(\d+)\.")


@dataclass(frozen=True)
class LinesConfig:
    """``alpha``: scale of the first layer's update; ``beta``: added linearly up to the last layer."""

    alpha: float = 1.0
    beta: float = 0.0

    def __post_init__(self):
        check_config(self)


def n_layers_of(keys: Sequence[str]) -> int:
    """Number of transformer blocks named in ``keys`` (0 when none)."""
    layers = [int(m.group(1)) for k in keys if (m := _BLOCK.match(k))]
    return max(layers) + 1 if layers else 0


def layer_scale(key: str, n_layers: int, config: LinesConfig) -> float:
    """``λ(ℓ)`` for the parameter ``key`` in a model of ``n_layers`` blocks."""
    m = _BLOCK.match(key)
    if m:
        depth = int(m.group(1))
    elif key.startswith(("embed.", "pos_embed.")):
        depth = 0
    else:  # ln_final, unembed
        depth = max(n_layers - 1, 0)
    if n_layers <= 1:
        return config.alpha
    return config.alpha + config.beta * depth / (n_layers - 1)


def apply_lines(base: Tensor, merged: Tensor, scale: float) -> Tensor:
    """``θ0 + scale · (θ − θ0)`` in the base dtype."""
    dt = work_dtype(base)
    b = base.to(dt)
    return (b + scale * (merged.to(dt) - b)).to(base.dtype)
