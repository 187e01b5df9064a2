"""The metrics of tasks beyond one answer token, as :class:`patching.sweeps.metrics.PatchMetric` s.

Every patching and edge method scores a run by ``fn(logits_at_END, answer_ids, alt_ids) -> [batch]``
(:mod:`patching.sweeps.metrics`). A :class:`circuits.pair_tasks.PairTask` names its metric;
:func:`task_metric` turns the name into that function, so EAP / EAP-IG attribution
(:func:`patching.edges.edge_attribution`), circuit evaluation and the faithfulness curve
(``SweepOptions(metric=...)``) score the task by it:

* ``"logit_diff"``: logit(answer) − logit(distractor) (IOI's metric; ``alt_ids`` from the rows'
  ``alt_token_id`` column, which :func:`patching.sweeps.inputs.prompt_groups` reads from a Dataset);
* ``"logit"``: the answer's logit;
* ``"prob_diff"`` (:func:`prob_diff_metric`): over candidate tokens in a fixed order (years ``00``..``99``,
  or the digits ``0``..``9``) and a per-row threshold (the row's answer id),
  Σ p(candidates after the threshold) − Σ p(candidates up to and including it), with p the softmax over
  the whole vocabulary: greater-than's P(year > YY) − P(year ≤ YY) (Hanna et al. 2023);
* ``"kl"`` (:func:`kl_metric`): −KL(p_full ‖ p_run) at END, so larger is better as for the others and the
  full model scores 0. It needs the full model's END distribution of each row: :func:`kl_metric`
  computes it and returns rows whose ``answer_token_ids`` are each row's index into it (the metric's
  ``answer_ids`` then name rows, not tokens). EAP (the gradient at the clean run) is zero under it: the KL is
  minimal there; EAP-IG's path and circuit evaluation are not.
"""

from __future__ import annotations

import torch
from datasets import Dataset
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.pair_tasks import PairTask
from circuits.tasks import iter_batches
from patching.sweeps.metrics import PatchMetric, get_metric


def prob_diff_metric(ordered_ids, name: str = "prob_diff") -> PatchMetric:
    """Σ p(ordered_ids after the row's answer id) − Σ p(the ones up to and including it) (module docstring)."""
    ordered = torch.as_tensor(list(ordered_ids), dtype=torch.long)
    if ordered.ndim != 1 or len(ordered) < 2 or len(set(ordered.tolist())) != len(ordered):
        raise InputError(f"prob_diff needs at least two distinct candidate token ids in order, got {ordered.tolist()}.")

    def prob_diff(logits: Tensor, answer_ids: Tensor, alt_ids=None) -> Tensor:
        cand = ordered.to(logits.device)
        match = cand[None, :] == answer_ids[:, None]
        if not bool(match.any(-1).all()):
            raise InputError(f"Metric {name!r}: an answer id is not among the ordered candidates; each row's answer "
                             "id is its threshold and must be one of them.")
        threshold = match.float().argmax(-1)
        probs = logits.float().softmax(-1)[:, cand]
        above = torch.arange(len(cand), device=logits.device)[None, :] > threshold[:, None]
        return (probs * above).sum(-1) - (probs * ~above).sum(-1)

    return PatchMetric(name, prob_diff, full_vocab=True)


def kl_metric(model: HookedTransformer, rows: Dataset, batch_size: int = 32) -> tuple[PatchMetric, Dataset]:
    """−KL(p_full ‖ p_run) at END, and ``rows`` with each ``answer_token_ids`` its row index (module docstring)."""
    if len(rows) >= model.cfg.d_vocab_out:
        raise InputError(f"The kl metric indexes rows by answer id: use fewer than {model.cfg.d_vocab_out} rows.")
    full = full_logprobs(model, rows, batch_size)

    def kl(logits: Tensor, answer_ids: Tensor, alt_ids=None) -> Tensor:
        reference = full.to(logits.device)[answer_ids]
        return -(reference.exp() * (reference - logits.float().log_softmax(-1))).sum(-1)

    keyed = rows.remove_columns("answer_token_ids").add_column("answer_token_ids", [[i] for i in range(len(rows))])
    return PatchMetric("kl", kl, full_vocab=True), keyed


@torch.no_grad()
def full_logprobs(model: HookedTransformer, rows: Dataset, batch_size: int = 32) -> Float[Tensor, "row d_vocab"]:
    """The model's END log-probabilities of every row (in row order)."""
    out = torch.empty(len(rows), model.cfg.d_vocab_out)
    for batch in iter_batches(rows, batch_size, device=model.cfg.device):
        out[torch.as_tensor(batch.indices)] = model(batch.tokens)[:, -1].float().log_softmax(-1).cpu()
    return out


