"""Patching metrics: what a patched run is scored by, at the END position.

Every patching method in this package scores a run by a function of the logits
at END (the position that predicts the answer's first token). A metric maps

    logits [batch, d_vocab], answer_ids [batch], alt_ids [batch] | None -> [batch]

and the methods report its change from the unpatched reference run. The
registry :data:`METRICS` holds the built-in ones:

* ``"logit"``: the correct answer token's logit (Zhang et al. 2024 report its
  change, absolute and in % of the reference value);
* ``"logit_diff"``: the answer's logit minus a chosen alternative token's
  (``alt_ids``, e.g. the answer of a different operation);
* ``"prob"`` and ``"logprob"``: the answer token's probability / log-probability.

Metrics that read only a few vocabulary columns (``full_vocab=False``) let the
methods unembed only those columns: gemma-3's vocabulary has 262k tokens, and
a full unembedding costs more than all 18 blocks together. Any other callable
with the signature above is accepted and sees the full vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, get_args

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from circuits.errors import InputError, InputTypeError
from circuits.end_logits import unembed_end

MetricFn = Callable[[Tensor, Tensor, Tensor | None], Tensor]


@dataclass(frozen=True)
class PatchMetric:
    """A named END-position metric; ``full_vocab=False`` means it only reads the answer/alt columns."""

    name: str
    fn: MetricFn
    full_vocab: bool = True
    needs_alt: bool = False


def _logit(logits, answer_ids, alt_ids=None):
    return logits.gather(-1, answer_ids[:, None])[:, 0]


def _logit_diff(logits, answer_ids, alt_ids):
    return _logit(logits, answer_ids) - _logit(logits, alt_ids)


def _logprob(logits, answer_ids, alt_ids=None):
    return logits.float().log_softmax(-1).gather(-1, answer_ids[:, None])[:, 0]


def _prob(logits, answer_ids, alt_ids=None):
    return _logprob(logits, answer_ids).exp()


METRICS: dict[str, PatchMetric] = {
    "logit": PatchMetric("logit", _logit, full_vocab=False),
    "logit_diff": PatchMetric("logit_diff", _logit_diff, full_vocab=False, needs_alt=True),
    "prob": PatchMetric("prob", _prob, full_vocab=True),
    "logprob": PatchMetric("logprob", _logprob, full_vocab=True),
}


MetricName = Literal["logit", "logit_diff", "prob", "logprob"]  # the keys of METRICS
MetricLike = MetricName | PatchMetric | MetricFn  # what every patching function's ``metric=`` accepts
assert set(get_args(MetricName)) == set(METRICS), "MetricName lists the keys of METRICS"


def get_metric(metric: MetricLike) -> PatchMetric:
    """Resolve a registry name, a :class:`PatchMetric`, or a plain callable (full vocabulary) to a metric."""
    if isinstance(metric, PatchMetric):
        return metric
    if isinstance(metric, str):
        if metric not in METRICS:
            raise InputError(f"Unknown metric {metric!r}: use one of {sorted(METRICS)} or pass a callable "
                             f"fn(logits, answer_ids, alt_ids) -> per-prompt values.")
        return METRICS[metric]
    if callable(metric):
        return PatchMetric(getattr(metric, "__name__", "custom"), metric, full_vocab=True)
    raise InputTypeError(f"metric must be a name, a PatchMetric or a callable, got {type(metric).__name__}.")


def score_end(
    model: HookedTransformer,
    resid_end: Float[Tensor, "batch d_model"],
    answer_ids: Int[Tensor, "batch"],
    alt_ids: Int[Tensor, "batch"] | None,
    metric: PatchMetric,
) -> Float[Tensor, "batch"]:
    """Final norm, unembedding (only the needed columns when the metric allows) and the metric, per row."""
    if metric.needs_alt and alt_ids is None:
        raise InputError(f"Metric {metric.name!r} compares against an alternative token: pass alt_ids.")
    if metric.full_vocab:
        return check_metric_values(metric, metric.fn(unembed_end(model, resid_end), answer_ids, alt_ids), len(answer_ids))
    needed = answer_ids if alt_ids is None else torch.cat([answer_ids, alt_ids])
    columns = torch.unique(needed)  # sorted, so searchsorted maps token ids to column indices
    logits = unembed_end(model, resid_end, columns)
    local_alt = None if alt_ids is None else torch.searchsorted(columns, alt_ids)
    return check_metric_values(metric, metric.fn(logits, torch.searchsorted(columns, answer_ids), local_alt), len(answer_ids))


def check_metric_values(metric: PatchMetric, values: object, batch: int) -> Float[Tensor, "batch"]:
    """A metric's output must be one finite value per prompt; anything else would give garbage effects.

    (A metric that averages over the batch returns a scalar: patching would then compare sums of
    different sizes. A NaN would silently drop every node from the key heads.)
    """
    if not isinstance(values, Tensor) or tuple(values.shape) != (batch,):
        shape = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
        raise InputError(f"Metric {metric.name!r} returned {shape} for {batch} prompts; a metric must return one "
                         f"value per prompt (a tensor of shape ({batch},)), not a mean or a [batch, ...] tensor.")
    if not torch.isfinite(values.detach()).all():
        raise InputError(f"Metric {metric.name!r} returned NaN/Inf for {int((~torch.isfinite(values.detach())).sum())} "
                         f"of {batch} prompts; patching effects would be meaningless. Fix the metric (e.g. clamp "
                         "before a log).")
    return values
