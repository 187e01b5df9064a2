"""The prompt forms every patching method accepts, turned into groups of equal token length.

Every public method accepts its prompts in one of three forms and turns them
into :class:`PromptGroup` s (prompts of equal token length, on the model's
device) with :func:`prompt_groups`:

* a ``datasets.Dataset`` from :func:`circuits.tasks.make_dataset` (its
  ``cf_tokens`` column gives the counterfactual; rows are grouped by length), or of
  :mod:`circuits.pair_tasks` (its ``alt_token_id`` column gives ``alt_ids`` when none are passed);
* a :class:`circuits.tasks.TaskBatch`;
* reference and counterfactual token tensors ``[batch, pos]`` plus ``answer_ids``.

Results over several groups are averaged with each prompt weighted equally.

Token ids are checked here, once for every method: integer tensors (a float tensor would be cast
or fail deep inside the embedding) with every id in the model's vocabulary (an id past it is an
``IndexError`` from ``torch.embedding``, naming nothing); answer ids likewise; at least one prompt,
none longer than the model's context. Counterfactuals identical to their references are allowed
(every patching effect is then exactly 0) but warned about (:class:`IdenticalCounterfactualWarning`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import torch
from datasets import Dataset
from jaxtyping import Int
from torch import Tensor
from transformer_lens import HookedTransformer

from circuits.arguments import check_finite_weights, check_positive_int
from circuits.errors import InputError, InputTypeError
from circuits.tasks import TaskBatch, iter_batches

PromptInput = Dataset | TaskBatch | Tensor


class IdenticalCounterfactualWarning(UserWarning):
    """Every counterfactual prompt equals its reference: each patching effect is exactly 0 by construction."""


class NoEffectWarning(UserWarning):
    """Every patched run scored exactly what the unpatched run scored, although the counterfactuals differ."""

IdInput = int | Sequence[int] | Tensor | None


@dataclass
class PromptGroup:
    """Reference and counterfactual prompts of one token length, with the tokens the metric scores."""

    tokens: Int[Tensor, "batch pos"]
    cf_tokens: Int[Tensor, "batch pos"]
    answer_ids: Int[Tensor, "batch"]
    alt_ids: Int[Tensor, "batch"] | None = None
    spans: Int[Tensor, "batch pos"] | None = None  # the span of every position (position-aware edges)

    def __len__(self) -> int:
        return self.tokens.shape[0]


def _ids(ids: IdInput, n: int, name: str, device) -> Tensor | None:
    if ids is None:
        return None
    if isinstance(ids, int) and not isinstance(ids, bool):
        return torch.full((n,), ids, dtype=torch.long, device=device)
    as_given = torch.as_tensor(ids)
    if as_given.is_floating_point() or as_given.is_complex() or as_given.dtype == torch.bool:
        raise InputError(f"{name} must be integer token ids (one int, or one per prompt), got {as_given.dtype} "
                         f"values such as {as_given.flatten()[:3].tolist()}.")
    ids = as_given.long()
    if ids.shape != (n,):
        raise InputError(f"{name} has shape {tuple(ids.shape)} but there are {n} prompts: pass one id per prompt or one int.")
    return ids.to(device)


def prompt_groups(
    model: HookedTransformer,
    reference: PromptInput,
    counterfactual: Tensor | None = None,
    *,
    answer_ids: IdInput = None,
    alt_ids: IdInput = None,
    batch_size: int | None = None,
    span_of=None,
) -> list[PromptGroup]:
    """Normalise the accepted input forms into equal-length groups on the model's device (see module docstring).

    ``span_of(role_masks) -> [batch, pos]`` labels every position with a span (position-aware edges,
    :func:`patching.edges.positions.span_ids`); it needs the positions of the prompts' parts, so a Dataset
    or a TaskBatch.
    """
    check_positive_int(batch_size, "batch_size", allow_none=True)  # None: one group per prompt length
    if isinstance(reference, Dataset):
        groups = _dataset_groups(model, reference, counterfactual, answer_ids, alt_ids, batch_size, span_of)
    elif isinstance(reference, TaskBatch):
        groups = _task_batch_groups(model, reference, counterfactual, answer_ids, alt_ids, span_of)
    elif isinstance(reference, Tensor):
        groups = _tensor_groups(model, reference, counterfactual, answer_ids, alt_ids, batch_size, span_of)
    else:
        raise InputTypeError(f"reference must be a Dataset (circuits.tasks.make_dataset), a TaskBatch or a [batch, pos] "
                         f"token tensor, got {type(reference).__name__}.")
    if not groups:
        raise InputError("No prompts to patch: the prompts given are empty; pass at least one prompt.")
    _check_groups(model, groups)
    if all(torch.equal(g.tokens, g.cf_tokens) for g in groups):
        warnings.warn("Every counterfactual prompt is identical to its reference prompt: every patching effect and "
                      "attribution score is exactly 0 by construction. Pass counterfactuals that differ from the "
                      "references (e.g. circuits.tasks.make_dataset's cf_tokens).", IdenticalCounterfactualWarning,
                      stacklevel=3)
    return groups


def _dataset_groups(model, reference: Dataset, counterfactual, answer_ids, alt_ids, batch_size,
                    span_of) -> list[PromptGroup]:
    """A Dataset's prompts in groups of one token length (its cf_tokens and answer_token_ids columns)."""
    device = model.cfg.device
    if alt_ids is None and "alt_token_id" in reference.column_names:  # a pair task's distractors
        alt_ids = reference["alt_token_id"]
    all_alts = _ids(alt_ids, len(reference), "alt_ids", "cpu")  # one per prompt of the whole dataset
    if len(reference) == 0:
        raise InputError("The Dataset holds no prompts (0 rows: a filter or select that keeps none?); pass at least "
                         "one prompt.")
    if counterfactual is not None:
        raise InputError("With a Dataset the counterfactual comes from its cf_tokens column; pass counterfactual=None.")
    if answer_ids is not None:
        raise InputError("With a Dataset the answers come from its answer_token_ids column; pass answer_ids=None.")
    return [PromptGroup(batch.tokens.to(device), batch.cf_tokens.to(device), batch.answer_ids.to(device),
                        None if all_alts is None else all_alts[torch.as_tensor(batch.indices)].to(device),
                        None if span_of is None else span_of(batch.role_masks).to(device))
            for batch in iter_batches(reference, batch_size or len(reference))]


