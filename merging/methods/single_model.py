"""Passthrough (mergekit's ``passthrough``): one model's tensors, copied, optionally times ``scale``.

mergekit uses it to stack layer slices of models into a new one (a "frankenmerge");
here it is the one-model case whose result loads into the same architecture: a
``models:`` list of one model, or ``slices:`` whose one slice takes every layer of
one model (:func:`merging.load_mergekit_config` refuses slices that change the
layer count). The base is not an input (mergekit ignores it). ``scale`` (per model
in a YAML) multiplies every tensor; None copies them unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from circuits.errors import InputError
from merging.methods.config_checks import check_config, check_no_weights
from merging.methods.mergekit_spec import MergekitParameter, MergekitSpec


@dataclass(frozen=True)
class PassthroughConfig:
    """``scale``: a factor for every tensor of the model (None: copied unchanged); one value, or one per model."""

    scale: float | tuple[float | None, ...] | None = None

    def __post_init__(self):
        check_config(self)


PASSTHROUGH_MERGEKIT = MergekitSpec(parameters=(MergekitParameter("scale", per_expert=True),), needs_base=False)


def passthrough(
    base: Tensor,
    experts: Sequence[Tensor],
    config: PassthroughConfig = PassthroughConfig(),
    *,
    weights: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """The one model's tensor (``experts[0]``; ``base`` is not an input), times ``scale`` when one is given."""
    check_no_weights(weights, "passthrough")
    if len(experts) != 1:
        raise InputError(f"passthrough copies exactly one model, got {len(experts)}: give one model (mergekit "
                         "stacks several only as layer slices, which change the layer count).")
    if isinstance(config.scale, tuple) and len(config.scale) != 1:
        raise InputError(f"PassthroughConfig.scale has {len(config.scale)} values for one model: give one.")
    scale = config.scale[0] if isinstance(config.scale, tuple) else config.scale
    tensor = experts[0].to(base.device)
    return tensor.clone() if scale is None else tensor * scale
