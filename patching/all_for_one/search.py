"""The All-for-One (AF1) subgraph: wait, transfer to the last token, compute alone.

Mamidanna, Rai, Yao & Zhou (2025, arXiv 2509.09650) find that LLMs doing mental
arithmetic need very little cross-token computation: the tokens can *wait* for
the first ``L_wait`` layers without reading each other, a few ``L_transfer``
layers then move information to the last token, and the last token computes
the answer alone. The AF1 model makes this claim testable:

1. **wait**: CAMA (:mod:`patching.all_for_one.cama`) at layer ``L_wait`` replaces every
   non-BOS position's residual by its context-aware mean, erasing what the
   first ``L_wait`` layers moved between tokens;
2. **transfer**: in layers ``L_wait .. L_wait + L_transfer - 1`` the last token
   may attend to every token (ABP full peek, :mod:`patching.all_for_one.abp`);
3. **compute alone**: in the remaining layers it attends to BOS and itself only
   (self peek).

In all layers from ``L_wait`` on, the other tokens attend only to BOS and
themselves (no peek; ``AF1Config.others="full"`` lifts this). *Faithfulness*
is the AF1 model's top-1 accuracy on the first answer token over prompts the
full model answers correctly.

**Held-out means.** CAMA means must not contain the prompt they ablate, and a
(position, token) pair with too few fit prompts falls back to the position mean,
erasing the token itself. :meth:`AF1Runner.cross_fitted` splits all operand
pairs of each template (two-digit sums included) into folds stratified by the
second operand and evaluates each fold with means fitted on the others;
:meth:`AF1Runner.cama_counts` reports the fallback fraction.

**Layer convention.** ``L_wait`` counts the blocks run before CAMA (it replaces
``blocks.{L_wait}.hook_resid_pre``). The authors' demo patches
``blocks.{W}.hook_resid_post``: their ``(W, T)`` is our ``(W + 1, T)``, so the
paper's Llama-3-8B cell (14, 2) is our (15, 2).

:class:`AF1Runner` (in :mod:`patching.all_for_one.runner`) makes the (``L_wait``, ``L_transfer``) grid cheap: CAMA
means for every layer and the evaluation prompts' residuals are computed once;
an AF1 forward starts at block ``L_wait`` (``start_at_layer``) from the CAMA'd
residual and scores the END position only. For one ``L_wait`` the runs with
0, 1, 2, ... transfer layers share their full-peek prefix, so each block is run
once per prefix. :func:`search_af1` then picks the largest ``L_wait`` that
keeps ``>= min_faithfulness`` with the fewest transfer layers, and
:func:`prune_transfer_heads` greedily closes transfer heads (self peek) while
the faithfulness stays ``>= prune_keep`` times that setting's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from datasets import Dataset
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.nodes import Head
from patching.sweeps.options import SweepOptions
from circuits.stats import proportion
from patching.all_for_one.runner import AF1Config, AF1Runner, NoEvalPromptsError, check_setting

# ---------------------------------------------------------------------------- search


def af1_accuracy(model: HookedTransformer, data: Dataset, l_wait: int, l_transfer: int, *,
                 fit_data: Dataset | None = None, transfer_heads: Iterable[Head] | None = None,
                 config: AF1Config = AF1Config(), options: SweepOptions | None = None) -> float:
    """Faithfulness of the AF1 model (``l_wait``, ``l_transfer``): its accuracy on prompts the full model gets right.

    Without ``fit_data``, ``data`` is split (``config.fit_fraction``) into a CAMA fit set
    and a disjoint eval set. ``options``: the runner's (:class:`AF1Runner`).
    """
    check_setting(model, l_wait, l_transfer)
    runner = AF1Runner.from_dataset(model, data, config, fit_data=fit_data, layers=[l_wait], options=options)
    return runner.faithfulness(l_wait, l_transfer, transfer_heads)


@dataclass
class AF1SearchResult:
    """Grid faithfulness (``grid[l_wait][l_transfer]``, NaN where ``l_wait + l_transfer > n_layers``),
    the chosen setting and the pruned transfer heads."""

    grid: list[list[float]]
    l_wait: int
    l_transfer: int
    faithfulness: float
    meets_threshold: bool
    kept_heads: list[Head]
    pruned_faithfulness: float
    n_transfer_heads: int
    prune_trace: list[dict]
    base_accuracy: float
    n_eval: int
    n_unmatched: int
    constant_baseline: float

    def to_json(self) -> dict:
        """A JSON-ready dict (heads as "L<layer>H<head>", NaN as None)."""
        return {
            "grid": [[None if math.isnan(v) else v for v in row] for row in self.grid],
            "l_wait": self.l_wait, "l_transfer": self.l_transfer, "faithfulness": self.faithfulness,
            "meets_threshold": self.meets_threshold, "kept_heads": [str(h) for h in self.kept_heads],
            "n_kept_heads": len(self.kept_heads), "n_transfer_heads": self.n_transfer_heads,
            "pruned_faithfulness": self.pruned_faithfulness, "prune_trace": self.prune_trace,
            "base_accuracy": self.base_accuracy, "n_eval": self.n_eval, "n_unmatched": self.n_unmatched,
            "constant_baseline": self.constant_baseline,
        }


def grid_hits(runner: AF1Runner, l_waits: Iterable[int] | None = None) -> dict[tuple[int, int], Tensor]:
    """Per grid cell ``(l_wait, l_transfer)``: which eval prompts (group order) the AF1 model gets right.

    A progress bar unless the runner's options say ``progress=False``.
    """
    hits: dict[tuple[int, int], Tensor] = {}
    progress = runner.options.shows_progress(True)
    for w in tqdm(runner.layers if l_waits is None else sorted(l_waits), desc="AF1 grid (l_wait)", disable=not progress):
        for t, h in enumerate(runner.sweep_transfer_hits(w)):
            hits[(w, t)] = h
    return hits


def grid_from_hits(hits: dict[tuple[int, int], Tensor], n_layers: int, prompts: Tensor | None = None) -> list[list[float]]:
    """``grid[w][t]``: the mean of ``hits[(w, t)]`` (over ``prompts`` if given), NaN for cells not in ``hits``."""
    def mean(h: Tensor) -> float:
        return float((h if prompts is None else h[prompts]).float().mean())

    return [[mean(hits[(w, t)]) if (w, t) in hits else float("nan") for t in range(n_layers + 1)]
            for w in range(n_layers + 1)]


def grid_faithfulness(runner: AF1Runner, l_waits: Iterable[int] | None = None) -> list[list[float]]:
    """The (l_wait, l_transfer) grid: ``grid[w][t]``, NaN outside ``w + t <= n_layers`` or for skipped ``w``."""
    return grid_from_hits(grid_hits(runner, l_waits), runner.model.cfg.n_layers)


def select_setting(grid: Sequence[Sequence[float]], min_faithfulness: float = 0.9) -> tuple[int, int, bool]:
    """Largest ``l_wait`` with some ``l_transfer`` reaching ``min_faithfulness``, with the fewest such transfer layers.

    If no cell reaches the threshold, the most faithful cell (then larger ``l_wait``, fewer
    transfer layers) is returned with ``False``.
    """
    cells = [(w, t, v) for w, row in enumerate(grid) for t, v in enumerate(row) if not math.isnan(v)]
    if not cells:
        raise InputError("The grid has no evaluated cells.")
    good = [(w, t) for w, t, v in cells if v >= min_faithfulness]
    if good:
        w = max(w for w, _ in good)
        return w, min(t for ww, t in good if ww == w), True
    return (*most_faithful_setting(grid), False)


def most_faithful_setting(grid: Sequence[Sequence[float]]) -> tuple[int, int]:
    """The most faithful cell (ties: larger ``l_wait``, then fewer transfer layers)."""
    cells = [(w, t, v) for w, row in enumerate(grid) for t, v in enumerate(row) if not math.isnan(v)]
    if not cells:
        raise InputError("The grid has no evaluated cells.")
    w, t, _ = max(cells, key=lambda c: (c[2], c[0], -c[1]))
    return w, t


# How the held-out selection picks its cell: the paper's rule (the longest wait that keeps the
# threshold, fewest transfer layers) and the most faithful cell, which tests "faithful at some cell".
SELECTION_RULES = {
    "longest_wait": lambda grid, threshold: select_setting(grid, threshold)[:2],
    "most_faithful": lambda grid, threshold: most_faithful_setting(grid),
}


def _choose_cells(hits: dict[tuple[int, int], Tensor], n_layers: int, select_idx: Tensor, report_idx: Tensor,
                  min_faithfulness: float) -> dict[str, dict]:
    """Every rule of :data:`SELECTION_RULES` run on ``select_idx``'s grid, its cell scored on ``report_idx``."""
    selection_grid = grid_from_hits(hits, n_layers, select_idx)
    rules = {}
    for name, rule in SELECTION_RULES.items():
        w, t = rule(selection_grid, min_faithfulness)
        rules[name] = {"l_wait": w, "l_transfer": t, "selection_faithfulness": selection_grid[w][t],
                       "held_out_faithfulness": proportion(hits[(w, t)][report_idx].double()).to_dict()}
    return rules


