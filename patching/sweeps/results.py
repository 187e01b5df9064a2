"""Result containers of the patching methods and their JSON form (their figures: :mod:`circuits.show.patching_figures`).

* :class:`NodeScores`: one score per attention head (``heads [layer, head]``) and
  per MLP (``mlps [layer]``), as path patching and attribution patching give;
  ``figure()`` draws Zhang et al. (2024) Figure 2 (heads x layers heatmap with
  an MLP column); :func:`patching.node_level.head_ranking.key_heads` picks the heads that matter.
* :class:`ActivationScores`: activation patching over any grid of
  (layer, pos, head) in TransformerLens' layout.
* :class:`KnockoutCurve`: accuracy against the number of knocked-out heads,
  effect-rank vs random-rank (Figure 3), plus optional transfer results (Figure 4).

Scores are *effects*: the metric of the patched run minus the reference run's,
averaged over prompts. ``percent`` divides by the mean reference metric (the
paper's "% change of the ground-truth logit"). That is meaningful for metrics
whose reference value is far from zero (``logit``, ``prob``); for a metric that
can average near zero (``logit_diff``) read the absolute effects: with a
reference of (almost) exactly zero the percentages are NaN and a percent
threshold in :func:`patching.node_level.head_ranking.key_heads` is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from jaxtyping import Float
from torch import Tensor

from circuits.errors import InputError
from circuits.nodes import MLP, Head, Node


def _finite(x: float) -> Optional[float]:
    return None if x is None or not math.isfinite(x) else float(x)


MIN_BASELINE = 1e-6  # |reference metric| below this has no meaningful percentages


def has_percent(baseline: float) -> bool:
    """Whether effects in % of the reference metric mean anything (not when it averages ~0)."""
    return math.isfinite(baseline) and abs(baseline) >= MIN_BASELINE


def _percent(effects: Tensor, baseline: float) -> Tensor:
    if not has_percent(baseline):
        return torch.full_like(effects, float("nan"))
    return 100.0 * effects / abs(baseline)


@dataclass
class NodeScores:
    """Per-node effects: ``heads [n_layers, n_heads]`` and ``mlps [n_layers]`` (NaN where not scored)."""

    heads: Float[Tensor, "layer head"]
    mlps: Float[Tensor, "layer"]
    metric: str
    baseline: float
    n_prompts: int
    method: str = "path_patching"
    info: dict = field(default_factory=dict)
    prompt_effects: dict = field(default_factory=dict, repr=False)  # node -> per-prompt effects, for intervals

    def estimate(self, node: Node, seed: int = 0):
        """The node's mean effect with a 95% percentile-bootstrap interval over prompts (needs ``prompt_effects``)."""
        from circuits.stats import bootstrap

        if node not in self.prompt_effects:
            raise ValueError(f"No per-prompt effects for {node}: intervals need scores from path_patch of this version.")
        return bootstrap(self.prompt_effects[node], seed=seed)

    def intervals(self) -> dict:
        """``{"heads_ci": [layer][head] -> [low, high], "mlps_ci": [layer] -> [low, high]}`` (null where unscored)."""
        from circuits.stats import bootstrap

        heads = [[None] * self.heads.shape[1] for _ in range(self.heads.shape[0])]
        mlps = [None] * self.mlps.shape[0]
        for node, values in self.prompt_effects.items():
            e = bootstrap(values)
            ci = [_finite(e.low), _finite(e.high)]
            if isinstance(node, Head):
                heads[node.layer][node.head] = ci
            else:
                mlps[node.layer] = ci
        return {"heads_ci": heads, "mlps_ci": mlps, "interval": "95% percentile bootstrap over prompts"}

    @property
    def heads_percent(self) -> Tensor:
        """Head effects in % of the mean reference metric (NaN when that is ~0)."""
        return _percent(self.heads, self.baseline)

    @property
    def mlps_percent(self) -> Tensor:
        """MLP effects in % of the mean reference metric (NaN when that is ~0)."""
        return _percent(self.mlps, self.baseline)

    def score(self, node: Node) -> float:
        """The effect of one node."""
        return float(self.heads[node.layer, node.head] if isinstance(node, Head) else self.mlps[node.layer])

    def percent(self, node: Node) -> float:
        """The effect of one node in % of the mean reference metric (NaN when that is ~0)."""
        return float(_percent(torch.tensor(self.score(node)), self.baseline))

    def ranked(self, kind: str = "all", by: str = "abs") -> list[tuple[Node, float]]:
        """Scored nodes sorted by importance: ``by="abs"`` (largest |effect|), ``"neg"`` (largest drop) or ``"pos"``.

        ``kind`` is ``"all"``, ``"heads"`` or ``"mlps"``.
        """
        keys = {"abs": lambda v: -abs(v), "neg": lambda v: v, "pos": lambda v: -v}
        if by not in keys:
            raise InputError(f"Unknown ranking {by!r}: use 'abs', 'neg' or 'pos'.")
        if kind not in ("all", "heads", "mlps"):
            raise InputError(f"Unknown node kind {kind!r}: use 'all', 'heads' or 'mlps'.")
        items: list[tuple[Node, float]] = []
        if kind in ("all", "heads"):
            items += [(Head(l, h), float(v)) for (l, h), v in _enumerate2(self.heads)]
        if kind in ("all", "mlps"):
            items += [(MLP(l), float(v)) for l, v in enumerate(self.mlps.tolist())]
        items = [(n, v) for n, v in items if math.isfinite(v)]
        return sorted(items, key=lambda item: keys[by](item[1]))

    def to_dict(self) -> dict:
        """JSON-ready: effects, percentages, the ranked nodes and metadata (NaN becomes null)."""
        as_list = lambda t: [[_finite(v) for v in row] for row in t.tolist()] if t.ndim == 2 else [_finite(v) for v in t.tolist()]
        return {
            "method": self.method,
            "metric": self.metric,
            "baseline": self.baseline,
            "n_prompts": self.n_prompts,
            "heads": as_list(self.heads),
            "mlps": as_list(self.mlps),
            "heads_percent": as_list(self.heads_percent),
            "mlps_percent": as_list(self.mlps_percent),
            "ranked": [[str(n), v] for n, v in self.ranked()],
            "info": self.info,
        } | (self.intervals() if self.prompt_effects else {})

    def figure(self, percent: bool = True, title: Optional[str] = None, key_heads: Optional[list] = None):
        """Zhang et al. Figure 2: heads x layers heatmap with an MLP column (:func:`circuits.show.patching_figures.node_scores_figure`)."""
        from circuits.show.patching_figures import node_scores_figure

        unit_percent = percent and has_percent(self.baseline)
        return node_scores_figure(self.heads_percent if unit_percent else self.heads,
                                  self.mlps_percent if unit_percent else self.mlps,
                                  unit="%" if unit_percent else self.metric,
                                  title=title or f"{self.method}: change of {self.metric} at END "
                                                 f"({'%' if unit_percent else self.metric}), {self.n_prompts} prompts",
                                  key_heads=key_heads)

