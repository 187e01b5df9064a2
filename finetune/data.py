"""Supervised fine-tuning data: (prompt, answer) pairs as token ids, arithmetic mixes, batching.

A training example is a prompt and its answer, tokenized so that
``input_ids = prompt_ids + answer_ids``. The model is trained with teacher
forcing on the whole answer: the loss is the cross-entropy of each answer
token given everything before it, and nothing else (prompt tokens carry no
loss). :func:`encode_pairs` turns arbitrary string pairs into such rows (the
merging experiment's English -> French number words use it);
:func:`arithmetic_train_set` builds them from :mod:`circuits.tasks` on
*training templates* only.

Training and evaluation templates are disjoint (:func:`split_templates`):
within every style of every operation the last template id is held out for
evaluation, the others train. Word-problem templates are part of the training
mix by default, as in the paper's SVAMP/GSM8K-style training data.
"""

from __future__ import annotations

import numbers
import random
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from datasets import Dataset, concatenate_datasets
from jaxtyping import Bool, Int
from torch import Tensor

from circuits.tasks import format_answer, format_number, sample_operands
from circuits.templates import STYLES, get_templates, resolve_operation, template_by_id
from circuits.errors import ToolkitError
from circuits.seeds import derived_seed

SFT_COLUMNS = ("input_ids", "n_prompt", "prompt", "answer")


class SFTDataError(ToolkitError, ValueError):
    """Bad fine-tuning data (empty answers, prompts that do not tokenize as a prefix, ...)."""


def _tokenizer(obj):
    return getattr(obj, "tokenizer", None) or obj


def encode_pair(tokenizer, prompt: str, answer: str) -> dict:
    """One SFT row: ``input_ids`` (prompt then answer tokens, BOS first if the tokenizer adds it) and ``n_prompt``.

    The answer's ids are taken from tokenizing ``prompt + answer`` when the
    prompt's ids are a prefix of that; otherwise (the tokenizer merges across
    the boundary) the answer is tokenized on its own and appended, which is
    what generation would have to produce after the prompt.
    """
    tok = _tokenizer(tokenizer)
    if not answer:
        raise SFTDataError(f"Empty answer for prompt {prompt!r}: there would be nothing to train on.")
    prompt_ids = list(tok(prompt, add_special_tokens=True)["input_ids"])
    full_ids = list(tok(prompt + answer, add_special_tokens=True)["input_ids"])
    if full_ids[: len(prompt_ids)] == prompt_ids and len(full_ids) > len(prompt_ids):
        answer_ids = full_ids[len(prompt_ids):]
    else:
        answer_ids = list(tok(answer, add_special_tokens=False)["input_ids"])
    if not answer_ids:
        raise SFTDataError(f"Answer {answer!r} tokenizes to nothing.")
    return {"input_ids": prompt_ids + answer_ids, "n_prompt": len(prompt_ids), "prompt": prompt, "answer": answer}


def encode_pairs(tokenizer, pairs: Iterable[tuple[str, str]]) -> Dataset:
    """A dataset of SFT rows (see :func:`encode_pair`) from ``(prompt, answer)`` string pairs.

    ``tokenizer`` is a Hugging Face tokenizer or a ``HookedTransformer``.
    """
    rows = [encode_pair(tokenizer, p, a) for p, a in pairs]
    if not rows:
        raise SFTDataError("encode_pairs got no pairs.")
    return Dataset.from_list(rows)


def from_task_dataset(task_ds: Dataset) -> Dataset:
    """SFT rows from a :func:`circuits.tasks.make_dataset` dataset (its ``tokens`` + ``answer_token_ids``)."""
    missing = {"tokens", "answer_token_ids", "prompt", "answer"} - set(task_ds.column_names)
    if missing:
        raise SFTDataError(f"Not a circuits.tasks dataset: missing columns {sorted(missing)}.")
    rows = [
        {"input_ids": list(r["tokens"]) + list(r["answer_token_ids"]), "n_prompt": len(r["tokens"]),
         "prompt": r["prompt"], "answer": r["answer"], "template_id": r.get("template_id", "")}
        for r in task_ds
    ]
    return Dataset.from_list(rows)


