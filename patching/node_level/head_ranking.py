"""Key heads: which heads an experiment calls "the key heads", chosen one way, and recorded.

:func:`key_heads` takes the top of one ranking (:class:`patching.sweeps.results.NodeScores`); the rest of
this module combines rankings over operations.

Path patching (:func:`patching.node_level.path_patching.path_patch`) scores every head by how much the answer logit
drops when the head's direct path to the logits is patched with a counterfactual run's output. The key
heads are the heads with the largest drop (Zhang et al. 2024). With several operations there are
three ways to combine the rankings, named by ``combine``:

* ``"per-op"``: the top-k of each operation, kept apart (``KeyHeads.by_op``); ``heads`` lists them all,
  each once, in operation order. Use it to compare operations (``experiments.transfer``).
* ``"union"``: the same per-operation top-k, pooled into one set (``heads``): up to ``k * n_ops`` heads
  that matter for at least one operation (``experiments.merge``).
* ``"sum"``: each head's effect in % of its operation's mean answer logit (so operations with larger
  logits do not dominate), summed over operations, then the k largest drops: heads that matter across
  operations (``experiments.precise_sft``'s ranking).

With one operation all three choose the same heads. :attr:`KeyHeads.rule` is a dict that results.json
stores as ``key_heads_rule``, so a reader knows which of these a list of key heads is.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal, Mapping, Optional

import torch

from circuits.errors import InputError
from circuits.nodes import Head
from circuits.arguments import check_option
from patching.sweeps.options import SweepOptions, sweep_options
from patching.node_level.path_patching import path_patch
from patching.sweeps.results import NodeScores, has_percent

Combine = Literal["per-op", "union", "sum"]
RANKING = "largest drop of the answer logit under path patching to the logits"


def key_heads(
    result: NodeScores, threshold: Optional[float] = None, top_k: Optional[int] = None, by: str = "neg"
) -> tuple[list[Head], float]:
    """The key heads and the fraction of all heads they are.

    ``threshold`` keeps heads whose effect is at least that many % of the reference
    metric in the ranking direction (``by="neg"``: a drop of >= threshold %;
    ``"abs"``: |effect| >= threshold %); ``top_k`` keeps at most the first k.
    With neither, heads whose |effect| is >= 5% are kept.
    """
    if threshold is None and top_k is None:
        threshold, by = 5.0, "abs"
    if top_k is not None and top_k < 0:
        raise InputError(f"top_k must be >= 0, got {top_k}.")
    # NaN marks a head that was not scored; no head scored, an Inf or a NaN reference means a broken metric.
    if torch.isinf(result.heads).any() or torch.isnan(result.heads).all() or not math.isfinite(result.baseline):
        raise InputError(f"The {result.metric} scores are not usable (reference {result.baseline}, "
                         f"{int(torch.isnan(result.heads).sum())} NaN and {int(torch.isinf(result.heads).sum())} Inf "
                         "head effects); no key heads can be chosen. Check the metric and the model.")
    ranked = result.ranked("heads", by=by)
    if threshold is not None:
        if not has_percent(result.baseline):
            raise InputError(f"The reference {result.metric} averages {result.baseline:.3g}, so a threshold in % of it "
                             f"means nothing: pass top_k instead, or score with metric='logit'.")
        signed = {"neg": lambda v: -v, "pos": lambda v: v, "abs": abs}[by]
        ranked = [(n, v) for n, v in ranked if signed(result.percent(n)) >= threshold]
    if top_k is not None:
        ranked = ranked[:top_k]
    heads = [n for n, _ in ranked]
    return heads, len(heads) / result.heads.numel()


@dataclass
class KeyHeads:
    """The chosen heads, each operation's own top-k, the scores they came from, and the rule."""

    heads: list[Head]
    by_op: dict[str, list[Head]]
    rule: dict
    scores: dict[str, NodeScores] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        """``key_heads``, ``key_heads_by_op`` and ``key_heads_rule`` for results.json."""
        return {"key_heads": [str(h) for h in self.heads],
                "key_heads_by_op": {op: [str(h) for h in heads] for op, heads in self.by_op.items()},
                "key_heads_rule": self.rule}


def combine_key_heads(scores_by_op: Mapping[str, NodeScores], *, top_k: int, combine: Combine = "per-op") -> KeyHeads:
    """Key heads from path-patching scores already computed, one :class:`NodeScores` per operation."""
    check_option("combine", combine, Combine)
    if not scores_by_op:
        raise InputError("No operation's scores were given: pass at least one {operation: NodeScores}.")
    if top_k < 1:
        raise InputError(f"top_k must be >= 1, got {top_k}.")
    by_op = {op: key_heads(scores, top_k=top_k)[0] for op, scores in scores_by_op.items()}
    if combine == "sum":
        heads = _summed_percent_order(scores_by_op)[:top_k]
    else:
        heads = list(dict.fromkeys(h for op_heads in by_op.values() for h in op_heads))
    rule = {"source": "path_patching", "ranking": RANKING, "combine": combine, "top_k": top_k, "ops": list(scores_by_op),
            "n_prompts": {op: s.n_prompts for op, s in scores_by_op.items()}}
    return KeyHeads(heads, by_op, rule, dict(scores_by_op))


def rank_key_heads(model, datasets_by_op: Mapping[str, object], *, top_k: int, combine: Combine = "per-op",
                   options: Optional[SweepOptions] = None) -> KeyHeads:
    """Path-patch every head on each operation's prompts (a ``circuits.tasks.make_dataset`` dataset per
    operation, usually only the correctly answered ones) and choose the key heads by ``combine``.

    ``options``: the path patching's :class:`patching.SweepOptions` (no progress bar unless asked)."""
    check_option("combine", combine, Combine)
    options = sweep_options(options, "rank_key_heads")
    options = dataclasses.replace(options, progress=options.shows_progress(False))
    scores = {op: path_patch(model, data, options=options) for op, data in datasets_by_op.items()}
    return combine_key_heads(scores, top_k=top_k, combine=combine)


def given_key_heads(heads: list[Head]) -> KeyHeads:
    """Key heads named by the user (``--heads``): recorded as such, no ranking."""
    return KeyHeads(list(heads), {}, {"source": "--heads", "combine": None, "top_k": len(heads)})


def _summed_percent_order(scores_by_op: Mapping[str, NodeScores]) -> list[Head]:
    """Heads by the sum over operations of their effect in % of the mean answer logit, largest drop first."""
    total: dict[Head, float] = {}
    for scores in scores_by_op.values():
        for head, _ in scores.ranked("heads"):
            total[head] = total.get(head, 0.0) + scores.percent(head)
    ranked = sorted(((h, v) for h, v in total.items() if math.isfinite(v)), key=lambda item: item[1])
    return [h for h, _ in ranked]