def _task_batch_groups(model, reference: TaskBatch, counterfactual, answer_ids, alt_ids,
                       span_of) -> list[PromptGroup]:
    """A TaskBatch as one group (it carries its counterfactual and answers)."""
    device = model.cfg.device
    if counterfactual is not None or answer_ids is not None:
        raise InputError("A TaskBatch carries its counterfactual and answers; pass counterfactual=None, answer_ids=None.")
    n = len(reference)
    return [PromptGroup(reference.tokens.to(device), reference.cf_tokens.to(device),
                        reference.answer_ids.to(device), _ids(alt_ids, n, "alt_ids", device),
                        None if span_of is None else span_of(reference.role_masks).to(device))]


def _tensor_groups(model, reference: Tensor, counterfactual, answer_ids, alt_ids, batch_size,
                   span_of) -> list[PromptGroup]:
    """Token tensors cut into groups of ``batch_size`` rows, once their shapes and answers are checked."""
    device = model.cfg.device
    if span_of is not None:
        raise InputError("Position-aware edges need the positions of the prompts' parts: pass a Dataset from "
                         "circuits.tasks.make_dataset or a TaskBatch, not token tensors.")
    if not isinstance(counterfactual, Tensor):
        raise InputError("With reference tokens, pass counterfactual tokens of the same shape as a tensor.")
    check_token_ids(model, reference, "reference tokens")  # before shapes: a float tensor is the likelier slip
    check_token_ids(model, counterfactual, "counterfactual tokens")
    if reference.ndim != 2 or reference.shape != counterfactual.shape:
        raise InputError(
            f"reference {tuple(reference.shape)} and counterfactual {tuple(counterfactual.shape)} must both be "
            f"[batch, pos] with the same shape: patching swaps activations position by position."
        )
    if answer_ids is None:
        raise InputError("With token tensors, pass answer_ids (one int, or one id per prompt).")
    n = reference.shape[0]
    if n == 0:
        raise InputError("The reference tokens hold no prompt (shape [0, pos]): pass at least one prompt.")
    step = batch_size or n
    answers, alts = _ids(answer_ids, n, "answer_ids", device), _ids(alt_ids, n, "alt_ids", device)
    return [PromptGroup(reference[sl].to(device), counterfactual[sl].to(device), answers[sl],
                        None if alts is None else alts[sl])
            for sl in (slice(start, start + step) for start in range(0, n, step))]