def cross_fit_from_hits(hits: dict[tuple[int, int], Tensor], n_layers: int, half_a: Tensor, half_b: Tensor,
                        min_faithfulness: float = 0.9) -> dict[str, dict]:
    """Swap-halves cross-fitting: choose on A and score on B, choose on B and score on A, pool the two.

    Every eval prompt is scored once, under a cell chosen on the other half (never on itself), so the
    pooled faithfulness uses all prompts without the winner's curse. Per rule of
    :data:`SELECTION_RULES`: both ``folds`` (chosen cell, its selection-half and held-out faithfulness),
    ``pooled_faithfulness`` (95% Wilson over the pooled hits of all prompts), ``cells_agree`` (both
    halves chose the same cell) and ``prompt_cells`` (the cell that scored each eval prompt, by index).
    """
    halves = {"a": half_a, "b": half_b}
    out = {}
    for name in SELECTION_RULES:
        out[name] = {"folds": [], "prompt_cells": [None] * (len(half_a) + len(half_b))}
    pooled: dict[str, list[Tensor]] = {name: [] for name in SELECTION_RULES}
    for select, report in (("a", "b"), ("b", "a")):
        chosen = _choose_cells(hits, n_layers, halves[select], halves[report], min_faithfulness)
        for name, rule in chosen.items():
            cell = (rule["l_wait"], rule["l_transfer"])
            out[name]["folds"].append({"select_on": select, "report_on": report, **rule})
            pooled[name].append(hits[cell][halves[report]])
            for i in halves[report].tolist():
                out[name]["prompt_cells"][i] = list(cell)
    for name, rule in out.items():
        first, second = rule["folds"]
        rule["pooled_faithfulness"] = proportion(torch.cat(pooled[name]).double()).to_dict()
        rule["cells_agree"] = (first["l_wait"], first["l_transfer"]) == (second["l_wait"], second["l_transfer"])
    return out


