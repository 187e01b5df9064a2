"""Faithfulness curves: how much of the model's behaviour the top-scored edges keep, at each circuit size.

Given edge scores (from attribution, or exact :func:`patching.edges.edge_patch` effects), the
circuit at fraction ``x`` keeps the ``int(x · n_edges)`` edges of largest ``|score|``
(ties by index order) and ablates all others (:func:`patching.edges.evaluate_circuit`). Its
faithfulness, as in the Mechanistic Interpretability Benchmark (MIB, Mueller et al.
2025, ``evaluate_area_under_curve`` in hannamw/MIB-circuit-track), is

    f(C) = (m(C) − m(∅)) / (m(full) − m(∅)),

with ``m`` the mean metric over prompts, ``∅`` the empty circuit (every edge ablated)
and ``full`` the model itself. Over MIB's ten fractions 0.1%, 0.2%, 0.5%, 1%, 2%, 5%,
10%, 20%, 50%, 100%, two areas summarise the curve (trapezoids, linear in the fraction,
from the first fraction to the last):

* **CPR** (circuit performance ratio) = area under ``f``: higher is better;
* **CMD** (circuit-model difference) = area under ``|1 − f|``: lower is better.

Intervals: the prompts are resampled with replacement (the same resamples for every
point), and each resample recomputes every point's ratio of means, CPR and CMD; the
95% interval is the percentile interval of those (:func:`circuits.stats.bootstrap`).

The ratio needs ``m(full) ≠ m(∅)``. When the counterfactual is the reference itself (every pair of
prompts identical, with counterfactual ablation) the empty circuit *is* the model and every point
would be 0/0; :func:`faithfulness_curve` refuses such prompts before it runs anything, and refuses
after the runs any other set of prompts whose ``m(full) − m(∅)`` is zero (an :class:`InputError`
that says what to change), instead of returning NaN points and a NaN CPR.

This module selects by plain top-n (:func:`circuits.graph_selection.select_top_n` without
pruning; every real edge needs a score). A ``select`` callable ``(scores, n) -> mask`` can
replace it (greedy growth, pruning of edges off every input-to-logits path:
:func:`circuits.graph_selection.mib_selector`).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor
from transformer_lens import HookedTransformer

from circuits.arguments import check_positive_int
from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_io import check_graph_fits
from circuits.graph_selection import select_top_n
from circuits.stats import Estimate, bootstrap
from patching.edges.evaluate import evaluate_circuits
from patching.sweeps import inputs
from patching.edges.positions import PositionalScores
from patching.sweeps.options import SweepOptions, sweep_options

MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
Selector = Callable[[Float[Tensor, "n_forward n_backward"], int], Bool[Tensor, "n_forward n_backward"]]


def curve_areas(fractions: Sequence[float], faithfulness: Sequence[float]) -> tuple[float, float]:
    """(CPR, CMD): trapezoid areas of ``f`` and of ``|1 − f|`` over ``fractions`` (linear x), as MIB computes them."""
    x, f = np.asarray(fractions, dtype=np.float64), np.asarray(faithfulness, dtype=np.float64)
    if x.shape != f.shape or x.ndim != 1 or len(x) < 2:
        raise InputError(f"Need one faithfulness per fraction and at least two points, got {len(x)} fractions, {len(f)} values.")
    width = np.diff(x)
    cpr = float(np.sum(width * (f[:-1] + f[1:]) / 2))
    gap = np.abs(1 - f)
    cmd = float(np.sum(width * (gap[:-1] + gap[1:]) / 2))
    return cpr, cmd


def table_faithfulness(table) -> np.ndarray:
    """Faithfulness at each point of a per-prompt table (``FaithfulnessCurve.table``: rows are prompts, columns each
    point's circuit, then the full and the empty run): (mean circuit − mean empty) / (mean full − mean empty), a ratio
    of means over the rows given, as MIB averages. Bootstraps pass a resample of the rows."""
    means = np.asarray(table, dtype=np.float64).mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (means[:-2] - means[-1]) / (means[-2] - means[-1])


@dataclass
class FaithfulnessCurve:
    """A faithfulness curve with its areas; every number carries a bootstrap interval over prompts."""

    fractions: list[float]
    n_edges: list[int]
    faithfulness: list[Estimate]
    cpr: Estimate
    cmd: Estimate
    full: Estimate
    empty: Estimate
    circuit_metric: Float[Tensor, "point prompt"] = field(repr=False)
    metric: str = "logit"
    ablation: str = "counterfactual"
    n_total_edges: int = 0
    norm: str = "frozen"
    spans: Optional[tuple] = None  # the span schema of a position-aware curve
    #: per prompt: the metric of each point's circuit, then of the full and the empty circuit (for paired comparisons)
    table: Optional[np.ndarray] = field(default=None, repr=False)

    @property
    def n_prompts(self) -> int:
        return int(self.circuit_metric.shape[1])

    def smallest_fraction(self, threshold: float = 0.8) -> Optional[float]:
        """The first fraction whose faithfulness reaches ``threshold`` (None if none does)."""
        return next((x for x, f in zip(self.fractions, self.faithfulness) if f.value >= threshold), None)

    def to_dict(self) -> dict:
        return {
            "fractions": self.fractions, "n_edges": self.n_edges, "n_total_edges": self.n_total_edges,
            "faithfulness": [f.to_dict() for f in self.faithfulness], "cpr": self.cpr.to_dict(), "cmd": self.cmd.to_dict(),
            "full_metric": self.full.to_dict(), "empty_metric": self.empty.to_dict(), "metric": self.metric,
            "ablation": self.ablation, "n_prompts": self.n_prompts, "norm": self.norm,
        } | ({} if self.spans is None else {"spans": list(self.spans)})


def _scores_of(layout: GraphLayout, scores, model: Optional[HookedTransformer] = None) -> Tensor:
    if isinstance(scores, Graph):
        if model is not None:  # a graph of another size (a file of another model): refused, naming what differs
            check_graph_fits(scores, model, "The scores' graph")
        scores = scores.scores
    elif hasattr(scores, "scores") and not isinstance(scores, Tensor):  # EdgeEffects and the like
        scores = scores.scores
    if not isinstance(scores, Tensor) or tuple(scores.shape) != (layout.n_forward, layout.n_backward):
        raise InputError(f"Scores must be a Graph, EdgeEffects or a tensor {(layout.n_forward, layout.n_backward)} "
                         f"(n_forward, n_backward) for this model.")
    real = scores[layout.real_edge_mask.to(scores.device)]
    if not torch.isfinite(real).any():  # NaN ranks last and every inf ties: any top-n would be arbitrary
        raise InputError(f"None of the {layout.n_edges} edge scores is finite (they are NaN or infinite), so no "
                         "ranking exists and every circuit size would be an arbitrary choice: rescore the edges.")
    if torch.isinf(real).any():
        warnings.warn(f"{int(torch.isinf(real).sum())} of the {layout.n_edges} edge scores are infinite; they rank "
                      "before every finite score, in index order among themselves.", stacklevel=4)
    return scores


@torch.no_grad()
def faithfulness_curve(
    model: HookedTransformer,
    scores: Union[Graph, Tensor, object],
    reference,
    counterfactual: Optional[Tensor] = None,
    *,
    fractions: Sequence[float] = MIB_FRACTIONS,
    ablation: str = "counterfactual",
    means_from=None,
    norm: str = "frozen",
    absolute: bool = True,
    select: Optional[Selector] = None,
    n_bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    answer_ids=None,
    alt_ids=None,
    evaluate: Optional[Callable] = None,
    options: Optional[SweepOptions] = None,
) -> FaithfulnessCurve:
    """Faithfulness of the top-scored edges at each fraction, CPR and CMD, with bootstrap intervals.

    Args:
        model: a HookedTransformer the edge graph can represent.
        scores: a :class:`circuits.graph.Graph` (its ``scores``), :class:`patching.edges.patch.EdgeEffects`, a
            ``[n_forward, n_backward]`` tensor, or :class:`patching.edges.positions.PositionalScores` (a
            position-aware curve: the sizes are fractions of every (edge, span); no pruning).
        reference, counterfactual, answer_ids, alt_ids: prompts, as in :func:`patching.path_patch`.
        fractions: increasing edge fractions in (0, 1] (default MIB's ten).
        ablation, means_from, norm: how edges outside the circuit are ablated, and the norm convention on models
            with norms after attention (:func:`patching.edges.evaluate_circuits`).
        absolute: rank edges by ``|score|`` (MIB's default) rather than by signed score.
        select: ``(scores, n) -> bool mask`` replacing the top-n choice (e.g. greedy selection with pruning).
        n_bootstrap, confidence, seed: the bootstrap over prompts.
        evaluate: runs the circuits (default :func:`patching.edges.evaluate_circuits`, or one with its signature);
            :mod:`patching.edges.distributed` passes one that splits them over processes.
        options: :class:`patching.SweepOptions` (metric, batch_size, memory_mb, reuse_prefix,
            progress: a bar by default); None for its defaults.
    """
    opts = sweep_options(options, "faithfulness_curve")
    opts = dataclasses.replace(opts, progress=opts.shows_progress())
    check_positive_int(n_bootstrap, "n_bootstrap")
    layout = GraphLayout.of(model)
    fractions = _checked_fractions(fractions)
    if not isinstance(scores, PositionalScores):
        scores = _scores_of(layout, scores, model)  # here, not deeper: its warning names the caller's line
    masks, full, n_total, spans = _circuit_masks(layout, scores, fractions, select, absolute)
    if ablation == "counterfactual":
        _refuse_identical_counterfactual(model, reference, counterfactual, answer_ids, alt_ids)
    evaluate = evaluate or evaluate_circuits
    position_aware = {} if spans is None else {"spans": spans}
    evaluations = evaluate(model, masks + [full, torch.zeros_like(full)], reference, counterfactual,
                           ablation=ablation, means_from=means_from, norm=norm, answer_ids=answer_ids,
                           alt_ids=alt_ids, options=opts, **position_aware)
    table = torch.stack([e.per_prompt for e in evaluations], dim=1).numpy()  # [prompt, point + full + empty]
    n_points = len(masks)
    _refuse_zero_denominator(table[:, n_points].mean(), table[:, n_points + 1].mean(), ablation)
    estimate = functools.partial(_estimate, table, confidence=confidence, n_bootstrap=n_bootstrap, seed=seed)
    points = [estimate(lambda rows, i=i: float(table_faithfulness(rows)[i])) for i in range(n_points)]
    cpr, cmd = _areas(estimate, fractions, table)
    return FaithfulnessCurve(
        fractions=fractions, n_edges=[int(m.sum()) for m in masks], faithfulness=points, cpr=cpr, cmd=cmd,
        full=estimate(lambda rows: float(rows[:, n_points].mean())),
        empty=estimate(lambda rows: float(rows[:, n_points + 1].mean())),
        circuit_metric=torch.from_numpy(table[:, :n_points].T.copy()), metric=evaluations[0].metric, ablation=ablation,
        n_total_edges=n_total, norm=norm, spans=spans, table=table,
    )


def _checked_fractions(fractions: Sequence[float]) -> list[float]:
    fractions = [float(x) for x in fractions]
    if not fractions or any(not 0 < x <= 1 for x in fractions) or any(b <= a for a, b in zip(fractions, fractions[1:])):
        raise InputError(f"fractions must increase strictly within (0, 1], got {fractions}.")
    return fractions


def _circuit_masks(layout: GraphLayout, scores, fractions: list[float], select: Optional[Selector],
                   absolute: bool) -> tuple[list[Tensor], Tensor, int, Optional[tuple]]:
    """The circuit of each fraction (top-n by score, or ``select``'s), the full circuit, the number of edges the
    fractions count, and the span schema (None for position-free scores, already checked by :func:`_scores_of`)."""
    if isinstance(scores, PositionalScores):  # position-aware: sizes are fractions of every (edge, span)
        if select is not None:
            raise InputError("select= chooses position-free circuits; position-aware curves take the top-n edges.")
        n_total = scores.n_edges
        masks = [scores.top(int(x * n_total), absolute=absolute) for x in fractions]
        return masks, scores.real.clone(), n_total, scores.spans
    n_total = layout.n_edges
    choose = select or (lambda s, n: select_top_n(Graph(layout, s), n, absolute=absolute, prune=False).in_graph)
    masks = [choose(scores, int(x * n_total)) for x in fractions]
    return masks, layout.real_edge_mask.clone(), n_total, None


def _estimate(table: np.ndarray, statistic, *, confidence: float, n_bootstrap: int, seed: int) -> Estimate:
    """``statistic`` of the per-prompt ``table`` with its bootstrap interval over prompts."""
    return bootstrap(table, statistic, confidence=confidence, n_resamples=n_bootstrap, seed=seed)


def _areas(estimate, fractions: list[float], table: np.ndarray) -> tuple[Estimate, Estimate]:
    """CPR and CMD (the areas under and off the curve), each with its interval; undefined for a one-point curve."""
    if len(fractions) < 2:
        return (Estimate(float("nan"), float("nan"), float("nan"), table.shape[0], "none"),) * 2
    return (estimate(lambda rows: curve_areas(fractions, table_faithfulness(rows))[0]),
            estimate(lambda rows: curve_areas(fractions, table_faithfulness(rows))[1]))


def _refuse_identical_counterfactual(model, reference, counterfactual, answer_ids, alt_ids) -> None:
    """Before any run: with counterfactual ablation, identical prompt pairs make m(full) = m(∅), so f = 0/0."""
    groups = inputs.prompt_groups(model, reference, counterfactual, answer_ids=answer_ids, alt_ids=alt_ids)
    if groups and all(torch.equal(g.tokens, g.cf_tokens) for g in groups):
        raise InputError(
            "Every counterfactual prompt is identical to its reference prompt, so ablating edges to the "
            "counterfactual changes nothing: m(full) − m(∅) is 0 and every faithfulness point and the CPR/CMD would "
            "be 0/0 (NaN). Pass counterfactuals that differ from the references (e.g. circuits.tasks.make_dataset's "
            "cf_tokens), or use ablation='mean'.")


def _refuse_zero_denominator(full: float, empty: float, ablation: str) -> None:
    """After the runs: the mean metric of the model and of the empty circuit must differ."""
    gap = float(full) - float(empty)
    if not np.isfinite(gap) or abs(gap) <= 1e-12 * max(1.0, abs(float(full))):
        raise InputError(
            f"The model and the empty circuit score the same mean metric ({float(full):.6g} and {float(empty):.6g} "
            f"with ablation={ablation!r}): m(full) − m(∅) is 0, so faithfulness (m(C) − m(∅)) / (m(full) − m(∅)) is "
            "undefined at every size. Use prompts whose counterfactuals change the answer, another metric, or "
            "another ablation.")


def paired_curve_difference(a: FaithfulnessCurve, b: FaithfulnessCurve, *, n_bootstrap: int = 1000, seed: int = 0,
                            confidence: float = 0.95) -> dict:
    """``a − b`` of two curves measured on the same prompts (in the same order): CPR, CMD and f at each fraction,
    each with a paired bootstrap interval (the same prompts drawn for both curves in every resample)."""
    if a.table is None or b.table is None or a.fractions != b.fractions:
        raise InputError("A paired difference needs two curves at the same fractions on the same prompts.")
    return paired_table_difference(a.fractions, a.table, b.table, n_bootstrap=n_bootstrap, seed=seed,
                                   confidence=confidence)


def paired_table_difference(fractions: Sequence[float], a_table, b_table, *, n_bootstrap: int = 1000, seed: int = 0,
                            confidence: float = 0.95) -> dict:
    """:func:`paired_curve_difference` from two curves' per-prompt tables (``FaithfulnessCurve.table``, or the lists
    that results.json keeps of them): rows are prompts, columns each fraction's circuit, then the full and empty runs."""
    check_positive_int(n_bootstrap, "n_bootstrap")
    a_table, b_table = np.asarray(a_table, dtype=np.float64), np.asarray(b_table, dtype=np.float64)
    n = len(fractions)
    if a_table.ndim != 2 or a_table.shape != b_table.shape or a_table.shape[1] != n + 2:
        raise InputError(f"A paired difference needs two per-prompt tables of the same prompts with {n + 2} columns "
                         f"(the {n} fractions, full, empty); got shapes {a_table.shape} and {b_table.shape}.")
    both = np.concatenate([a_table, b_table], axis=1)
    fractions = list(fractions)

    width = n + 2

    def ratios(rows: np.ndarray, offset: int) -> np.ndarray:
        return table_faithfulness(rows[:, offset:offset + width])

    def estimate(statistic) -> Estimate:
        return bootstrap(both, statistic, confidence=confidence, n_resamples=n_bootstrap, seed=seed)

    out = {f"f@{100 * x:g}%": estimate(lambda r, i=i: float(ratios(r, 0)[i] - ratios(r, width)[i])).to_dict()
           for i, x in enumerate(fractions)}
    out["cpr"] = estimate(lambda r: curve_areas(fractions, ratios(r, 0))[0] - curve_areas(fractions, ratios(r, width))[0]).to_dict()
    out["cmd"] = estimate(lambda r: curve_areas(fractions, ratios(r, 0))[1] - curve_areas(fractions, ratios(r, width))[1]).to_dict()
    return out