def split_templates(op: str, styles: Sequence[str] = STYLES, n_eval_per_style: int = 1) -> tuple[list[str], list[str]]:
    """Disjoint (train, eval) template ids for ``op``: the last ``n_eval_per_style`` of each style are eval."""
    train, held = [], []
    for style in styles:
        ids = [t.id for t in get_templates(op, (style,))]
        if len(ids) <= n_eval_per_style:
            raise SFTDataError(f"Style {style!r} of {op!r} has {len(ids)} templates; cannot hold out {n_eval_per_style}.")
        train += ids[:-n_eval_per_style]
        held += ids[-n_eval_per_style:]
    return train, held


@dataclass(frozen=True)
class ArithmeticMix:
    """A mix of arithmetic training prompts on training templates.

    ``op_weights`` (same order as ``ops``) sets each operation's share of
    ``n_examples``; ``styles`` includes word problems by default.
    """

    ops: tuple[str, ...] = ("+", "-", "*", "/")
    op_weights: tuple[float, ...] | None = None
    n_examples: int = 512
    styles: tuple[str, ...] = STYLES
    operand_range: tuple[int, int] = (0, 9)
    n_shots: int = 2
    n_eval_per_style: int = 1
    seed: int = 0


def arithmetic_pairs(
    op: str,
    template_ids: Sequence[str],
    n: int,
    *,
    operand_range: tuple[int, int] = (0, 9),
    decimals: int = 0,
    n_shots: int = 2,
    seed: int = 0,
) -> list[dict]:
    """``n`` arithmetic (prompt, answer, template_id, query) dicts, cycling through ``template_ids``, seeded.

    ``query`` is the asked line (the filled template after the shots); it is
    what :func:`finetune.evaluate.validation_suite` keeps apart from the test set.

    Unlike :func:`circuits.tasks.make_dataset` no counterfactual twin is built:
    fine-tuning needs none, and some templates (e.g. multiplication word
    problems on gemma) have no same-length twin.
    """
    symbol = resolve_operation(op).symbol
    templates = [template_by_id(t) for t in template_ids]
    if not templates:
        raise SFTDataError("arithmetic_pairs needs at least one template id.")
    wrong = [t.id for t in templates if t.op != symbol]
    if wrong:
        raise SFTDataError(f"Templates {wrong} are not for operation {symbol!r}.")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        template = templates[i % len(templates)]
        lines = []
        for _ in range(n_shots + 1):
            a, b = sample_operands(rng, symbol, operand_range, decimals)
            lines.append((template.fill(format_number(a, decimals), format_number(b, decimals)),
                          format_answer(symbol, a, b, decimals)))
        prefix = "".join(prompt + answer + "\n" for prompt, answer in lines[:-1])
        out.append({"prompt": prefix + lines[-1][0], "answer": lines[-1][1], "template_id": template.id,
                    "query": lines[-1][0]})
    return out


def arithmetic_rows(tokenizer, op: str, template_ids: Sequence[str], n: int, **kwargs) -> Dataset:
    """SFT rows (with ``template_id`` and ``query``) of :func:`arithmetic_pairs`."""
    items = arithmetic_pairs(op, template_ids, n, **kwargs)
    return rows_from_pairs(tokenizer, items)


def rows_from_pairs(tokenizer, items: Sequence[dict]) -> Dataset:
    """SFT rows of :func:`arithmetic_pairs` items, keeping their ``template_id`` and ``query``."""
    rows = [{**encode_pair(tokenizer, it["prompt"], it["answer"]), "template_id": it["template_id"],
             "query": it["query"]} for it in items]
    return Dataset.from_list(rows)


