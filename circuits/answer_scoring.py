"""How an answer is scored: first token, one-token answers only, or the whole answer teacher-forced.

Every accuracy of the toolkit is computed here: :func:`circuits.tasks.filter_correct`'s mask, the
knockout curves of :mod:`patching`, the evaluation harness of :mod:`finetune`, the analyses of
the experiments. A hit is always the same comparison (:func:`answer_is_top1`): is the answer token
the argmax of the logits read from the final residual stream, found by the certified bfloat16
screen of :func:`circuits.end_logits.end_argmax` where the CPU multiplies bfloat16 natively, else by
the float32 unembedding. A caller that holds the full logits anyway (to read a logit difference
beside the hit) compares on them with :func:`answer_is_argmax`.

Zhang et al. (2024) score the first answer token at END. With one-digit operands
about 45% of sums are two-digit and start with "1" (gemma splits digits), so a
first-token hit on "12" only says the model wrote a "1". Three scorings:

* ``"first"``: the first answer token is top-1 at END (the paper's metric; every row);
* ``"one_token"``: the same, but only rows whose answer is one token (other rows are not
  scored: ``None``), where the first token *is* the answer;
* ``"whole"``: teacher-forced: feed the prompt and the answer's tokens, and require every
  answer token to be top-1 at the position before it (no end-of-answer token is required).

:func:`first_token_hits` scores the first token from the prompt alone; :func:`first_and_whole`
scores the first token and the whole answer in one teacher-forced pass (attention is causal, so
END of the prompt followed by the answer is END of the prompt alone); both run
:func:`token_hits`, which takes plain token lists, so prompt datasets (:mod:`circuits.tasks`)
and training rows (:mod:`finetune.data`) are scored alike. :func:`score_rows` gives one entry per
row under a scoring; :func:`scored_accuracy` the accuracy with its Wilson interval over the scored
rows (:mod:`circuits.stats`).
"""

from __future__ import annotations

from typing import Literal, Optional, Sequence, get_args

import torch
from datasets import Dataset
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from circuits.errors import InputError, TaskDataError
from circuits.arguments import check_option, check_positive_int
from circuits.end_logits import HookList, end_argmax, end_residual, outscored
from circuits.prefix_cache import run_after_shared_prefix
from circuits.stats import Estimate, proportion

Scoring = Literal["first", "one_token", "whole"]  # first answer token, one-token answers only, whole answer
SCORINGS: tuple[str, ...] = get_args(Scoring)


def _check(scoring: str) -> None:
    check_option("scoring", scoring, Scoring)


@torch.no_grad()
def answer_is_top1(
    model: HookedTransformer,
    resid: Float[Tensor, "rows d_model"],
    answer_ids: Int[Tensor, "rows"],
    *,
    rivals: Optional[Int[Tensor, "k"]] = None,
    screen: Optional[bool] = None,
    stats: Optional[dict] = None,
) -> Bool[Tensor, "rows"]:
    """Per row: is the answer token the argmax of the logits of this final residual? (``screen``, ``stats``: see
    :func:`circuits.end_logits.end_argmax`)

    ``rivals``: tokens tried first, beside every row's answer (e.g. every answer of the task): a row where one of
    them outscores its answer beyond float32 rounding is a miss without the whole vocabulary
    (:func:`circuits.end_logits.outscored`); only the other rows are unembedded in full, so the hits are the same,
    and a sweep whose rows mostly miss is faster.
    ``stats["outscored"]`` counts the rows decided that way.
    """
    answer_ids = answer_ids.to(resid.device)
    if rivals is None or resid.shape[0] == 0:
        return end_argmax(model, resid, screen=screen, stats=stats) == answer_ids
    beaten = outscored(model, resid, answer_ids, rivals)
    if stats is not None:
        stats["outscored"] = stats.get("outscored", 0) + int(beaten.sum())
    hits = torch.zeros(resid.shape[0], dtype=torch.bool, device=resid.device)
    open_rows = (~beaten).nonzero()[:, 0]
    if len(open_rows):
        hits[open_rows] = end_argmax(model, resid[open_rows], screen=screen, stats=stats) == answer_ids[open_rows]
    return hits


def answer_is_argmax(logits: Float[Tensor, "rows d_vocab"], answer_ids: Int[Tensor, "rows"]) -> Bool[Tensor, "rows"]:
    """Per row: is the answer token the argmax of these logits, already computed over the whole vocabulary?

    The same comparison as :func:`answer_is_top1`, for a caller that needs the full logits anyway
    (a logit difference read beside the hit): the screen would only repeat the unembedding it saves.
    """
    if logits.shape[:-1] != answer_ids.shape:
        raise InputError(f"answer_is_argmax got logits for {tuple(logits.shape[:-1])} rows but answers of shape "
                         f"{tuple(answer_ids.shape)}: pass one answer per row.")
    return logits.argmax(-1) == answer_ids.to(logits.device)


@torch.no_grad()
def top1_correct(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    answer_ids: Int[Tensor, "batch"],
    fwd_hooks: HookList = (),
    *,
    screen: Optional[bool] = None,
) -> Bool[Tensor, "batch"]:
    """Boolean per prompt: is the answer token the top-1 prediction at END? (``screen``: see :func:`end_argmax`)"""
    return answer_is_top1(model, end_residual(model, tokens, fwd_hooks), answer_ids, screen=screen)


