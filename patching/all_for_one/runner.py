"""The AF1 model and its runner: CAMA up to ``L_wait``, ABP peeks after (see :mod:`patching.all_for_one.search`).

:class:`AF1Runner` holds the evaluation prompts, their CAMA means (fitted on prompts
disjoint from each evaluated one: a fit/eval split, or cross-fitting over folds) and
their cached residuals, and scores any (``L_wait``, ``L_transfer``) setting cheaply.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Mapping, Sequence

import torch
from datasets import Dataset
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer, TransformerLensKeyValueCacheEntry

from circuits.arguments import check_positive_int
from circuits.end_logits import unembed_end
from circuits.nodes import Head
from circuits.errors import InputError, ToolkitError
from circuits.answer_scoring import answer_is_top1, first_token_hits
from circuits.prefix_cache import TiledKVCache, prefix_kv_cache
from patching.all_for_one.abp import PeekRule, abp_hooks, layer_peek_masks
from patching.all_for_one.template_prompts import cross_fit_folds, split_fit_eval
from patching.all_for_one.cama import CamaConfig, CamaMeans, fit_cama, group_rows, residuals
from patching.sweeps.options import SweepOptions, sweep_options

logger = logging.getLogger(__name__)

AF1_OPTIONS = ("batch_size", "progress")  # the SweepOptions AF1 uses: it scores top-1, its blocks sized by the config



class NoEvalPromptsError(ToolkitError, ValueError):
    """No evaluation prompt is left for AF1 (none answered correctly, or no layout matches the fit prompts)."""


@dataclass(frozen=True)
class AF1Config:
    """AF1 settings. ``others``: peek rule of non-last tokens after ``L_wait`` (paper: ``"self"``)."""

    cama: CamaConfig = field(default_factory=CamaConfig)
    others: PeekRule = "self"
    fit_fraction: float = 0.5
    tail_batch_size: int = 256  # rows per block call when the grid batches many settings together
    min_faithfulness: float = 0.9
    prune_keep: float = 0.95
    seed: int = 0
    # False skips CAMA (each prompt keeps its own residual at L_wait, ABP only): isolates what CAMA costs
    ablate_wait: bool = True

    def __post_init__(self) -> None:
        check_positive_int(self.tail_batch_size, "AF1Config.tail_batch_size")
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
    prompts: list[str] = field(default_factory=list)
    fit_prompts: frozenset[str] = frozenset()  # the prompts its CAMA means were fitted on
    fold: int = 0


class AF1Runner:
    """Evaluates AF1 models on fixed eval prompts with CAMA means fitted on disjoint fit prompts.

    ``eval_data`` should hold the prompts the full model answers correctly (see
    :meth:`from_dataset`, or :meth:`cross_fitted` for means fitted on the other folds).
    Eval prompts whose alignment group has no fit prompts are dropped and counted in
    ``n_unmatched``. ``options`` (:class:`patching.SweepOptions`): ``batch_size`` (prompts per
    forward, default 32) and ``progress`` (the grid's and the pruning's bars, shown by default) apply.
    """

    base_accuracy: float = float("nan")  # full-model accuracy on the eligible eval prompts (set by the constructors)
    n_eval_total: int = 0

    def __init__(self, model: HookedTransformer, fit_data: Dataset, eval_data: Dataset,
                 config: AF1Config = AF1Config(), layers: Iterable[int] | None = None,
                 options: SweepOptions | None = None):
        self._setup(model, config, layers, options)
        self._add_split(fit_data, eval_data)
        self._finish()

    def _setup(self, model: HookedTransformer, config: AF1Config, layers: Iterable[int] | None,
               options: SweepOptions | None) -> None:
        self.model, self.config = model, config
        self.options = sweep_options(options, "AF1Runner", AF1_OPTIONS)
        self.batch_size = self.options.batch(32)
        n = model.cfg.n_layers
        self.layers = sorted(set(range(n + 1) if layers is None else layers))
        for layer in self.layers:
            check_setting(model, layer, 0)
        self.groups: list[_Group] = []
        self.group_keys: list[Hashable] = []
        self.n_unmatched = 0

    def _add_split(self, fit_data: Dataset, eval_data: Dataset, fold: int = 0) -> None:
        """Fit CAMA means on ``fit_data`` and add ``eval_data``'s prompts as groups using them."""
        if len(eval_data) == 0:
            raise NoEvalPromptsError("AF1 needs at least one evaluation prompt (none were answered correctly?).")
        if len(fit_data) == 0:
            raise InputError("AF1 needs prompts to fit the CAMA means on; the fit set is empty.")
        device, bs = self.model.cfg.device, self.batch_size
        fitted = fit_cama(self.model, fit_data, self.layers, self.config.cama, options=SweepOptions(batch_size=bs))
        fit_prompts = {key: frozenset(fit_data.select(rows)["prompt"]) for key, rows in group_rows(fit_data).items()}
        for key, rows in group_rows(eval_data).items():
            if key not in fitted:
                self.n_unmatched += len(rows)
                continue
            subset = eval_data.select(rows)
            tokens = torch.tensor(subset["tokens"], device=device)
            answers = torch.tensor([ids[0] for ids in subset["answer_token_ids"]], device=device)
            self.groups.append(_Group(tokens, answers, fitted[key], residuals(self.model, tokens, self.layers, bs),
                                      list(subset["prompt"]), fit_prompts[key], fold))
            self.group_keys.append(key)

    def _finish(self) -> None:
        if not self.groups:
            raise NoEvalPromptsError("No evaluation prompt shares a template/token layout with the fit prompts.")
        if self.n_unmatched:
            logger.warning("%d eval prompts have no fit prompts of the same layout and are left out.", self.n_unmatched)

    @classmethod
    def from_dataset(cls, model: HookedTransformer, data: Dataset, config: AF1Config = AF1Config(),
                     fit_data: Dataset | None = None, layers: Iterable[int] | None = None,
                     options: SweepOptions | None = None) -> "AF1Runner":
        """Split ``data`` (unless ``fit_data`` is given), keep the correctly answered eval prompts, build a runner."""
        if len(data) == 0:
            raise InputError("AF1 got an empty dataset.")
        if fit_data is None:
            fit_data, data = split_fit_eval(data, config.fit_fraction, config.seed)
        correct = first_token_hits(model, data, sweep_options(options, "AF1Runner", AF1_OPTIONS).batch(32))
        runner = cls(model, fit_data, data.select([i for i, ok in enumerate(correct) if ok]), config, layers, options)
        runner.base_accuracy = sum(correct) / len(correct)
        runner.n_eval_total = len(correct)
        return runner

    @classmethod
    def cross_fitted(cls, model: HookedTransformer, data: Dataset, config: AF1Config = AF1Config(), *,
                     eligible: Sequence[bool] | None = None, n_folds: int = 2,
                     layers: Iterable[int] | None = None, options: SweepOptions | None = None) -> "AF1Runner":
        """Cross-fitted CAMA means: each fold's prompts are evaluated with means fitted on the other folds.

        Every row of ``data`` (e.g. all operand pairs of the templates, two-digit sums included)
        feeds the means of the folds it is not in; the eligible rows (default: all; e.g. the
        one-token answers) that the full model answers correctly are evaluated. So every eligible
        prompt is evaluated, none with a mean it contributed to, and each mean has about
        ``(n_folds - 1) / n_folds`` of the data instead of a fixed half of the eligible prompts.
        """
        if len(data) == 0:
            raise InputError("AF1 got an empty dataset.")
        eligible = [True] * len(data) if eligible is None else list(eligible)
        if len(eligible) != len(data):
            raise InputError(f"eligible has {len(eligible)} entries for {len(data)} rows: give one flag per row of data.")
        folds = cross_fit_folds(data, n_folds, config.seed)
        candidates = [i for i, ok in enumerate(eligible) if ok]
        if not candidates:
            raise NoEvalPromptsError("No row of the data is eligible for evaluation.")
        runner = cls.__new__(cls)
        runner._setup(model, config, layers, options)
        correct = dict(zip(candidates, first_token_hits(model, data.select(candidates), runner.batch_size)))
        for fold in range(n_folds):
            fit_rows = [i for i, f in enumerate(folds) if f != fold]
            eval_rows = [i for i in candidates if folds[i] == fold and correct[i]]
            if eval_rows:
                runner._add_split(data.select(fit_rows), data.select(eval_rows), fold)
        runner._finish()
        runner.base_accuracy = sum(correct.values()) / len(correct)
        runner.n_eval_total = len(correct)
        return runner

    @property
    def n_eval(self) -> int:
        return sum(len(g.tokens) for g in self.groups)

    def cama_counts(self, l_wait: int | None = None) -> dict:
        """How many fit prompts the CAMA means at ``l_wait`` used, over the replaced (prompt, position) pairs.

        ``fallback_fraction``: the share of replaced (prompt, position) pairs whose token had
        fewer than ``min_count`` fit prompts (mean of the position instead; target 0);
        ``prompts_with_fallback``: the share of eval prompts with at least one such position.
        Which tokens fall back does not depend on the layer.
        """
        l_wait = self.layers[-1] if l_wait is None else l_wait
        used, fallback, per_prompt = [], [], []
        for group in self.groups:
            means = group.means[l_wait]
            replaced = ~means.kept
            used.append(means.lookup(group.tokens)[1][:, replaced].flatten())
            falls = means.fallback_mask(group.tokens)
            fallback.append(falls[:, replaced].flatten())
            per_prompt.append(falls.any(1))
        used_all, fallback_all = torch.cat(used).float(), torch.cat(fallback).float()
        prompts = torch.cat(per_prompt).float()
        if used_all.numel() == 0:
            return {"min": None, "median": None, "fallback_fraction": 0.0, "n_replaced": 0,
                    "prompts_with_fallback": 0.0, "min_count": self.config.cama.min_count}
        return {"min": int(used_all.min()), "median": float(used_all.median()),
                "fallback_fraction": float(fallback_all.mean()), "n_replaced": int(used_all.numel()),
                "prompts_with_fallback": float(prompts.mean()), "min_count": self.config.cama.min_count}

    @property
    def prompt_templates(self) -> list:
        """The template id of each eval prompt, in group order (as the hit vectors)."""
        return [key[0] for key, group in zip(self.group_keys, self.groups) for _ in range(len(group.tokens))]

    @property
    def constant_baseline(self) -> float:
        """Faithfulness of a model that always says the most common answer token: the floor to beat."""
        answers = torch.cat([g.answers for g in self.groups])
        return (answers == answers.mode().values).float().mean().item()

    def with_config(self, **changes) -> "AF1Runner":
        """A copy sharing this runner's prompts, means and residuals, with ``AF1Config`` fields changed
        (not ``cama``, whose means are already fitted)."""
        if "cama" in changes:
            raise InputError("with_config cannot change the CAMA settings of fitted means; build a new runner.")
        other = copy.copy(self)
        other.config = dataclasses.replace(self.config, **changes)
        return other

    @property
    def prompts(self) -> list[str]:
        """The eval prompts in group order (as the hit vectors)."""
        return [p for group in self.groups for p in group.prompts]

    def _cama_resid(self, group: _Group, l_wait: int) -> Tensor:
        if not self.config.ablate_wait:
            return group.resid[l_wait]
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

    def _end_resid_from(self, resid: Tensor, start: int, masks) -> Float[Tensor, "batch d_model"]:
        """Run blocks ``start..n-1`` in chunks of ``batch_size``; the final residual at END."""
        bs = self.batch_size
        return torch.cat([self._run(resid[i:i + bs], start, self.model.cfg.n_layers, masks)[:, -1]
                          for i in range(0, len(resid), bs)])

    @torch.no_grad()
    def end_resid(self, l_wait: int, l_transfer: int,
                  transfer_heads: Iterable[Head] | None = None) -> list[Float[Tensor, "batch d_model"]]:
        """The AF1 model's final END residuals, one tensor per alignment group (``self.groups`` order)."""
        check_setting(self.model, l_wait, l_transfer)
        heads = None if transfer_heads is None else list(transfer_heads)
        out = []
        for group in self.groups:
            masks = af1_masks(self.model, group.tokens.shape[1], l_wait, l_transfer,
                              transfer_heads=heads, others=self.config.others)
            out.append(self._end_resid_from(self._cama_resid(group, l_wait), l_wait, masks))
        return out

    @torch.no_grad()
    def end_logits(self, l_wait: int, l_transfer: int,
                   transfer_heads: Iterable[Head] | None = None) -> list[Float[Tensor, "batch d_vocab"]]:
        """The AF1 model's END logits, one tensor per alignment group (``self.groups`` order)."""
        bs = self.batch_size
        # unembedded in the same chunks as the forward, so the logits do not depend on how many prompts a group has
        return [torch.cat([unembed_end(self.model, ends[i:i + bs]) for i in range(0, len(ends), bs)])
                for ends in self.end_resid(l_wait, l_transfer, transfer_heads)]

    def _hits(self, ends: Float[Tensor, "rows d_model"], answers: Int[Tensor, "rows"]) -> Bool[Tensor, "rows"]:
        """Per final END residual: is its answer top-1? Every AF1 accuracy (one setting, or a whole sweep) is this
        one comparison, :func:`circuits.answer_scoring.answer_is_top1` (the screened argmax)."""
        return answer_is_top1(self.model, ends, answers)

    def correct(self, l_wait: int, l_transfer: int,
                transfer_heads: Iterable[Head] | None = None) -> Bool[Tensor, "prompt"]:
        """Per eval prompt (group order): does the AF1 model answer top-1 correctly?"""
        ends = self.end_resid(l_wait, l_transfer, transfer_heads)
        return torch.cat([self._hits(e, g.answers) for e, g in zip(ends, self.groups)])

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
            ends = self.sweep_end_resid(index, l_wait, max_transfer)  # [setting, prompt, d_model]
            flat_hits = self._hits(ends.flatten(0, 1), group.answers.repeat(len(ends)))
            for t, part in enumerate(flat_hits.split(len(group.tokens))):
                if t == len(hits):
                    hits.append([])
                hits[t].append(part)
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
        return prefix_kv_cache(self.model, group.tokens[:1, :-1])

    def _run_end_only(self, end: Tensor, layer: int, end_row: Mapping[int, Tensor], prefix_cache) -> Tensor:
        size = self.config.tail_batch_size
        out = []
        for chunk in end.split(size):
            entries = None if prefix_cache is None else TiledKVCache(prefix_cache, len(chunk))
            with self.model.hooks(fwd_hooks=abp_hooks(self.model, {layer: end_row[layer]})):
                out.append(self.model(chunk, start_at_layer=layer, stop_at_layer=layer + 1, past_kv_cache=entries))
        return torch.cat(out)

    def _run_chunked(self, resid: Tensor, layer: int, masks) -> Tensor:
        size = self.config.tail_batch_size
        return torch.cat([self._run(chunk, layer, layer + 1, masks) for chunk in resid.split(size)])
