"""How a sweep runs, as one record shared by every patching method: :class:`SweepOptions`.

Path patching, activation and attribution patching, edge attribution, exact edge patching,
circuit evaluation and faithfulness curves all score runs by a metric at END, split their
prompts into batches, size their batched forwards to a memory budget, may skip the prefix
that reference and counterfactual share, and show progress bars. Those five settings travel
together as one frozen record::

    opts = SweepOptions(metric="prob", memory_mb=4096)
    edge_patch(model, None, data, options=opts)
    faithfulness_curve(model, scores, data, options=opts)

Every method also takes the fields as keywords (``edge_patch(model, None, data, metric="prob")``),
which replace the record's values; an unknown keyword is an error that lists the fields.
``memory_mb`` and ``progress`` default to ``None``: each method's own default (1024 MB, or 2048 MB
for edge attribution's backward passes; a bar for sweeps, none for circuit evaluation).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Optional, Union

from circuits.arguments import check_positive_int
from circuits.errors import InputError


@dataclass(frozen=True)
class SweepOptions:
    """The metric, batching, memory budget, shared-prefix reuse and progress of one sweep (module docstring)."""

    #: a name in :data:`patching.metrics.METRICS` or a callable ``fn(logits, answer_ids, alt_ids) -> [batch]``
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

    def shows_progress(self, default: bool = True) -> bool:
        """``progress``, or the method's ``default`` when it is None."""
        return default if self.progress is None else bool(self.progress)


FIELDS = tuple(f.name for f in dataclasses.fields(SweepOptions))


def sweep_options(options: Optional[SweepOptions], overrides: dict, where: str) -> SweepOptions:
    """``options`` (default: :class:`SweepOptions`) with the keyword ``overrides`` applied.

    ``where`` names the function in the message for a keyword that is not a sweep option.
    """
    if options is not None and not isinstance(options, SweepOptions):
        raise InputError(f"{where}: options must be a patching.SweepOptions, got {type(options).__name__}.")
    unknown = sorted(set(overrides) - set(FIELDS))
    if unknown:
        raise InputError(f"{where}() got unexpected keyword argument(s) {', '.join(unknown)}; its sweep options are "
                         f"{', '.join(FIELDS)} (patching.SweepOptions).")
    return dataclasses.replace(options or SweepOptions(), **overrides)


def split_sweep_keywords(kwargs: dict, where: str) -> tuple[SweepOptions, dict]:
    """The :class:`SweepOptions` of a wrapper's ``**kwargs`` (``options=`` plus option keywords), and the rest."""
    rest = dict(kwargs)
    options = rest.pop("options", None)
    own = {name: rest.pop(name) for name in FIELDS if name in rest}
    return sweep_options(options, own, where), rest