@torch.no_grad()
def token_hits(
    model: HookedTransformer,
    prompts: Sequence[Sequence[int]],
    answers: Sequence[Sequence[int]],
    batch_size: int = 32,
    fwd_hooks: HookList = (),
    *,
    whole: bool = True,
) -> tuple[list[bool], list[bool]]:
    """Per prompt (token ids, BOS included) and its answer's token ids: is the first answer token top-1 at END, and is
    every answer token top-1 at the position before it?

    ``whole=True`` feeds the prompt and all but the last answer token (one teacher-forced pass);
    ``whole=False`` feeds the prompt alone and scores the first token only (whole then equals first).
    Rows of equal fed length are batched in their given order, ``batch_size`` at a time.
    """
    check_positive_int(batch_size, "batch_size")
    if len(prompts) != len(answers):
        raise InputError(f"token_hits got {len(prompts)} prompts but {len(answers)} answers: pass one answer per prompt.")
    if any(len(a) == 0 for a in answers):
        raise InputError("token_hits got an empty answer: every answer needs at least one token to score.")
    prompts, answers = [list(p) for p in prompts], [list(a) if whole else list(a)[:1] for a in answers]
    # teacher forcing feeds all but the last answer token
    fed = [p + a[:-1] for p, a in zip(prompts, answers)]
    by_length: dict[int, list[int]] = {}
    for i, tokens in enumerate(fed):
        by_length.setdefault(len(tokens), []).append(i)
    first, every = [False] * len(fed), [False] * len(fed)
    device = model.cfg.device
    for n_pos, indices in sorted(by_length.items()):
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            tokens = torch.tensor([fed[i] for i in chunk], device=device)
            # the positions before the first scored one that every row shares (few-shot lines) run once;
            # the prompt-only pass runs whole, as the plain END pass does
            limit = 0 if fwd_hooks or not whole else min(len(prompts[i]) for i in chunk) - 1
            resid, shared = run_after_shared_prefix(model, tokens, fwd_hooks, limit=limit)
            # every scored (row, position) of the chunk in one screened argmax
            row_index = torch.tensor([j for j, i in enumerate(chunk) for _ in answers[i]], device=device)
            positions = torch.tensor([len(prompts[i]) - 1 - shared + p for i in chunk for p in range(len(answers[i]))],
                                     device=device)
            target = torch.tensor([t for i in chunk for t in answers[i]], device=device)
            hits = answer_is_top1(model, resid[row_index, positions], target).tolist()
            at = 0
            for i in chunk:
                first[i], every[i] = hits[at], all(hits[at:at + len(answers[i])])
                at += len(answers[i])
    return first, every


def _prompts_and_answers(dataset: Dataset) -> tuple[list[list[int]], list[list[int]]]:
    rows = dataset.select_columns(["tokens", "answer_token_ids"]).to_list()
    return [r["tokens"] for r in rows], [r["answer_token_ids"] for r in rows]


@torch.no_grad()
def first_token_hits(model: HookedTransformer, dataset: Dataset, batch_size: int = 32, fwd_hooks: HookList = ()) -> list[bool]:
    """Per row of a :mod:`circuits.tasks` dataset: does ``model`` put the first answer token at top-1 at END
    (optionally under ``fwd_hooks``)?"""
    if len(dataset) == 0:
        raise TaskDataError("The dataset is empty: nothing to score.")
    return token_hits(model, *_prompts_and_answers(dataset), batch_size, fwd_hooks, whole=False)[0]


def first_token_accuracy(model: HookedTransformer, dataset: Dataset, batch_size: int = 32, fwd_hooks: HookList = ()) -> float:
    """Top-1 accuracy of the first answer token over ``dataset``."""
    hits = first_token_hits(model, dataset, batch_size, fwd_hooks)
    return sum(hits) / len(hits)


@torch.no_grad()
def score_rows(model: HookedTransformer, dataset: Dataset, scoring: str = "whole", batch_size: int = 32,
               fwd_hooks: HookList = ()) -> list[Optional[bool]]:
    """Per row: is it answered correctly under ``scoring`` (``None``: not scored, for ``"one_token"``)?"""
    _check(scoring)
    if scoring == "whole":
        return first_and_whole(model, dataset, batch_size, fwd_hooks)[1]
    first = first_token_hits(model, dataset, batch_size, fwd_hooks)
    if scoring == "first":
        return first
    return [ok if len(ids) == 1 else None for ok, ids in zip(first, dataset["answer_token_ids"])]


@torch.no_grad()
def first_and_whole(model: HookedTransformer, dataset: Dataset, batch_size: int = 32,
                    fwd_hooks: HookList = ()) -> tuple[list[bool], list[bool]]:
    """Per row, from one teacher-forced forward: is the first answer token top-1 at END, and is every answer token?

    Attention is causal, so END of the prompt followed by the answer's tokens is END of the prompt
    alone: the first answer token is scored in the same pass that scores the whole answer.
    """
    return token_hits(model, *_prompts_and_answers(dataset), batch_size, fwd_hooks, whole=True)


def scored_accuracy(model: HookedTransformer, dataset: Dataset, scoring: str = "whole", batch_size: int = 32) -> Estimate:
    """Accuracy under ``scoring`` over the rows it scores, with its Wilson interval and sample size."""
    scored = [ok for ok in score_rows(model, dataset, scoring, batch_size) if ok is not None]
    return proportion(torch.tensor(scored, dtype=torch.float64))