def arithmetic_train_set(tokenizer, mix: ArithmeticMix = ArithmeticMix()) -> Dataset:
    """SFT rows for ``mix`` on training templates only, shuffled (seeded)."""
    weights = mix.op_weights or (1.0,) * len(mix.ops)
    if len(weights) != len(mix.ops) or min(weights) < 0 or sum(weights) <= 0:
        raise SFTDataError(f"op_weights {mix.op_weights} must be non-negative, one per op in {mix.ops}.")
    counts = [int(round(mix.n_examples * w / sum(weights))) for w in weights]
    parts = []
    for i, (op, n) in enumerate(zip(mix.ops, counts)):
        if n == 0:
            continue
        train_ids, _ = split_templates(op, mix.styles, mix.n_eval_per_style)
        parts.append(arithmetic_rows(tokenizer, op, train_ids, n, operand_range=mix.operand_range,
                                     n_shots=mix.n_shots, seed=derived_seed(mix.seed, "training operation", i)))
    if not parts:
        raise SFTDataError("The mix produced no examples (n_examples too small for the weights?).")
    return concatenate_datasets(parts).shuffle(seed=mix.seed)


def check_token_rows(rows: Sequence[dict], vocab_size: int, what: str = "train_dataset") -> None:
    """Every row's ``input_ids`` must be whole-number token ids in ``0..vocab_size - 1``.

    Floats would be truncated silently by ``torch.tensor(..., dtype=long)`` and an id past the vocabulary
    is an ``IndexError`` deep in the embedding; both are refused here, naming the row.
    """
    for i, row in enumerate(rows):
        ids = row["input_ids"]
        wrong = [t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
        if wrong:
            raise SFTDataError(f"{what} row {i}: input_ids hold {wrong[:3]!r} ({type(wrong[0]).__name__}); token ids "
                               "are whole numbers: encode the rows with finetune.data.encode_pairs.")
        outside = [int(t) for t in ids if not 0 <= t < vocab_size]
        if outside:
            raise SFTDataError(f"{what} row {i}: input_ids hold {outside[:3]} outside the model's vocabulary "
                               f"0..{vocab_size - 1}: the rows were tokenized for another model; encode them with "
                               "this model's tokenizer.")


def _check_answer_split(i: int, row: dict) -> None:
    if not 0 < row["n_prompt"] < len(row["input_ids"]):
        raise SFTDataError(f"Row {i}: n_prompt={row['n_prompt']} leaves no answer in {len(row['input_ids'])} tokens.")


def prompts_and_answers(rows: Sequence[dict]) -> tuple[list[list[int]], list[list[int]]]:
    """Each SFT row's prompt token ids (``input_ids[:n_prompt]``) and answer token ids (the rest)."""
    for i, r in enumerate(rows):
        _check_answer_split(i, r)
    return [list(r["input_ids"][:r["n_prompt"]]) for r in rows], [list(r["input_ids"][r["n_prompt"]:]) for r in rows]


def collate(
    rows: Sequence[dict], pad_id: int, device: str | torch.device = "cpu"
) -> tuple[Int[Tensor, "batch pos"], Bool[Tensor, "batch pos"]]:
    """Right-padded inputs and the mask of positions whose *next* token is an answer token.

    The input drops each row's last token (it is only ever a target). Right
    padding is safe without an attention mask: attention is causal, so real
    positions never see the pads that follow them.
    """
    if not rows:
        raise SFTDataError("collate got an empty batch.")
    lengths = [len(r["input_ids"]) - 1 for r in rows]
    width = max(lengths)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    predicts_answer = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids = r["input_ids"]
        _check_answer_split(i, r)
        tokens[i, : lengths[i]] = torch.tensor(ids[:-1])
        predicts_answer[i, r["n_prompt"] - 1 : lengths[i]] = True
    return tokens.to(device), predicts_answer.to(device)


def targets(rows: Sequence[dict], predicts_answer: Bool[Tensor, "batch pos"]) -> Int[Tensor, "n_answer_tokens"]:
    """The answer token ids in the order ``predicts_answer.nonzero()`` visits them (row-major)."""
    out = []
    for r in rows:
        out += list(r["input_ids"][r["n_prompt"]:])
    flat = torch.tensor(out, dtype=torch.long)
    if flat.numel() != int(predicts_answer.sum()):
        raise SFTDataError("Answer token count does not match the loss mask.")
    return flat.to(predicts_answer.device)


def epoch_order(n: int, epoch: int, seed: int) -> list[int]:
    """The (seeded, per-epoch) order in which examples are visited; a pure function of its arguments."""
    order = list(range(n))
    random.Random(derived_seed(seed, "epoch order", epoch)).shuffle(order)
    return order