def _check_groups(model, groups: list[PromptGroup]) -> None:
    """Every group holds tokens, answers and alternatives in the vocabulary, and fits the model's context; the
    model's weights are finite."""
    check_finite_weights(model)
    vocab = model.cfg.d_vocab_out
    for g in groups:
        if g.tokens.shape[1] == 0:
            raise InputError("The prompts hold no tokens (shape [batch, 0]): patching scores the last position, so "
                             "pass prompts of at least one token.")
        for name, ids in (("answer_ids", g.answer_ids), ("alt_ids", g.alt_ids)):
            if ids is not None and (ids.min() < 0 or ids.max() >= vocab):
                raise InputError(f"{name} contains ids outside the vocabulary 0..{vocab - 1}.")
        for name, tokens in (("reference", g.tokens), ("counterfactual", g.cf_tokens)):
            check_token_ids(model, tokens, f"{name} tokens")
        check_fits_context(model, g.tokens.shape[1])


def warn_if_no_effect(any_change: bool, groups: Sequence[PromptGroup], what: str) -> None:
    """Warn (:class:`NoEffectWarning`) when no patched run moved the metric although the prompts differ.

    A metric that ignores the logits (a constant, or a value detached from them) makes every effect exactly
    0, which reads as "nothing matters" rather than as the mistake it is; identical counterfactuals were
    already warned about by :func:`prompt_groups`.
    """
    if any_change or all(torch.equal(g.tokens, g.cf_tokens) for g in groups):
        return
    warnings.warn(f"Every {what} effect is exactly 0 although the counterfactuals differ from the references: the "
                  "metric does not read what patching changes (a constant, or a value detached from the logits), or "
                  "the patched components are inert. Use a metric of the END logits such as 'logit' or 'logit_diff'.",
                  NoEffectWarning, stacklevel=3)


def check_fits_context(model: HookedTransformer, n_tokens: int) -> None:
    """Raise :class:`InputError` if prompts of ``n_tokens`` tokens do not fit the model's positions."""
    if n_tokens > model.cfg.n_ctx:
        raise InputError(f"Prompts of {n_tokens} tokens are longer than the model's context "
                         f"({model.cfg.n_ctx} positions): use fewer shots or shorter prompts.")


def check_token_ids(model: HookedTransformer, tokens: Tensor, name: str = "tokens") -> None:
    """Raise :class:`InputError` unless ``tokens`` is an integer tensor of ids in ``0..d_vocab - 1``."""
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise InputError(f"{name} have dtype {tokens.dtype}; token ids must be an integer tensor (e.g. "
                         "model.to_tokens(text), or tokens.long() if they are whole numbers stored as floats).")
    vocab = model.cfg.d_vocab
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        bad = tokens[(tokens < 0) | (tokens >= vocab)].unique()[:5].tolist()
        raise InputError(f"{name} contain ids {bad} outside this model's vocabulary 0..{vocab - 1}: they were "
                         "tokenized for another model, or are not token ids. Tokenize with this model's tokenizer.")
