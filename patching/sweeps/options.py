"""How a sweep runs, as one record shared by every patching method: :class:`SweepOptions`.

Path patching, activation and attribution patching, edge attribution, exact edge patching,
circuit evaluation and faithfulness curves all score runs by a metric at END, split their
prompts into batches, size their batched forwards to a memory budget, may skip the prefix
that reference and counterfactual share, and show progress bars. Those five settings travel
together as one frozen record, the one way to pass them::

    opts = SweepOptions(metric="prob", memory_mb=4096)
    edge_patch(model, None, data, options=opts)
    faithfulness_curve(model, scores, data, options=opts)

``options=None`` (the default everywhere) means ``SweepOptions()``. ``batch_size``, ``memory_mb``
and ``progress`` default to ``None``: each method's own default (one group per prompt length, or
32 prompts for knockout and AF1; 1024 MB, or 2048 MB for edge attribution's backward passes; a bar
for sweeps, none for circuit evaluation). Knockout and AF1 batch and show progress but score by
top-1 accuracy on every position: they refuse a record that sets ``metric``, ``memory_mb`` or
``reuse_prefix`` where it does not apply, rather than ignore it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

from circuits.arguments import check_positive_int
from circuits.errors import InputError


@dataclass(frozen=True)
class SweepOptions:
    """The metric, batching, memory budget, shared-prefix reuse and progress of one sweep (module docstring)."""

    #: a name in :data:`patching.sweeps.metrics.METRICS` or a callable ``fn(logits, answer_ids, alt_ids) -> [batch]``
    metric: Union[str, Callable, object] = "logit"
    #: prompts per group (None: one group per prompt length)
    batch_size: Optional[int] = None
    #: activation budget of one batched forward or backward, in MB (None: the method's default)
    memory_mb: Optional[float] = None
    #: run only the positions after the prefix reference and counterfactual share
    reuse_prefix: bool = True
    #: show progress bars (None: the method's default)
    progress: Optional[bool] = None

    def __post_init__(self) -> None:
        check_positive_int(self.batch_size, "batch_size", allow_none=True)
        if self.memory_mb is not None and (isinstance(self.memory_mb, bool)
                                           or not isinstance(self.memory_mb, (int, float))
                                           or not math.isfinite(self.memory_mb) or self.memory_mb <= 0):
            raise InputError(f"memory_mb must be a finite number of MB > 0, got {self.memory_mb!r}.")

    def budget(self, default: float = 1024.0) -> float:
        """``memory_mb``, or the method's ``default`` when it is None."""
        return float(default if self.memory_mb is None else self.memory_mb)

    def batch(self, default: int) -> int:
        """``batch_size``, or the method's ``default`` when it is None."""
        return default if self.batch_size is None else self.batch_size

    def shows_progress(self, default: bool = True) -> bool:
        """``progress``, or the method's ``default`` when it is None."""
        return default if self.progress is None else bool(self.progress)


FIELDS = tuple(f.name for f in dataclasses.fields(SweepOptions))
_DEFAULTS = SweepOptions()


def sweep_options(options: Optional[SweepOptions], where: str, applies: Sequence[str] = FIELDS) -> SweepOptions:
    """``options``, or :class:`SweepOptions` when it is None, checked for ``where`` (the function's name).

    ``applies``: the fields the function uses; a record setting another one away from its default is refused.
    """
    if options is None:
        return SweepOptions()
    if not isinstance(options, SweepOptions):
        raise InputError(f"{where}: options must be a patching.SweepOptions (or None for the defaults), "
                         f"got {type(options).__name__}.")
    unused = [name for name in FIELDS if name not in applies and getattr(options, name) != getattr(_DEFAULTS, name)]
    if unused:
        raise InputError(f"{where} does not use the sweep option(s) {', '.join(unused)} (it uses "
                         f"{', '.join(applies)}): leave them at their defaults.")
    return options

