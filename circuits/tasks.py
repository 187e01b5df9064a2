"""Arithmetic prompt data: reference prompts, counterfactual twins, answers and token positions.

:func:`make_dataset` samples two-operand prompts from :mod:`circuits.templates`,
fills each template with operands, and pairs it with a *counterfactual twin*:
the same prompt with the operator word or symbol replaced by an irrelevant word
of the same token length ("7 + 5 = " -> "7 # 5 = "), as in Zhang et al. (2024)
§3. Path patching compares a model's run on the reference with its run on the
twin, so the twin must tokenize to exactly as many tokens: this is checked, and
the next irrelevant word is tried when it does not. Which operators a twin
replaces (``corrupt``) and in which order replacements are tried are the rules
of :mod:`circuits.counterfactuals`.

Each row records the answer (the first answer token is what the metrics score;
the full answer's token ids allow teacher-forced scoring), and the token
positions of the first operand ``a``, the second operand ``b``, the operator
``op`` and ``end`` (the last prompt token, where the answer is predicted). With
a few-shot prefix the positions refer to the final, queried problem, and
``query_start`` is its first token (positions 1..query_start-1 are the shots).

:func:`iter_batches` groups rows of equal token length into tensors ready for
patching, with boolean role masks ``a``, ``b``, ``op``, ``bos``, ``shots`` and
``end`` per prompt; :func:`filter_correct` keeps the prompts a model answers correctly,
as the paper does before any intervention.
"""

from __future__ import annotations

import logging
import numbers
import random
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Iterator, Sequence

import torch
from datasets import Dataset
from jaxtyping import Bool, Int
from torch import Tensor
from tqdm.auto import tqdm

from circuits.arguments import check_finite_weights, check_nonnegative_int, check_positive_int
from circuits.counterfactuals import Corrupt, check_corrupt, twin_candidates
from circuits.errors import InputError, TaskDataError
from circuits.templates import Template, get_templates, resolve_operation, template_by_id

logger = logging.getLogger(__name__)

ROLES = ("a", "b", "op")


@dataclass(frozen=True)
class TaskConfig:
    """What to sample. ``operand_range`` is inclusive; ``decimals`` > 0 makes decimal operands."""

    op: str = "+"
    n_prompts: int = 200
    styles: tuple[str, ...] = ("equation", "statement", "question")
    template_ids: tuple[str, ...] | None = None
    operand_range: tuple[int, int] = (0, 9)
    decimals: int = 0
    n_shots: int = 3
    allow_negative: bool = False
    seed: int = 0
    corrupt: Corrupt = "query"

    def __post_init__(self) -> None:
        # Checked here: these would otherwise surface as errors from `random` or a ZeroDivisionError.
        check_positive_int(self.n_prompts, "n_prompts")
        check_nonnegative_int(self.decimals, "decimals")
        check_nonnegative_int(self.n_shots, "n_shots")
        if self.template_ids is None and not self.styles:
            raise InputError("styles is empty: name at least one style (e.g. 'equation') or pass template_ids.")
        if self.template_ids is not None and not self.template_ids:
            raise InputError("template_ids is empty: name at least one template, or pass None to use styles.")
        check_operand_range(self.operand_range)


def check_operand_range(operand_range) -> tuple[int, int]:
    """``(lo, hi)``: two integers with ``lo <= hi`` (both inclusive)."""
    try:
        lo, hi = operand_range
    except (TypeError, ValueError) as err:
        raise InputError(f"operand_range must be (lo, hi), got {operand_range!r}.") from err
    if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in (lo, hi)) or lo > hi:
        raise InputError(f"operand_range must be two integers (lo, hi) with lo <= hi, got {operand_range!r}.")
    return int(lo), int(hi)


# ---------------------------------------------------------------------------- operands


