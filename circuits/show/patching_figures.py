"""Figures of the node-level patching results: Zhang et al. (2024) Figures 2-4 and activation-patching heatmaps.

Each function takes plain tensors or dicts (what :mod:`patching.sweeps.results` holds), so the
figures do not depend on the patching package; the result classes call them from their
``figure()`` methods.

* :func:`node_scores_figure`: heads x layers heatmap with an MLP column (Figure 2);
* :func:`activation_scores_figure`: the effect of activation patching over its grid;
* :func:`knockout_figure`: accuracy against the number of knocked-out heads, effect-rank
  against random-rank, with 95% intervals (Figure 3);
* :func:`transfer_figure`: accuracy per data format before and after the knockout (Figure 4).
"""

from __future__ import annotations

from typing import Optional, Sequence

import plotly.express as px
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor


def _bound(t: Tensor) -> float:
    return float(torch.nan_to_num(t.abs(), nan=0.0).max()) or 1.0


def node_scores_figure(heads: Tensor, mlps: Tensor, *, unit: str, title: str,
                       key_heads: Optional[Sequence] = None) -> go.Figure:
    """Heads x layers heatmap with an MLP column.

    Heads and MLPs have their own symmetric colour scales (red: the metric drops when the
    node's path is patched, blue: it rises), so a large MLP effect does not wash out the
    heads; each scale is symmetric around 0 and reaches the largest |effect| of its kind.
    ``key_heads`` (objects with ``layer`` and ``head``) are outlined and labelled by rank.
    """
    heads, mlps = heads.float().cpu(), mlps.float().cpu()
    n_layers, n_heads = heads.shape
    # Each colour bar sits in the gap right of its own panel (heads panel ends at x = 0.84 * 0.8).
    fig = make_subplots(rows=1, cols=2, column_widths=[0.8, 0.2], horizontal_spacing=0.16,
                        subplot_titles=("heads", "MLPs (own scale)"))
    fig.add_trace(go.Heatmap(z=heads.numpy(), x=[str(h) for h in range(n_heads)], y=list(range(n_layers)),
                             colorscale="RdBu", zmid=0, zmin=-_bound(heads), zmax=_bound(heads),
                             colorbar=dict(title=f"heads ({unit})", x=0.68, xanchor="left", thickness=12, len=0.9),
                             hovertemplate="L%{y}H%{x}: %{z:.3g}<extra></extra>"), 1, 1)
    fig.add_trace(go.Heatmap(z=mlps.numpy()[:, None], x=["MLP"], y=list(range(n_layers)),
                             colorscale="RdBu", zmid=0, zmin=-_bound(mlps), zmax=_bound(mlps),
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
    fig.update_layout(title=title, height=max(360, 24 * n_layers + 160))
    return fig


def activation_scores_figure(effect: Tensor, *, title: str) -> go.Figure:
    """Heatmap of an activation-patching effect (the head axis is flattened with position when both are present)."""
    effect = effect.float().cpu()
    if effect.ndim == 3:  # layer pos head -> rows "L.H", columns pos
        effect = effect.permute(0, 2, 1).reshape(-1, effect.shape[1])
    if effect.ndim == 1:
        effect = effect[:, None]
    vmax = float(effect.abs().max()) or 1.0
    return px.imshow(effect.numpy(), color_continuous_scale="RdBu", zmin=-vmax, zmax=vmax, aspect="auto", title=title)


def _error_bars(values: list, cis: list) -> Optional[dict]:
    if len(cis) != len(values):  # a curve without intervals
        return None
    return dict(type="data", symmetric=False, array=[(h - v) if h is not None else 0 for v, (l, h) in zip(values, cis)],
                arrayminus=[(v - l) if l is not None else 0 for v, (l, h) in zip(values, cis)])


def knockout_figure(curve, *, title: Optional[str] = None) -> go.Figure:
    """Accuracy vs number of knocked-out heads, effect-rank vs random-rank, 95% intervals.

    ``curve`` has the fields of :class:`patching.sweeps.results.KnockoutCurve` (``ks``, ``effect_rank``,
    ``random_rank``, their intervals, ``base_accuracy``, ``n_seeds``, ``n_prompts``, ``n_pool``).
    """
    fig = go.Figure()
    ks = [0, *curve.ks]
    base_ci = [curve.base_ci] if curve.base_ci else []
    effect_ci, random_ci = base_ci + list(curve.effect_ci), base_ci + list(curve.random_ci)
    fig.add_trace(go.Scatter(x=ks, y=[curve.base_accuracy, *curve.effect_rank], mode="lines+markers",
                             name="effect-rank (95% Wilson over prompts)",
                             error_y=_error_bars([curve.base_accuracy, *curve.effect_rank], effect_ci)))
    fig.add_trace(go.Scatter(x=ks, y=[curve.base_accuracy, *curve.random_rank], mode="lines+markers",
                             name=f"random-rank, {curve.n_seeds} seeds (95% bootstrap over prompts and seeds)",
                             error_y=_error_bars([curve.base_accuracy, *curve.random_rank], random_ci)
                             or dict(type="data", array=[0.0, *curve.random_std])))
    n = f", {curve.n_prompts} prompts, means over {curve.n_pool} pool prompts" if curve.n_prompts else ""
    fig.update_layout(title=title or f"Mean-ablation knockout of the top-k heads{n}", xaxis_title="k (heads knocked out)",
                      yaxis_title="accuracy", yaxis_range=[0, 1.05])
    return fig


def transfer_figure(transfer: dict, *, title: Optional[str] = None) -> go.Figure:
    """Accuracy per data format before and after knocking out the key heads (95% Wilson bars where recorded).

    ``transfer`` maps a format's name to ``{"base", "knockout"}`` accuracies and, optionally,
    their ``"base_estimate"`` / ``"knockout_estimate"`` dicts with ``low`` and ``high``.
    """
    names = [n for n in transfer if "base" in transfer[n]]

    def trace(label, key):
        values = [transfer[n][key] for n in names]
        est = [transfer[n].get(f"{key}_estimate") for n in names]
        error = None if None in est else dict(type="data", symmetric=False,
                                              array=[e["high"] - v for e, v in zip(est, values)],
                                              arrayminus=[v - e["low"] for e, v in zip(est, values)])
        return go.Bar(name=label, x=names, y=values, error_y=error)

    fig = go.Figure([trace("full model", "base"), trace("key heads knocked out", "knockout")])
    fig.update_layout(barmode="group", title=title or "Transfer of the key heads", yaxis_title="accuracy", yaxis_range=[0, 1.05])
    return fig
