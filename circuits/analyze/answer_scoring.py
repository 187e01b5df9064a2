"""How an answer is scored: first token, one-token answers only, or the whole answer teacher-forced.

Zhang et al. (2024) score the first answer token at END. With one-digit operands
about 45% of sums are two-digit and start with "1" (gemma splits digits), so a
first-token hit on "12" only says the model wrote a "1". Three scorings:

* ``"first"``: the first answer token is top-1 at END (the paper's metric; every row);
* ``"one_token"``: the same, but only rows whose answer is one token (other rows are not
  scored: ``None``), where the first token *is* the answer;
* ``"whole"``: teacher-forced: feed the prompt and the answer's tokens, and require every
  answer token to be top-1 at the position before it (no end-of-answer token is required).

:func:`score_rows` gives one entry per row; :func:`scored_accuracy` the accuracy with its
Wilson interval over the scored rows (:mod:`circuits.stats`).
"""

from __future__ import annotations

from typing import Literal, Optional, get_args

import torch
from datasets import Dataset
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.arguments import check_option
from circuits.end_logits import end_argmax
from circuits.prefix_cache import run_after_shared_prefix
from circuits.stats import Estimate, proportion

Scoring = Literal["first", "one_token", "whole"]  # first answer token, one-token answers only, whole answer
SCORINGS: tuple[str, ...] = get_args(Scoring)


def _check(scoring: str) -> None:
    check_option("scoring", scoring, Scoring)


@torch.no_grad()
def score_rows(model: HookedTransformer, dataset: Dataset, scoring: str = "whole", batch_size: int = 32,
               fwd_hooks=()) -> list[Optional[bool]]:
    """Per row: is it answered correctly under ``scoring`` (``None``: not scored, for ``"one_token"``)?"""
    _check(scoring)
    if scoring == "whole":
        return first_and_whole(model, dataset, batch_size, fwd_hooks)[1]
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}.")
    wanted = None if scoring == "first" else [len(ids) == 1 for ids in dataset["answer_token_ids"]]
    first = _teacher_forced(model, dataset, batch_size, fwd_hooks, whole=False)[0]
    return first if wanted is None else [ok if keep else None for ok, keep in zip(first, wanted)]


@torch.no_grad()
def first_and_whole(model: HookedTransformer, dataset: Dataset, batch_size: int = 32,
                    fwd_hooks=()) -> tuple[list[bool], list[bool]]:
    """Per row, from one teacher-forced forward: is the first answer token top-1 at END, and is every answer token?

    Attention is causal, so END of the prompt followed by the answer's tokens is END of the prompt
    alone: the first answer token is scored in the same pass that scores the whole answer.
    """
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}.")
    return _teacher_forced(model, dataset, batch_size, fwd_hooks, whole=True)


def _teacher_forced(model, dataset: Dataset, batch_size: int, fwd_hooks, *, whole: bool) -> tuple[list[bool], list[bool]]:
    """First-token and whole-answer hits; ``whole=False`` feeds the prompt only (whole then equals first)."""
    rows = dataset.select_columns(["tokens", "answer_token_ids"]).to_list()
    # teacher forcing feeds all but the last answer token
    feed = lambda r: r["tokens"] + (r["answer_token_ids"][:-1] if whole else [])
    by_length: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_length.setdefault(len(feed(r)), []).append(i)
    first, every = [False] * len(rows), [False] * len(rows)
    device = model.cfg.device
    for n_pos, indices in sorted(by_length.items()):
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            tokens = torch.tensor([feed(rows[i]) for i in chunk], device=device)
            # the positions before the first scored one that every row shares (few-shot lines) run once
            limit = 0 if fwd_hooks else min(len(rows[i]["tokens"]) for i in chunk) - 1
            resid, shared = run_after_shared_prefix(model, tokens, fwd_hooks, limit=limit)
            # every scored (row, position) of the chunk in one screened argmax
            answers = [rows[i]["answer_token_ids"] if whole else rows[i]["answer_token_ids"][:1] for i in chunk]
            row_index = torch.tensor([j for j, a in enumerate(answers) for _ in a], device=device)
            positions = torch.tensor([len(rows[i]["tokens"]) - 1 - shared + p for i, a in zip(chunk, answers)
                                      for p in range(len(a))], device=device)
            hits = (end_argmax(model, resid[row_index, positions]) == torch.tensor(sum(answers, []), device=device)).tolist()
            at = 0
            for i, a in zip(chunk, answers):
                first[i], every[i] = hits[at], all(hits[at:at + len(a)])
                at += len(a)
    return first, every


def scored_accuracy(model: HookedTransformer, dataset: Dataset, scoring: str = "whole", batch_size: int = 32) -> Estimate:
    """Accuracy under ``scoring`` over the rows it scores, with its Wilson interval and sample size."""
    scored = [ok for ok in score_rows(model, dataset, scoring, batch_size) if ok is not None]
    return proportion(torch.tensor(scored, dtype=torch.float64))