def format_number(value: Fraction, decimals: int = 0) -> str:
    """``value`` as prompt text: an integer, or at most ``decimals`` decimal places without trailing zeros."""
    if decimals == 0:
        return str(int(value))
    return f"{float(value):.{decimals}f}".rstrip("0").rstrip(".")


def format_answer(op: str, a: Fraction, b: Fraction, decimals: int = 0) -> str:
    """The answer string of ``a op b``; raises when an integer answer is required but not exact."""
    operation = resolve_operation(op)
    if operation.symbol == "/" and b == 0:
        raise TaskDataError(f"Division by zero in {a} / {b}: use a divisor range that excludes 0.")
    value = operation.compute(a, b)
    if decimals == 0 and value.denominator != 1:
        raise TaskDataError(
            f"{a} {operation.symbol} {b} = {value} is not an integer; integer answers are required "
            f"(choose operands that divide exactly, or set decimals > 0)."
        )
    if decimals > 0:
        value = Fraction(round(value * 10**decimals), 10**decimals)
    return format_number(value, decimals)


def sample_operands(
    rng: random.Random, op: str, operand_range: tuple[int, int] = (0, 9), decimals: int = 0, allow_negative: bool = False
) -> tuple[Fraction, Fraction]:
    """One operand pair in ``operand_range`` (inclusive): exact divisions for integer "/", and
    ``a >= b`` for "-" unless ``allow_negative``."""
    lo, hi = operand_range
    scale = 10**decimals
    op = resolve_operation(op).symbol

    def draw(low: int) -> Fraction:
        return Fraction(rng.randint(low * scale, hi * scale), scale)

    if op == "/" and decimals == 0:
        # Build exact divisions: pick the divisor and the quotient, so a = b * q stays in range.
        pairs = [(b * q, b) for b in range(max(lo, 1), hi + 1) for q in range(lo, hi + 1) if lo <= b * q <= hi]
        if not pairs:
            raise TaskDataError(f"No exact divisions with both operands in {operand_range}.")
        a, b = rng.choice(pairs)
        return Fraction(a), Fraction(b)
    a, b = draw(lo), draw(max(lo, 1) if op == "/" else lo)
    if op == "-" and not allow_negative and a < b:
        a, b = b, a
    return a, b


def _sample_operands(rng: random.Random, config: TaskConfig) -> tuple[Fraction, Fraction]:
    return sample_operands(rng, config.op, config.operand_range, config.decimals, config.allow_negative)


# ---------------------------------------------------------------------------- tokenization


def _token_positions(offsets: Sequence[tuple[int, int]], span: tuple[int, int]) -> list[int]:
    """Indices of the tokens whose character range overlaps ``span`` (special tokens have empty ranges)."""
    start, end = span
    return [i for i, (s, e) in enumerate(offsets) if e > s and s < end and e > start]