def task_metric(task: PairTask, model: HookedTransformer | None = None) -> tuple[PatchMetric, Dataset]:
    """The metric ``task`` names and the rows to score with it (re-keyed for ``"kl"``, which needs ``model``)."""
    if task.metric == "prob_diff":
        return prob_diff_metric(task.ordered_ids), task.rows
    if task.metric == "kl":
        if model is None:
            raise InputError("The kl metric compares with the full model's END distribution: pass the model.")
        return kl_metric(model, task.rows)
    return get_metric(task.metric), task.rows


@torch.no_grad()
def row_metric(model: HookedTransformer, rows: Dataset, metric: PatchMetric, batch_size: int = 32) -> Tensor:
    """The full model's metric of every row (in row order; alt ids from the rows' ``alt_token_id`` column)."""
    out = torch.empty(len(rows))
    alts = torch.as_tensor(rows["alt_token_id"]) if "alt_token_id" in rows.column_names else None
    for batch in iter_batches(rows, batch_size, device=model.cfg.device):
        index = torch.as_tensor(batch.indices)
        alt = None if alts is None else alts[index].to(model.cfg.device)
        out[index] = metric.fn(model(batch.tokens)[:, -1], batch.answer_ids, alt).float().cpu()
    return out


def keep_solved(model: HookedTransformer, task: PairTask, batch_size: int = 32) -> tuple[PairTask, float]:
    """The rows the full model solves and their share: metric > 0 (logit_diff, prob_diff), the answer top-1
    (logit); every row for kl. As :func:`circuits.tasks.filter_correct`, before any intervention."""
    if task.metric == "kl":
        return task, 1.0
    if task.metric == "logit":
        from circuits.tasks import filter_correct

        kept, share = filter_correct(model, task.rows, batch_size)
        return PairTask(task.name, kept, task.metric, task.ordered_ids, task.description), share
    metric, rows = task_metric(task, model)
    solved = row_metric(model, rows, metric, batch_size) > 0
    if not bool(solved.any()):
        raise InputError(f"The model solves none of the {len(rows)} rows of task {task.name!r} ({task.metric} > 0 "
                         "nowhere), so no circuit can be measured; check the answers, or use a stronger model.")
    kept = rows.select([i for i, ok in enumerate(solved.tolist()) if ok])
    return PairTask(task.name, kept, task.metric, task.ordered_ids, task.description), float(solved.float().mean())


@torch.no_grad()
def two_digit_prob_diff(model: HookedTransformer, rows: Dataset, ordered_ids) -> Tensor:
    """Greater-than's P(year > YY) − P(year ≤ YY) by the chain rule over two digit tokens, per row (rows of
    :func:`circuits.classic_tasks.make_greater_than` on a digit-splitting tokenizer: their ``year`` column is YY).

    p(year 10·d + e) = p(d) · p(e | d): one forward for the first digit and one per first digit with it appended
    (11 per row). What the one-forward ``prob_diff`` metric approximates (exact where YY ends in 9); the
    probability the model puts on a non-digit second token counts for no year.
    """
    digits = torch.as_tensor(list(ordered_ids), dtype=torch.long)
    if len(digits) != 10 or "year" not in rows.column_names:
        raise InputError("two_digit_prob_diff needs the ten digit tokens in order and rows with a 'year' column "
                         "(circuits.classic_tasks.make_greater_than on a tokenizer that splits digits).")
    years = torch.arange(100).view(10, 10)  # [first digit, second digit]
    out = torch.empty(len(rows))
    for i, row in enumerate(rows.select_columns(["tokens", "year"]).to_list()):
        tokens = torch.tensor(row["tokens"], device=model.cfg.device)
        extended = torch.cat([tokens.expand(10, -1), digits.to(tokens.device)[:, None]], dim=1)
        logits = model(extended)
        first = logits[0, -2].float().softmax(-1)[digits.to(logits.device)].cpu()
        second = logits[:, -1].float().softmax(-1)[:, digits.to(logits.device)].cpu()
        joint = first[:, None] * second
        above = years > row["year"]
        out[i] = joint[above].sum() - joint[~above].sum()
    return out


def solved_rows(model: HookedTransformer, task_name: str, *, n_prompts: int, seed: int,
                batch_size: int = 32) -> tuple[Dataset, PatchMetric, float, dict]:
    """``--task``'s rows (generated, or read from a pair file: :func:`circuits.classic_tasks.make_task`) that the
    model solves (:func:`keep_solved`), the metric that scores them (:func:`task_metric`), the solved share, and
    the task's results.json record (with ``n_solved``)."""
    from circuits.classic_tasks import make_task

    task = make_task(model, task_name, n_prompts=n_prompts, seed=seed)
    kept, share = keep_solved(model, task, batch_size)
    metric, rows = task_metric(kept, model)
    return rows, metric, share, task.to_dict() | {"n_solved": len(kept.rows)}