def _enumerate2(t: Tensor):
    for l, row in enumerate(t.tolist()):
        for h, v in enumerate(row):
            yield (l, h), v




@dataclass
class ActivationScores:
    """Activation patching in TransformerLens' layout: ``patched`` is the mean patched metric over ``axes``."""

    patched: Tensor
    axes: tuple[str, ...]
    component: str
    metric: str
    baseline: float
    n_prompts: int

    @property
    def effect(self) -> Tensor:
        """Patched metric minus the reference metric."""
        return self.patched - self.baseline

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"component": self.component, "axes": list(self.axes), "metric": self.metric, "baseline": self.baseline,
                "n_prompts": self.n_prompts, "patched": self.patched.tolist(), "effect": self.effect.tolist()}

    def figure(self, title: Optional[str] = None):
        """Heatmap of the effect (:func:`circuits.show.patching_figures.activation_scores_figure`)."""
        from circuits.show.patching_figures import activation_scores_figure

        return activation_scores_figure(self.effect, title=title or f"activation patching of {self.component} "
                                                                   f"({', '.join(self.axes)}): change of {self.metric}")

@dataclass
class KnockoutCurve:
    """Accuracy after knocking out k heads: effect-ranked vs random, with 95% intervals.

    ``effect_ci`` and ``base_ci`` are Wilson intervals over the ``n_prompts`` prompts;
    ``random_ci`` a bootstrap over prompts and the ``n_seeds`` random head sets (both vary);
    ``random_std`` the std over seeds of the per-seed accuracy; ``effect_drop`` the paired
    bootstrap of base minus effect-rank accuracy per k; ``n_pool`` the prompts the ablation
    means were averaged over (none of them evaluated); ``random_sets`` / ``random_per_seed`` the
    random draws and their accuracies (to see which heads move a random knockout).
    """

    ks: list[int]
    effect_rank: list[float]
    random_rank: list[float]
    random_std: list[float]
    base_accuracy: float
    heads: list[str]
    n_seeds: int
    transfer: dict = field(default_factory=dict)
    n_prompts: int = 0
    n_pool: int = 0
    base_ci: list = field(default_factory=list)
    effect_ci: list = field(default_factory=list)
    random_ci: list = field(default_factory=list)
    effect_drop: list = field(default_factory=list)
    random_sets: list = field(default_factory=list)  # per k: the heads of each seed's draw
    random_per_seed: list = field(default_factory=list)  # per k: each seed's accuracy
    intervals: str = ("95%: effect-rank and base Wilson over prompts; random-rank percentile bootstrap over prompts "
                      "and seeds; effect_drop paired bootstrap over prompts")

    def to_dict(self) -> dict:
        """JSON-ready form (NaN becomes null)."""
        clean = lambda v: [clean(x) for x in v] if isinstance(v, list) else _finite(v) if isinstance(v, float) else v
        return {k: clean(v) if isinstance(v, (list, float)) else v for k, v in self.__dict__.items()}

    def figure(self, title: Optional[str] = None):
        """Zhang et al. Figure 3: accuracy vs knocked-out heads (:func:`circuits.show.patching_figures.knockout_figure`)."""
        from circuits.show.patching_figures import knockout_figure

        return knockout_figure(self, title=title)

    def transfer_figure(self, title: Optional[str] = None):
        """Zhang et al. Figure 4: accuracy per format before/after the knockout (:func:`circuits.show.patching_figures.transfer_figure`)."""
        from circuits.show.patching_figures import transfer_figure

        return transfer_figure(self.transfer, title=title)
