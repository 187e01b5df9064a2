"""The All-for-One (AF1) subgraph: wait, transfer to the last token, compute alone.

Mamidanna, Rai, Yao & Zhou (2025, arXiv 2509.09650) find that LLMs doing mental
arithmetic need very little cross-token computation: the tokens can *wait* for
the first ``L_wait`` layers without reading each other, a few ``L_transfer``
layers then move information to the last token, and the last token computes
the answer alone. The AF1 model makes this claim testable:

1. **wait**: CAMA (:mod:`patching.cama`) at layer ``L_wait`` replaces every
   non-BOS position's residual by its context-aware mean, erasing what the
   first ``L_wait`` layers moved between tokens;
2. **transfer**: in layers ``L_wait .. L_wait + L_transfer - 1`` the last token
   may attend to every token (ABP full peek, :mod:`patching.abp`);
3. **compute alone**: in the remaining layers it attends to BOS and itself only
   (self peek).

In all layers from ``L_wait`` on, the other tokens attend only to BOS and
themselves (no peek; ``AF1Config.others="full"`` lifts this). *Faithfulness*
is the AF1 model's top-1 accuracy on the first answer token over prompts the
full model answers correctly.

:class:`AF1Runner` makes the (``L_wait``, ``L_transfer``) grid cheap: CAMA
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

import logging
import math
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Mapping, Sequence

import torch
from datasets import Dataset
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer, TransformerLensKeyValueCacheEntry

from circuits.checks import positive_int
from circuits.metrics import unembed_end
from circuits.nodes import Head
from circuits.errors import InputError, ToolkitError
from circuits.stats import proportion
from circuits.tasks import accuracy_mask
from patching import _runs
from patching.abp import PeekRule, abp_hooks, layer_peek_masks
from patching.af1_data import split_fit_eval
from patching.cama import CamaConfig, CamaMeans, fit_cama, group_rows, residuals

logger = logging.getLogger(__name__)



class NoEvalPromptsError(ToolkitError, ValueError):
    """No evaluation prompt is left for AF1 (none answered correctly, or no layout matches the fit prompts)."""


@dataclass(frozen=True)
class AF1Config:
    """AF1 settings. ``others``: peek rule of non-last tokens after ``L_wait`` (paper: ``"self"``)."""

    cama: CamaConfig = field(default_factory=CamaConfig)
    others: PeekRule = "self"
    fit_fraction: float = 0.5
    batch_size: int = 32
    tail_batch_size: int = 256  # rows per block call when the grid batches many settings together
    min_faithfulness: float = 0.9
    prune_keep: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        positive_int(self.batch_size, "AF1Config.batch_size")
        positive_int(self.tail_batch_size, "AF1Config.tail_batch_size")
        if not 0 < self.fit_fraction < 1:
            raise InputError(f"fit_fraction must be in (0, 1), got {self.fit_fraction}.")
        if not 0 < self.min_faithfulness <= 1 or not 0 < self.prune_keep <= 1:
            raise InputError("min_faithfulness and prune_keep must be in (0, 1].")


# ---------------------------------------------------------------------------- masks


def check_setting(model: HookedTransformer, l_wait: int, l_transfer: int) -> None:
    """Raise a clear error unless ``0 <= l_wait``, ``0 <= l_transfer`` and ``l_wait + l_transfer <= n_layers``."""
    n = model.cfg.n_layers
    if not isinstance(l_wait, int) or not isinstance(l_transfer, int):
        raise TypeError(f"l_wait and l_transfer must be ints, got {l_wait!r}, {l_transfer!r}.")
    if not 0 <= l_wait <= n:
        raise InputError(f"l_wait={l_wait} is out of range: use 0..{n} (the model has {n} layers).")
    if l_transfer < 0 or l_wait + l_transfer > n:
        raise InputError(f"l_wait + l_transfer = {l_wait} + {l_transfer} must be at most n_layers = {n} (and l_transfer >= 0).")


def af1_masks(
    model: HookedTransformer, n_pos: int, l_wait: int, l_transfer: int, *,
    transfer_heads: Iterable[Head] | None = None, others: PeekRule = "self",
) -> dict[int, Tensor]:
    """ABP masks of the AF1 model for every layer from ``l_wait`` on.

    With ``transfer_heads``, only those heads give the last token full peek in the
    transfer layers; the other heads there get self peek.
    """
    check_setting(model, l_wait, l_transfer)
    transfer = range(l_wait, l_wait + l_transfer)
    full_heads = None
    if transfer_heads is not None:
        full_heads = {layer: [] for layer in transfer}
        for head in transfer_heads:
            if head.layer not in full_heads:
                raise InputError(f"{head} is not in the transfer layers {list(transfer)}.")
            full_heads[head.layer].append(head.head)
    masks = layer_peek_masks(model, n_pos, layers=transfer, last="full", others=others, full_heads=full_heads)
    masks.update(layer_peek_masks(model, n_pos, layers=range(l_wait + l_transfer, model.cfg.n_layers),
                                  last="self", others=others))
    return masks


# ---------------------------------------------------------------------------- the runner


@dataclass
class _Group:
    tokens: Int[Tensor, "batch pos"]
    answers: Int[Tensor, "batch"]
    means: dict[int, CamaMeans]
    resid: dict[int, Float[Tensor, "batch pos d_model"]]


class AF1Runner:
    """Evaluates AF1 models on fixed eval prompts with CAMA means fitted on disjoint fit prompts.

    ``eval_data`` should hold the prompts the full model answers correctly (see
    :meth:`from_dataset`). Eval prompts whose alignment group has no fit prompts are
    dropped and counted in ``n_unmatched``.
    """

    base_accuracy: float = float("nan")  # full-model accuracy on the eval split (set by from_dataset)
    n_eval_total: int = 0

    def __init__(self, model: HookedTransformer, fit_data: Dataset, eval_data: Dataset,
                 config: AF1Config = AF1Config(), layers: Iterable[int] | None = None):
        if len(eval_data) == 0:
            raise NoEvalPromptsError("AF1 needs at least one evaluation prompt (none were answered correctly?).")
        if len(fit_data) == 0:
            raise InputError("AF1 needs prompts to fit the CAMA means on; the fit set is empty.")
        self.model, self.config = model, config
        n = model.cfg.n_layers
        self.layers = sorted(set(range(n + 1) if layers is None else layers))
        for layer in self.layers:
            check_setting(model, layer, 0)
        fitted = fit_cama(model, fit_data, self.layers, config.cama, batch_size=config.batch_size)
        self.groups: list[_Group] = []
        self.n_unmatched = 0
        self.group_keys: list[Hashable] = []
        for key, rows in group_rows(eval_data).items():
            if key not in fitted:
                self.n_unmatched += len(rows)
                continue
            subset = eval_data.select(rows)
            tokens = torch.tensor(subset["tokens"], device=model.cfg.device)
            answers = torch.tensor([ids[0] for ids in subset["answer_token_ids"]], device=model.cfg.device)
            self.groups.append(_Group(tokens, answers, fitted[key], residuals(model, tokens, self.layers, config.batch_size)))
            self.group_keys.append(key)
        if not self.groups:
            raise NoEvalPromptsError("No evaluation prompt shares a template/token layout with the fit prompts.")
        if self.n_unmatched:
            logger.warning("%d eval prompts have no fit prompts of the same layout and are left out.", self.n_unmatched)

    @classmethod
    def from_dataset(cls, model: HookedTransformer, data: Dataset, config: AF1Config = AF1Config(),
                     fit_data: Dataset | None = None, layers: Iterable[int] | None = None) -> "AF1Runner":
        """Split ``data`` (unless ``fit_data`` is given), keep the correctly answered eval prompts, build a runner."""
        if len(data) == 0:
            raise InputError("AF1 got an empty dataset.")
        if fit_data is None:
            fit_data, data = split_fit_eval(data, config.fit_fraction, config.seed)
        correct = accuracy_mask(model, data, config.batch_size)
        runner = cls(model, fit_data, data.select([i for i, ok in enumerate(correct) if ok]), config, layers)
        runner.base_accuracy = sum(correct) / len(correct)
        runner.n_eval_total = len(correct)
        return runner

    @property
    def n_eval(self) -> int:
        return sum(len(g.tokens) for g in self.groups)

    def cama_counts(self, l_wait: int) -> dict:
        """How many fit prompts the CAMA means at ``l_wait`` used, over the replaced (prompt, position) pairs."""
        used, fallback = [], []
        for group in self.groups:
            means = group.means[l_wait]
            n_used = means.lookup(group.tokens)[1][:, ~means.kept]
            used.append(n_used.flatten())
            fallback.append((~means.uses_value_mean(group.tokens)[:, ~means.kept]).flatten())
        used_all, fallback_all = torch.cat(used).float(), torch.cat(fallback).float()
        if used_all.numel() == 0:
            return {"min": None, "median": None, "fallback_fraction": None}
        return {"min": int(used_all.min()), "median": float(used_all.median()),
                "fallback_fraction": float(fallback_all.mean())}

    @property
    def constant_baseline(self) -> float:
        """Faithfulness of a model that always says the most common answer token: the floor to beat."""
        answers = torch.cat([g.answers for g in self.groups])
        return (answers == answers.mode().values).float().mean().item()

    def _cama_resid(self, group: _Group, l_wait: int) -> Tensor:
        if l_wait == 0:
            # The embeddings depend on each position's own token only: CAMA is the identity there,
            # except where a rare token would fall back to a position mean, which would only add noise.
            return group.resid[0]
        if l_wait not in group.means:
            raise InputError(f"This runner has no CAMA means for l_wait={l_wait}; it was built for layers {self.layers}.")
        return group.means[l_wait].apply(group.resid[l_wait], group.tokens)

    def _run(self, resid: Tensor, start: int, stop: int, masks: Mapping[int, Tensor]) -> Tensor:
        if start >= stop:
            return resid
        hooks = abp_hooks(self.model, {l: m for l, m in masks.items() if start <= l < stop})
        with self.model.hooks(fwd_hooks=hooks):
            return self.model(resid, start_at_layer=start, stop_at_layer=stop)

    def _logits_from(self, resid: Tensor, start: int, masks) -> Float[Tensor, "batch d_vocab"]:
        """Run blocks ``start..n-1`` in chunks; logits at END."""
        bs = self.config.batch_size
        return torch.cat([unembed_end(self.model, self._run(resid[i:i + bs], start, self.model.cfg.n_layers, masks)[:, -1])
                          for i in range(0, len(resid), bs)])

    @torch.no_grad()
    def end_logits(self, l_wait: int, l_transfer: int,
                   transfer_heads: Iterable[Head] | None = None) -> list[Float[Tensor, "batch d_vocab"]]:
        """The AF1 model's END logits, one tensor per alignment group (``self.groups`` order)."""
        check_setting(self.model, l_wait, l_transfer)
        heads = None if transfer_heads is None else list(transfer_heads)
        out = []
        for group in self.groups:
            masks = af1_masks(self.model, group.tokens.shape[1], l_wait, l_transfer,
                              transfer_heads=heads, others=self.config.others)
            out.append(self._logits_from(self._cama_resid(group, l_wait), l_wait, masks))
        return out

    def correct(self, l_wait: int, l_transfer: int,
                transfer_heads: Iterable[Head] | None = None) -> Bool[Tensor, "prompt"]:
        """Per eval prompt (group order): does the AF1 model answer top-1 correctly?"""
        logits = self.end_logits(l_wait, l_transfer, transfer_heads)
        return torch.cat([lg.argmax(-1) == g.answers for lg, g in zip(logits, self.groups)])

    def faithfulness(self, l_wait: int, l_transfer: int, transfer_heads: Iterable[Head] | None = None) -> float:
        """AF1 accuracy over the eval prompts (which the full model answers correctly)."""
        return self.correct(l_wait, l_transfer, transfer_heads).float().mean().item()

    @torch.no_grad()
    def sweep_transfer(self, l_wait: int, max_transfer: int | None = None) -> list[float]:
        """Faithfulness for ``l_transfer = 0 .. max_transfer`` at one ``l_wait`` (see :meth:`sweep_end_resid`)."""
        return [h.float().mean().item() for h in self.sweep_transfer_hits(l_wait, max_transfer)]

    @torch.no_grad()
    def sweep_transfer_hits(self, l_wait: int, max_transfer: int | None = None) -> list[Bool[Tensor, "prompt"]]:
        """Per ``l_transfer = 0 .. max_transfer``: which eval prompts (group order) the AF1 model answers correctly."""
        hits: list[list[Tensor]] = []
        for index, group in enumerate(self.groups):
            ends = self.sweep_end_resid(index, l_wait, max_transfer)
            flat = ends.flatten(0, 1)
            logits_argmax = torch.cat([unembed_end(self.model, chunk).argmax(-1)
                                       for chunk in flat.split(self.config.tail_batch_size)])
            for t, part in enumerate(logits_argmax.split(len(group.tokens))):
                if t == len(hits):
                    hits.append([])
                hits[t].append(part == group.answers)
        return [torch.cat(h).cpu() for h in hits]

    @torch.no_grad()
    def sweep_end_resid(self, group_index: int, l_wait: int,
                        max_transfer: int | None = None) -> Float[Tensor, "setting batch d_model"]:
        """Final END residuals of one group for ``l_transfer = 0 .. max_transfer`` at one ``l_wait``.

        Exact shortcuts, so the whole grid costs about as much as a few full forwards:

        * the settings share the full-peek prefix (one run of each transfer layer);
        * once a setting is past its transfer layers, only END matters for its output, and
          END reads only BOS and itself. BOS attends only to itself in every setting, so its
          keys and values are the plain model's: they are cached once, and each self-peek
          layer runs END alone (rotary positions stay right through TransformerLens'
          key/value cache offset), batched over all settings at that layer.
        """
        n = self.model.cfg.n_layers
        max_transfer = n - l_wait if max_transfer is None else max_transfer
        check_setting(self.model, l_wait, max_transfer)
        group = self.groups[group_index]
        n_pos = group.tokens.shape[1]
        full = af1_masks(self.model, n_pos, l_wait, n - l_wait, others=self.config.others)
        end_row = {layer: mask[..., -1:, :] for layer, mask in
                   af1_masks(self.model, n_pos, l_wait, 0, others=self.config.others).items()}
        prefix_cache = self._prefix_cache(group) if n_pos > 1 else None
        state = self._cama_resid(group, l_wait)  # full sequence after t full-peek layers
        tails: list[Tensor] = []  # tails[t]: END residual of setting t, past its transfer layers
        for layer in range(l_wait, n):
            t = layer - l_wait
            if t <= max_transfer:
                tails.append(state[:, -1:])
            merged = self._run_end_only(torch.cat(tails), layer, end_row, prefix_cache)
            tails = list(merged.split(len(group.tokens)))
            state = self._run_chunked(state, layer, full) if t < max_transfer else None
        if max_transfer == n - l_wait:
            tails.append(state[:, -1:])
        return torch.stack([tail[:, -1] for tail in tails])

    def _prefix_cache(self, group: _Group) -> list[TransformerLensKeyValueCacheEntry]:
        """Per-layer keys/values of positions 0..n-2 from a plain run of one prompt.

        Only BOS's entries are ever read (the ABP mask hides the others), and BOS is the
        same in every prompt and setting."""
        return _runs.prefix_kv_cache(self.model, group.tokens[:1, :-1])

    def _run_end_only(self, end: Tensor, layer: int, end_row: Mapping[int, Tensor], prefix_cache) -> Tensor:
        size = self.config.tail_batch_size
        out = []
        for chunk in end.split(size):
            entries = None if prefix_cache is None else _runs.TiledKVCache(prefix_cache, len(chunk))
            with self.model.hooks(fwd_hooks=abp_hooks(self.model, {layer: end_row[layer]})):
                out.append(self.model(chunk, start_at_layer=layer, stop_at_layer=layer + 1, past_kv_cache=entries))
        return torch.cat(out)

    def _run_chunked(self, resid: Tensor, layer: int, masks) -> Tensor:
        size = self.config.tail_batch_size
        return torch.cat([self._run(chunk, layer, layer + 1, masks) for chunk in resid.split(size)])