def held_out_selection(runner: AF1Runner, l_waits: Iterable[int] | None = None, min_faithfulness: float = 0.9,
                       seed: int = 0, hits: dict[tuple[int, int], Tensor] | None = None) -> dict:
    """Choose (l_wait, l_transfer) on one half of the eval prompts and report its faithfulness on the other half.

    Picking the best of ~100 cells on the same prompts that report it overstates the faithfulness
    (winner's curse). The eval prompts are split at random (``seed``) into a selection half and a
    report half; :func:`select_setting` runs on the selection half's grid, and the chosen cell's
    faithfulness is reported on the report half with its Wilson interval (top-level keys).
    ``rules`` repeats this for every rule of :data:`SELECTION_RULES`. ``cross_fit`` also swaps the
    halves and pools both held-out scores into one estimate over all eval prompts
    (:func:`cross_fit_from_hits`); ``cross_fit_faithfulness`` is its paper-rule (``longest_wait``)
    value. ``hits``: a precomputed :func:`grid_hits` (else it is computed).
    """
    n = runner.model.cfg.n_layers
    order = torch.randperm(runner.n_eval, generator=torch.Generator().manual_seed(seed))
    select_idx, report_idx = order[: runner.n_eval // 2].sort().values, order[runner.n_eval // 2:].sort().values
    if len(select_idx) == 0 or len(report_idx) == 0:
        raise NoEvalPromptsError(f"A held-out AF1 selection needs at least 2 evaluation prompts, got {runner.n_eval}.")
    hits = grid_hits(runner, l_waits) if hits is None else hits
    rules = _choose_cells(hits, n, select_idx, report_idx, min_faithfulness)
    w, t, ok = select_setting(grid_from_hits(hits, n, select_idx), min_faithfulness)
    cross_fit = cross_fit_from_hits(hits, n, select_idx, report_idx, min_faithfulness)
    return {"l_wait": w, "l_transfer": t, "meets_threshold_on_selection_half": ok,
            "selection_faithfulness": rules["longest_wait"]["selection_faithfulness"],
            "held_out_faithfulness": rules["longest_wait"]["held_out_faithfulness"], "rules": rules,
            "selection_prompts": select_idx.tolist(), "report_prompts": report_idx.tolist(),
            "interval": "95% Wilson over the report half",
            "cross_fit": cross_fit, "cross_fit_faithfulness": cross_fit["longest_wait"]["pooled_faithfulness"],
            "cross_fit_interval": "95% Wilson over the pooled held-out hits of both halves (every eval prompt once)"}


def cell_estimate(hits: dict[tuple[int, int], Tensor], l_wait: int, l_transfer: int) -> dict:
    """Faithfulness of one pre-specified cell over all eval prompts (no selection), with its Wilson interval."""
    if (l_wait, l_transfer) not in hits:
        raise InputError(f"The grid has no cell ({l_wait}, {l_transfer}): compute its l_wait with grid_hits first.")
    return {"l_wait": l_wait, "l_transfer": l_transfer,
            "faithfulness": proportion(hits[(l_wait, l_transfer)].double()).to_dict()}


def prune_transfer_heads(runner: AF1Runner, l_wait: int, l_transfer: int,
                         keep: float = 0.95) -> tuple[list[Head], float, list[dict]]:
    """Greedily close transfer heads (self peek) while faithfulness stays ``>= keep`` x the full setting's.

    One pass ranks each head by the faithfulness with it alone closed (least harmful
    first); a second pass closes heads in that order, keeping a closure only if the
    target still holds. Returns the kept heads, their faithfulness, and the trace (bars as the runner's options say).
    """
    progress = runner.options.shows_progress(True)
    heads = [Head(l, h) for l in range(l_wait, l_wait + l_transfer) for h in range(runner.model.cfg.n_heads)]
    target = keep * runner.faithfulness(l_wait, l_transfer)
    solo = {}
    for head in tqdm(heads, desc="AF1 pruning: rank heads", disable=not progress):
        solo[head] = runner.faithfulness(l_wait, l_transfer, [h for h in heads if h != head])
    kept, current, trace = list(heads), runner.faithfulness(l_wait, l_transfer), []
    for head in tqdm(sorted(heads, key=lambda h: -solo[h]), desc="AF1 pruning: close heads", disable=not progress):
        trial = [h for h in kept if h != head]
        value = runner.faithfulness(l_wait, l_transfer, trial)
        accepted = value >= target
        trace.append({"head": str(head), "faithfulness_alone_closed": solo[head],
                      "faithfulness_after": value, "closed": accepted})
        if accepted:
            kept, current = trial, value
    return kept, current, trace


def search_af1(model: HookedTransformer, data: Dataset, config: AF1Config = AF1Config(), *,
               fit_data: Dataset | None = None, l_waits: Iterable[int] | None = None,
               runner: AF1Runner | None = None, options: SweepOptions | None = None,
               hits: dict[tuple[int, int], Tensor] | None = None) -> AF1SearchResult:
    """Grid over (l_wait, l_transfer), select the setting, prune its transfer heads (``hits``: a precomputed grid).

    ``options`` (:class:`patching.SweepOptions`): the runner built from ``data``'s; a given ``runner`` has its own.
    """
    if runner is None:
        runner = AF1Runner.from_dataset(model, data, config, fit_data=fit_data, layers=l_waits, options=options)
    elif options is not None:
        raise InputError("search_af1 got both a runner and options: a runner sweeps with its own options "
                         "(AF1Runner(..., options=...)); pass one of them.")
    grid = grid_faithfulness(runner, l_waits) if hits is None else grid_from_hits(hits, model.cfg.n_layers)
    w, t, ok = select_setting(grid, config.min_faithfulness)
    kept, pruned, trace = prune_transfer_heads(runner, w, t, config.prune_keep)
    return AF1SearchResult(grid, w, t, grid[w][t], ok, kept, pruned, t * model.cfg.n_heads, trace,
                           runner.base_accuracy, runner.n_eval, runner.n_unmatched, runner.constant_baseline)


def faithfulness_heatmap(grid: Sequence[Sequence[float]], title: str = "AF1 faithfulness",
                         best: tuple[int, int] | None = None, n_prompts: int | None = None):
    """A plotly heatmap of ``grid[l_wait][l_transfer]`` (rows: l_wait, columns: l_transfer).

    Rows no cell of which was evaluated (a coarse grid's skipped ``l_wait``) are left out rather than
    drawn as blank stripes. With ``n_prompts`` (the evaluation prompts behind every cell), each cell's
    hover gives its 95% Wilson interval.
    """
    import plotly.graph_objects as go
    import torch

    from circuits.stats import proportion

    rows = [w for w, row in enumerate(grid) if any(not math.isnan(v) for v in row)]
    z = [[None if math.isnan(v) else v for v in grid[w]] for w in rows]

    def interval(v):
        if v is None or not n_prompts:
            return ""
        hits = round(v * n_prompts)
        e = proportion(torch.tensor([1.0] * hits + [0.0] * (n_prompts - hits), dtype=torch.float64))
        return f"<br>95% Wilson [{e.low:.2f}, {e.high:.2f}], n = {n_prompts}"

    custom = [[interval(v) for v in row] for row in z]
    fig = go.Figure(go.Heatmap(z=z, x=list(range(len(grid[0]))), y=[str(w) for w in rows], zmin=0, zmax=1,
                               customdata=custom, colorscale="Viridis", colorbar={"title": "faithfulness"},
                               texttemplate="%{z:.2f}", textfont={"size": 9},
                               hovertemplate="L_wait=%{y}<br>L_transfer=%{x}<br>faithfulness=%{z:.3f}%{customdata}"
                                             "<extra></extra>"))
    if best is not None:
        fig.add_trace(go.Scatter(x=[best[1]], y=[str(best[0])], mode="markers", name="selected",
                                 marker={"symbol": "x", "size": 14, "color": "red"}))
    fig.update_yaxes(type="category")
    fig.update_layout(title=title, xaxis_title="L_transfer (full-peek layers)", yaxis_title="L_wait (CAMA layer)")
    return fig