def _encode(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    encoding = tokenizer(text, return_offsets_mapping=True, add_special_tokens=True)
    return list(encoding["input_ids"]), [tuple(o) for o in encoding["offset_mapping"]]


def _query_start(offsets, prefix_chars: int) -> int:
    """Position of the queried problem's first token: the first after BOS that starts past the few-shot prefix."""
    for i, (start, end) in enumerate(offsets):
        if i > 0 and start >= prefix_chars and end > start:
            return i
    return len(offsets) - 1


def _check_operand_tokens(text: str, offsets, span, role: str, template: Template) -> list[int]:
    """Token positions of an operand; error if a token mixes the operand with other characters."""
    positions = _token_positions(offsets, span)
    for i in positions:
        s, e = offsets[i]
        outside = text[s:span[0]] + text[span[1]:e]
        if outside.strip():
            raise TaskDataError(
                f"Operand {role!r} in {text!r} (template {template.id!r}) shares token "
                f"{text[s:e]!r} with neighbouring characters {outside!r}; the templates assume operands "
                f"tokenize on their own. Put a space or punctuation around {{A}}/{{B}} for this tokenizer."
            )
    return positions


def _answer_tokens(tokenizer, prompt: str, prompt_ids: list[int], answer: str) -> list[int]:
    full_ids, _ = _encode(tokenizer, prompt + answer)
    if full_ids[: len(prompt_ids)] != prompt_ids:
        i = next((k for k, (x, y) in enumerate(zip(prompt_ids, full_ids)) if x != y), len(prompt_ids) - 1)
        old, new = tokenizer.decode(prompt_ids[i:]), tokenizer.decode(full_ids[i:i + 1])
        if answer.startswith("-") and new.endswith("-"):
            raise TaskDataError(
                f"The negative answer {answer!r} cannot be scored after {prompt[-40:]!r}: this tokenizer merges the "
                f"prompt's last token {old!r} with the answer's minus sign into {new!r}, so the prompt's own tokens "
                f"change and the first answer token would be the sign. Use allow_negative=False (answers >= 0) "
                f"for this tokenizer."
            )
        raise TaskDataError(
            f"Appending the answer {answer!r} to {prompt[-40:]!r} changes the prompt's tokens: this tokenizer merges "
            f"the prompt's last token {old!r} with the start of the answer into {new!r}. Use templates whose prompt "
            f"ends in a token the answer does not merge with (e.g. without a trailing space) for it."
        )
    answer_ids = full_ids[len(prompt_ids):]
    first = tokenizer.decode(answer_ids[:1]).strip()
    if not first or not answer.startswith(first):
        raise TaskDataError(
            f"The first answer token of {prompt!r} + {answer!r} is {first!r}, not the start of the answer; "
            f"the metrics score the first answer token, so it must carry the answer's first character."
        )
    return answer_ids


def answer_token_ids(tokenizer, prompt: str, answer: str) -> list[int]:
    """The token ids of ``answer`` written after ``prompt`` (checked as in :func:`make_row`: the prompt's own tokens stay)."""
    ids, _ = _encode(tokenizer, prompt)
    return _answer_tokens(tokenizer, prompt, ids, answer)


def _counterfactual(tokenizer, template: Template, a: str, b: str, prefix: str, n_tokens: int, corrupt: Corrupt = "query"):
    """The first twin (:func:`circuits.counterfactuals.twin_candidates`) with ``n_tokens`` tokens and its ids, or None."""
    for text in twin_candidates(template, a, b, prefix, corrupt):
        ids, _ = _encode(tokenizer, text)
        if len(ids) == n_tokens:
            return text, ids
    return None


def _few_shot_prefix(rng: random.Random, template: Template, config: TaskConfig) -> str:
    lines = []
    for _ in range(config.n_shots):
        a, b = _sample_operands(rng, config)
        sa, sb = format_number(a, config.decimals), format_number(b, config.decimals)
        lines.append(template.fill(sa, sb) + format_answer(template.op, a, b, config.decimals))
    return "".join(line + "\n" for line in lines)


# ---------------------------------------------------------------------------- datasets


def _select_templates(config: TaskConfig) -> list[Template]:
    op = resolve_operation(config.op).symbol
    if config.template_ids is not None:
        templates = [template_by_id(t) for t in config.template_ids]
        wrong = [t.id for t in templates if t.op != op]
        if wrong:
            raise TaskDataError(f"Templates {wrong} are not for operation {op!r}.")
        return templates
    return get_templates(op, config.styles)


def make_row(tokenizer, template: Template, a: Fraction, b: Fraction, *, prefix: str = "", decimals: int = 0,
             corrupt: Corrupt = "query") -> dict:
    """One dataset row for ``template`` filled with ``a`` and ``b`` (see the module docstring).

    ``corrupt`` chooses the counterfactual twin: ``"query"`` replaces the queried line's operator,
    ``"all"`` every operator in the prompt (the few-shot lines' too).
    """
    check_corrupt(corrupt)
    sa, sb = format_number(a, decimals), format_number(b, decimals)
    answer = format_answer(template.op, a, b, decimals)
    prompt = prefix + template.fill(sa, sb)
    ids, offsets = _encode(tokenizer, prompt)
    spans = {role: (s + len(prefix), e + len(prefix)) for role, (s, e) in template.spans(sa, sb).items()}
    positions = {
        "a": _check_operand_tokens(prompt, offsets, spans["a"], "a", template),
        "b": _check_operand_tokens(prompt, offsets, spans["b"], "b", template),
        "op": _token_positions(offsets, spans["op"]),
    }
    counterfactual = _counterfactual(tokenizer, template, sa, sb, prefix, len(ids), corrupt)
    if counterfactual is None:
        raise TaskDataError(
            f"No irrelevant operator replacement keeps {prompt!r} at {len(ids)} tokens; "
            f"add a word to circuits.templates.COUNTERFACTUAL_WORDS for this tokenizer."
        )
    cf_prompt, cf_ids = counterfactual
    return {
        "prompt": prompt,
        "counterfactual": cf_prompt,
        "a": sa,
        "b": sb,
        "op": template.op,
        "answer": answer,
        "answer_token_ids": _answer_tokens(tokenizer, prompt, ids, answer),
        "tokens": ids,
        "cf_tokens": cf_ids,
        "a_pos": positions["a"],
        "b_pos": positions["b"],
        "op_pos": positions["op"],
        "query_start": _query_start(offsets, len(prefix)),
        "end_pos": len(ids) - 1,
        "template_id": template.id,
        "style": template.style,
        "n_shots": prefix.count("\n"),
        "corrupt": corrupt,
    }


def make_dataset(tokenizer, config: TaskConfig = TaskConfig(), **overrides) -> Dataset:
    """Sample ``config.n_prompts`` prompts with counterfactual twins (keyword overrides replace config fields).

    ``tokenizer`` is a Hugging Face tokenizer or a ``HookedTransformer`` (its tokenizer is used).
    Sampling is seeded: the same config gives the same dataset. Operand pairs are drawn without
    repetition per template while fresh pairs remain. The few-shot prefix (``n_shots`` solved
    problems in the same template) is fixed per template, so a template's prompts align.
    """
    config = replace(config, **overrides)
    tokenizer = getattr(tokenizer, "tokenizer", None) or tokenizer
    if not getattr(tokenizer, "is_fast", False):
        raise TaskDataError("A fast tokenizer (with offset mappings) is required to locate operands.")
    templates = _select_templates(config)
    rng = random.Random(config.seed)
    # One fixed few-shot prefix per template: prompts of a template then share their token
    # positions (one batch per template for one-digit operands, aligned positions for CAMA).
    prefixes = {t.id: _few_shot_prefix(random.Random(f"{config.seed}/{t.id}"), t, config) for t in templates}
    rows, seen = [], set()
    for i in tqdm(range(config.n_prompts), desc=f"building {resolve_operation(config.op).name} prompts",
                  disable=config.n_prompts < 500, leave=False):
        template = templates[i % len(templates)]
        for _ in range(20):  # prefer unseen (template, a, b) triples
            a, b = _sample_operands(rng, config)
            if (template.id, a, b) not in seen:
                break
        seen.add((template.id, a, b))
        prefix = prefixes[template.id]
        rows.append(make_row(tokenizer, template, a, b, prefix=prefix, decimals=config.decimals, corrupt=config.corrupt))
    return Dataset.from_list(rows)


def operand_pairs(op: str, operand_range: tuple[int, int] = (0, 9), allow_negative: bool = False) -> list[tuple[int, int]]:
    """Every integer operand pair of ``op`` in ``operand_range`` that :func:`circuits.tasks.sample_operands` can draw:
    ``a >= b`` for "-" unless ``allow_negative``, exact divisions by a non-zero divisor for "/"."""
    lo, hi = check_operand_range(operand_range)
    symbol = resolve_operation(op).symbol
    pairs = []
    for a in range(lo, hi + 1):
        for b in range(lo, hi + 1):
            if symbol == "-" and not allow_negative and a < b:
                continue
            if symbol == "/" and (b == 0 or a % b):
                continue
            pairs.append((a, b))
    if not pairs:
        raise TaskDataError(f"No {resolve_operation(op).name} operand pairs in {operand_range}.")
    return pairs


def every_problem(tokenizer, config: TaskConfig = TaskConfig(), shot_draw: int = 0) -> Dataset:
    """One prompt per (template, a, b) of ``config``'s templates and operand range, with few-shot prefix draw
    ``shot_draw`` (0: the prefix :func:`circuits.tasks.make_dataset` gives the same seed). ``config.n_prompts`` is
    not used: every problem is there once. Integer operands only (``decimals`` 0)."""
    if config.decimals:
        raise InputError(f"every_problem enumerates integer operands; got decimals={config.decimals}. Sample decimal "
                         "problems with circuits.tasks.make_dataset instead.")
    if shot_draw < 0:
        raise InputError(f"shot_draw must be >= 0, got {shot_draw}.")
    tokenizer = getattr(tokenizer, "tokenizer", None) or tokenizer
    rows = []
    for template in _select_templates(config):
        key = f"{config.seed}/{template.id}" if shot_draw == 0 else f"{config.seed}/{shot_draw}/{template.id}"
        prefix = _few_shot_prefix(random.Random(key), template, config)
        for a, b in operand_pairs(config.op, config.operand_range, config.allow_negative):
            row = make_row(tokenizer, template, Fraction(a), Fraction(b), prefix=prefix, corrupt=config.corrupt)
            rows.append(row | {"shot_draw": shot_draw})
    return Dataset.from_list(rows)


def transfer_datasets(tokenizer, op: str = "+", n_prompts: int = 100, seed: int = 0, n_shots: int = 3) -> dict[str, Dataset]:
    """Formats for testing whether key heads transfer (paper §5.1, Figure 4).

    ``multi_digit`` (two-digit operands), ``decimal`` (one decimal place), ``word_problem``
    (SVAMP-style sentences with names and objects), and ``zero_shot`` (no few-shot prefix).
    """
    base = TaskConfig(op=op, n_prompts=n_prompts, seed=seed, n_shots=n_shots)
    # Two-digit division operands: a = b * q with b, q small keeps answers short.
    multi_range = (10, 99) if resolve_operation(op).symbol != "/" else (2, 99)
    return {
        "multi_digit": make_dataset(tokenizer, base, operand_range=multi_range),
        "decimal": make_dataset(tokenizer, base, decimals=1, operand_range=(0, 9), styles=("equation",)),
        "word_problem": make_dataset(tokenizer, base, styles=("word_problem",), operand_range=(1, 9)),
        "zero_shot": make_dataset(tokenizer, base, n_shots=0),
    }


# ---------------------------------------------------------------------------- batches


@dataclass
class TaskBatch:
    """Prompts of equal token length as tensors; ``end`` is the answer-predicting position."""

    tokens: Int[Tensor, "batch pos"]
    cf_tokens: Int[Tensor, "batch pos"]
    answer_ids: Int[Tensor, "batch"]
    role_masks: dict[str, Bool[Tensor, "batch pos"]]
    indices: list[int]
    prompts: list[str] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.tokens.shape[1] - 1

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def to(self, device) -> "TaskBatch":
        return TaskBatch(
            self.tokens.to(device), self.cf_tokens.to(device), self.answer_ids.to(device),
            {k: v.to(device) for k, v in self.role_masks.items()}, self.indices, self.prompts,
        )


def _role_mask(rows: list[dict], key: str, n_pos: int) -> Bool[Tensor, "batch pos"]:
    mask = torch.zeros(len(rows), n_pos, dtype=torch.bool)
    for i, row in enumerate(rows):
        mask[i, row[key]] = True
    return mask


def iter_batches(dataset: Dataset, batch_size: int = 32, device: str | torch.device | None = None) -> Iterator[TaskBatch]:
    """Batches of rows with equal token length (rows of one length stay in dataset order)."""
    if len(dataset) == 0:
        raise TaskDataError("The dataset is empty: nothing to batch.")
    check_positive_int(batch_size, "batch_size")
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(dataset["end_pos"]):
        by_length.setdefault(n + 1, []).append(i)
    columns = ["tokens", "cf_tokens", "answer_token_ids", "prompt", "a_pos", "b_pos", "op_pos"]
    columns += [c for c in ("query_start",) if c in dataset.column_names]  # datasets built before it lack it
    all_rows = dataset.select_columns(columns).to_list()
    for n_pos, indices in sorted(by_length.items()):
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            rows = [all_rows[i] for i in chunk]
            masks = {role: _role_mask(rows, f"{role}_pos", n_pos) for role in ROLES}
            masks["bos"] = torch.zeros(len(rows), n_pos, dtype=torch.bool)
            masks["bos"][:, 0] = True
            masks["shots"] = torch.zeros(len(rows), n_pos, dtype=torch.bool)
            for j, r in enumerate(rows):
                masks["shots"][j, 1:r.get("query_start", 1)] = True
            masks["end"] = torch.zeros(len(rows), n_pos, dtype=torch.bool)
            masks["end"][:, -1] = True
            batch = TaskBatch(
                tokens=torch.tensor([r["tokens"] for r in rows]),
                cf_tokens=torch.tensor([r["cf_tokens"] for r in rows]),
                answer_ids=torch.tensor([r["answer_token_ids"][0] for r in rows]),
                role_masks=masks,
                indices=chunk,
                prompts=[r["prompt"] for r in rows],
            )
            yield batch.to(device) if device is not None else batch


def single_batch(dataset: Dataset, device: str | torch.device | None = None) -> TaskBatch:
    """All rows as one batch; an error names the lengths when rows differ in token length."""
    lengths = sorted(set(n + 1 for n in dataset["end_pos"]))
    if len(lengths) != 1:
        raise TaskDataError(
            f"Rows have different token lengths {lengths}; use iter_batches() or restrict the dataset to one template."
        )
    return next(iter_batches(dataset, batch_size=len(dataset), device=device))


# ---------------------------------------------------------------------------- filtering


def filter_correct(model, dataset: Dataset, batch_size: int = 32, mask: Sequence[bool] | None = None) -> tuple[Dataset, float]:
    """Keep the rows the model answers correctly (top-1 first answer token); return them and the base accuracy.

    ``mask`` (from :func:`circuits.answer_scoring.first_token_hits`) skips the forward passes when it was computed already.
    """
    if len(dataset) == 0:
        raise TaskDataError("filter_correct got an empty dataset.")
    check_finite_weights(model)  # NaN weights answer nothing, which would read as "cannot do the task"
    if mask is None:
        from circuits.answer_scoring import first_token_hits  # scoring needs TransformerLens; the data does not

        mask = first_token_hits(model, dataset, batch_size)
    elif len(mask) != len(dataset):
        raise TaskDataError(f"mask has {len(mask)} entries for {len(dataset)} rows.")
    base_accuracy = sum(mask) / len(mask)
    kept = dataset.select([i for i, ok in enumerate(mask) if ok])
    logger.info("base accuracy %.1f%% (%d of %d prompts kept)", 100 * base_accuracy, len(kept), len(dataset))
    if len(kept) == 0:
        raise TaskDataError(
            f"The model answers none of the {len(dataset)} prompts correctly, so nothing is left to analyse; "
            f"try a few-shot prefix (n_shots=2), one-digit operands, or another template style."
        )
    return kept, base_accuracy