# ---------------------------------------------------------------------------- search


def af1_accuracy(model: HookedTransformer, data: Dataset, l_wait: int, l_transfer: int, *,
                 fit_data: Dataset | None = None, transfer_heads: Iterable[Head] | None = None,
                 config: AF1Config = AF1Config()) -> float:
    """Faithfulness of the AF1 model (``l_wait``, ``l_transfer``): its accuracy on prompts the full model gets right.

    Without ``fit_data``, ``data`` is split (``config.fit_fraction``) into a CAMA fit set
    and a disjoint eval set.
    """
    check_setting(model, l_wait, l_transfer)
    runner = AF1Runner.from_dataset(model, data, config, fit_data=fit_data, layers=[l_wait])
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


def grid_faithfulness(runner: AF1Runner, l_waits: Iterable[int] | None = None, progress: bool = True) -> list[list[float]]:
    """The (l_wait, l_transfer) grid: ``grid[w][t]``, NaN outside ``w + t <= n_layers`` or for skipped ``w``."""
    n = runner.model.cfg.n_layers
    grid = [[float("nan")] * (n + 1) for _ in range(n + 1)]
    l_waits = runner.layers if l_waits is None else sorted(l_waits)
    for w in tqdm(l_waits, desc="AF1 grid (l_wait)", disable=not progress):
        for t, value in enumerate(runner.sweep_transfer(w)):
            grid[w][t] = value
    return grid


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
    w, t, _ = max(cells, key=lambda c: (c[2], c[0], -c[1]))
    return w, t, False


