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
from circuits.end_logits import unembed_end
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
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}.")
    rows = dataset.select_columns(["tokens", "answer_token_ids"]).to_list()
    out: list[Optional[bool]] = [None] * len(rows)
    # teacher forcing feeds all but the last answer token; "first" and "one_token" feed the prompt only
    feed = lambda r: r["tokens"] + (r["answer_token_ids"][:-1] if scoring == "whole" else [])
    wanted = [i for i, r in enumerate(rows) if scoring != "one_token" or len(r["answer_token_ids"]) == 1]
    by_length: dict[int, list[int]] = {}
    for i in wanted:
        by_length.setdefault(len(feed(rows[i])), []).append(i)
    device = model.cfg.device
    for n_pos, indices in sorted(by_length.items()):
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            tokens = torch.tensor([feed(rows[i]) for i in chunk], device=device)
            resid = model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks), stop_at_layer=model.cfg.n_layers)
            for j, i in enumerate(chunk):
                answer = rows[i]["answer_token_ids"] if scoring == "whole" else rows[i]["answer_token_ids"][:1]
                positions = torch.arange(len(rows[i]["tokens"]) - 1, len(rows[i]["tokens"]) - 1 + len(answer), device=device)
                predicted = unembed_end(model, resid[j, positions]).argmax(-1)
                out[i] = bool((predicted == torch.tensor(answer, device=device)).all())
    return out


def scored_accuracy(model: HookedTransformer, dataset: Dataset, scoring: str = "whole", batch_size: int = 32) -> Estimate:
    """Accuracy under ``scoring`` over the rows it scores, with its Wilson interval and sample size."""
    scored = [ok for ok in score_rows(model, dataset, scoring, batch_size) if ok is not None]
    return proportion(torch.tensor(scored, dtype=torch.float64))
