"""Result containers of the patching methods, their figures and their JSON form.

* :class:`NodeScores`: one score per attention head (``heads [layer, head]``) and
  per MLP (``mlps [layer]``), as path patching and attribution patching give;
  ``figure()`` draws Zhang et al. (2024) Figure 2 (heads x layers heatmap with
  an MLP column); :func:`key_heads` picks the heads that matter.
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
threshold in :func:`key_heads` is refused.
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


def _has_percent(baseline: float) -> bool:
    """Whether effects in % of the reference metric mean anything (not when it averages ~0)."""
    return math.isfinite(baseline) and abs(baseline) >= MIN_BASELINE


def _percent(effects: Tensor, baseline: float) -> Tensor:
    if not _has_percent(baseline):
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
        """Zhang et al. Figure 2: heads x layers heatmap with an MLP column (plotly).

        Heads and MLPs have their own symmetric colour scales (red: the metric drops when the
        node's path is patched, blue: it rises), so a large MLP effect does not wash out the
        heads; each scale is symmetric around 0 and reaches the largest |effect| of its kind.
        ``key_heads`` are outlined and labelled. ``percent=True`` falls back to absolute
        effects when the reference metric is ~0.
        """
        from plotly.subplots import make_subplots
        import plotly.graph_objects as go

        percent = percent and _has_percent(self.baseline)
        heads = (self.heads_percent if percent else self.heads).float().cpu()
        mlps = (self.mlps_percent if percent else self.mlps).float().cpu()
        bound = lambda t: float(torch.nan_to_num(t.abs(), nan=0.0).max()) or 1.0  # noqa: E731
        n_layers, n_heads = heads.shape
        unit = "%" if percent else self.metric
        # Each colour bar sits in the gap right of its own panel (heads panel ends at x = 0.84 * 0.8).
        fig = make_subplots(rows=1, cols=2, column_widths=[0.8, 0.2], horizontal_spacing=0.16,
                            subplot_titles=("heads", "MLPs (own scale)"))
        fig.add_trace(go.Heatmap(z=heads.numpy(), x=[str(h) for h in range(n_heads)], y=list(range(n_layers)),
                                 colorscale="RdBu", zmid=0, zmin=-bound(heads), zmax=bound(heads),
                                 colorbar=dict(title=f"heads ({unit})", x=0.68, xanchor="left", thickness=12, len=0.9),
                                 hovertemplate="L%{y}H%{x}: %{z:.3g}<extra></extra>"), 1, 1)
        fig.add_trace(go.Heatmap(z=mlps.numpy()[:, None], x=["MLP"], y=list(range(n_layers)),
                                 colorscale="RdBu", zmid=0, zmin=-bound(mlps), zmax=bound(mlps),
                                 colorbar=dict(title=f"MLPs ({unit})", x=1.01, xanchor="left", thickness=12, len=0.9),
                                 hovertemplate="MLP%{y}: %{z:.3g}<extra></extra>"), 1, 2)
        if key_heads:
            fig.add_trace(go.Scatter(
                x=[str(h.head) for h in key_heads], y=[h.layer for h in key_heads], mode="markers+text",
                text=[f"#{i + 1}" for i in range(len(key_heads))], textfont=dict(size=10, color="black"),
                marker=dict(symbol="square-open", size=22, color="black", line=dict(width=2)),
                name=f"key heads (top {len(key_heads)}, rank shown)",
                hovertemplate="key head #%{text}: L%{y}H%{x}<extra></extra>"), 1, 1)
            fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.12, x=0))
        fig.update_yaxes(title_text="layer", autorange="reversed", dtick=1, row=1, col=1)
        fig.update_yaxes(autorange="reversed", showticklabels=False, row=1, col=2)
        fig.update_xaxes(title_text="head", row=1, col=1)
        fig.update_layout(title=title or f"{self.method}: change of {self.metric} at END ({unit}), {self.n_prompts} prompts",
                          height=max(360, 24 * n_layers + 160))
        return fig


def _enumerate2(t: Tensor):
    for l, row in enumerate(t.tolist()):
        for h, v in enumerate(row):
            yield (l, h), v


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
        if not _has_percent(result.baseline):
            raise InputError(f"The reference {result.metric} averages {result.baseline:.3g}, so a threshold in % of it "
                             f"means nothing: pass top_k instead, or score with metric='logit'.")
        signed = {"neg": lambda v: -v, "pos": lambda v: v, "abs": abs}[by]
        ranked = [(n, v) for n, v in ranked if signed(result.percent(n)) >= threshold]
    if top_k is not None:
        ranked = ranked[:top_k]
    heads = [n for n, _ in ranked]
    return heads, len(heads) / result.heads.numel()


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
        """Heatmap of the effect (the head axis is flattened with position when both are present)."""
        import plotly.express as px

        effect = self.effect.float().cpu()
        if effect.ndim == 3:  # layer pos head -> rows "L.H", columns pos
            effect = effect.permute(0, 2, 1).reshape(-1, effect.shape[1])
        if effect.ndim == 1:
            effect = effect[:, None]
        vmax = float(effect.abs().max()) or 1.0
        return px.imshow(effect.numpy(), color_continuous_scale="RdBu", zmin=-vmax, zmax=vmax, aspect="auto",
                         title=title or f"activation patching of {self.component} ({', '.join(self.axes)}): change of {self.metric}")


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
        """Zhang et al. Figure 3: accuracy vs number of knocked-out heads, effect-rank vs random-rank, 95% intervals."""
        import plotly.graph_objects as go

        def bars(values, cis):
            if len(cis) != len(values):  # a curve without intervals
                return None
            return dict(type="data", symmetric=False, array=[(h - v) if h is not None else 0 for v, (l, h) in zip(values, cis)],
                        arrayminus=[(v - l) if l is not None else 0 for v, (l, h) in zip(values, cis)])

        fig = go.Figure()
        ks = [0, *self.ks]
        base_ci = [self.base_ci] if self.base_ci else []
        effect_ci, random_ci = base_ci + list(self.effect_ci), base_ci + list(self.random_ci)
        fig.add_trace(go.Scatter(x=ks, y=[self.base_accuracy, *self.effect_rank], mode="lines+markers",
                                 name="effect-rank (95% Wilson over prompts)",
                                 error_y=bars([self.base_accuracy, *self.effect_rank], effect_ci)))
        fig.add_trace(go.Scatter(x=ks, y=[self.base_accuracy, *self.random_rank], mode="lines+markers",
                                 name=f"random-rank, {self.n_seeds} seeds (95% bootstrap over prompts and seeds)",
                                 error_y=bars([self.base_accuracy, *self.random_rank], random_ci)
                                 or dict(type="data", array=[0.0, *self.random_std])))
        n = f", {self.n_prompts} prompts, means over {self.n_pool} pool prompts" if self.n_prompts else ""
        fig.update_layout(title=title or f"Mean-ablation knockout of the top-k heads{n}", xaxis_title="k (heads knocked out)",
                          yaxis_title="accuracy", yaxis_range=[0, 1.05])
        return fig

    def transfer_figure(self, title: Optional[str] = None):
        """Zhang et al. Figure 4: accuracy per data format before and after knocking out the key heads (95% Wilson)."""
        import plotly.graph_objects as go

        names = [n for n in self.transfer if "base" in self.transfer[n]]

        def trace(label, key):
            values = [self.transfer[n][key] for n in names]
            est = [self.transfer[n].get(f"{key}_estimate") for n in names]
            error = None if None in est else dict(type="data", symmetric=False,
                                                  array=[e["high"] - v for e, v in zip(est, values)],
                                                  arrayminus=[v - e["low"] for e, v in zip(est, values)])
            return go.Bar(name=label, x=names, y=values, error_y=error)

        fig = go.Figure([trace("full model", "base"), trace("key heads knocked out", "knockout")])
        fig.update_layout(barmode="group", title=title or "Transfer of the key heads", yaxis_title="accuracy", yaxis_range=[0, 1.05])
        return fig