def held_out_selection(runner: AF1Runner, l_waits: Iterable[int] | None = None, min_faithfulness: float = 0.9,
                       seed: int = 0, progress: bool = True) -> dict:
    """Choose (l_wait, l_transfer) on one half of the eval prompts and report its faithfulness on the other half.

    Picking the best of ~100 cells on the same prompts that report it overstates the faithfulness
    (winner's curse). The eval prompts are split at random (``seed``) into a selection half and a
    report half; :func:`select_setting` runs on the selection half's grid, and the chosen cell's
    faithfulness is reported on the report half with its Wilson interval.
    """
    n = runner.model.cfg.n_layers
    order = torch.randperm(runner.n_eval, generator=torch.Generator().manual_seed(seed))
    select_idx, report_idx = order[: runner.n_eval // 2].sort().values, order[runner.n_eval // 2:].sort().values
    if len(select_idx) == 0 or len(report_idx) == 0:
        raise NoEvalPromptsError(f"A held-out AF1 selection needs at least 2 evaluation prompts, got {runner.n_eval}.")
    hits: dict[tuple[int, int], Tensor] = {}
    for w in tqdm(runner.layers if l_waits is None else sorted(l_waits), desc="AF1 grid (held out)", disable=not progress):
        for t, h in enumerate(runner.sweep_transfer_hits(w)):
            hits[(w, t)] = h
    half_grid = lambda idx: [[float(hits[(w, t)][idx].float().mean()) if (w, t) in hits else float("nan")
                              for t in range(n + 1)] for w in range(n + 1)]
    w, t, ok = select_setting(half_grid(select_idx), min_faithfulness)
    reported = proportion(hits[(w, t)][report_idx].double())
    return {"l_wait": w, "l_transfer": t, "meets_threshold_on_selection_half": ok,
            "selection_faithfulness": float(hits[(w, t)][select_idx].float().mean()),
            "held_out_faithfulness": reported.to_dict(),
            "selection_prompts": select_idx.tolist(), "report_prompts": report_idx.tolist(),
            "interval": "95% Wilson over the report half"}


def prune_transfer_heads(runner: AF1Runner, l_wait: int, l_transfer: int, keep: float = 0.95,
                         progress: bool = True) -> tuple[list[Head], float, list[dict]]:
    """Greedily close transfer heads (self peek) while faithfulness stays ``>= keep`` x the full setting's.

    One pass ranks each head by the faithfulness with it alone closed (least harmful
    first); a second pass closes heads in that order, keeping a closure only if the
    target still holds. Returns the kept heads, their faithfulness, and the trace.
    """
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
               runner: AF1Runner | None = None, progress: bool = True) -> AF1SearchResult:
    """Grid over (l_wait, l_transfer), select the setting, prune its transfer heads."""
    if runner is None:
        runner = AF1Runner.from_dataset(model, data, config, fit_data=fit_data, layers=l_waits)
    grid = grid_faithfulness(runner, l_waits, progress)
    w, t, ok = select_setting(grid, config.min_faithfulness)
    kept, pruned, trace = prune_transfer_heads(runner, w, t, config.prune_keep, progress)
    return AF1SearchResult(grid, w, t, grid[w][t], ok, kept, pruned, t * model.cfg.n_heads, trace,
                           runner.base_accuracy, runner.n_eval, runner.n_unmatched, runner.constant_baseline)


def faithfulness_heatmap(grid: Sequence[Sequence[float]], title: str = "AF1 faithfulness",
                         best: tuple[int, int] | None = None):
    """A plotly heatmap of ``grid[l_wait][l_transfer]`` (rows: l_wait, columns: l_transfer)."""
    import plotly.graph_objects as go

    z = [[None if math.isnan(v) else v for v in row] for row in grid]
    fig = go.Figure(go.Heatmap(z=z, x=list(range(len(grid[0]))), y=list(range(len(grid))), zmin=0, zmax=1,
                               colorscale="Viridis", colorbar={"title": "faithfulness"},
                               hovertemplate="L_wait=%{y}<br>L_transfer=%{x}<br>faithfulness=%{z:.3f}<extra></extra>"))
    if best is not None:
        fig.add_trace(go.Scatter(x=[best[1]], y=[best[0]], mode="markers", name="selected",
                                 marker={"symbol": "x", "size": 14, "color": "red"}))
    fig.update_layout(title=title, xaxis_title="L_transfer (full-peek layers)", yaxis_title="L_wait (CAMA layer)")
    return fig
