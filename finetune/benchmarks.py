"""Loaders and scorers for the paper's external benchmarks: GSM8K, SVAMP (math), MMLU, CommonsenseQA (general).

Each loader calls ``datasets.load_dataset`` with the benchmark's hub id on a
machine with the hub, or reads local files in the *same schema* (``data_files=``,
JSON lines with the real column names), which is how the tests run offline.
Items are normalized to one of two shapes:

* numeric (GSM8K, SVAMP): ``{"question": str, "answer": str}`` with the final
  number as the answer (GSM8K's ``"... #### 72"`` becomes ``"72"``);
* multiple choice (MMLU, CommonsenseQA): ``{"question": str, "choices": [str],
  "labels": ["A", ...], "answer_index": int}``.

:func:`numeric_accuracy` greedily generates after ``"Question: ...\\nAnswer: "``
and compares the first number written; :func:`choice_accuracy` compares the
logits of the option letters after a lettered prompt (zero-shot, as a quick
general-ability probe; not the official few-shot protocols).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch
from transformer_lens import HookedTransformer

from circuits.metrics import end_logits


@dataclass(frozen=True)
class BenchmarkSpec:
    """Where a benchmark lives on the hub and how to normalize its rows."""

    path: str
    name: str | None
    split: str
    kind: str  # "numeric" or "choice"
    normalize: Callable[[dict], dict]


def _number(text: str) -> str:
    value = float(str(text).replace(",", ""))
    return str(int(value)) if value == int(value) else str(value)


def _gsm8k(row: dict) -> dict:
    if "####" not in row["answer"]:
        raise ValueError(f"GSM8K answer without '####': {row['answer'][:80]!r}")
    return {"question": row["question"], "answer": _number(row["answer"].split("####")[-1].strip())}


def _svamp(row: dict) -> dict:
    question = row.get("question_concat") or f"{row['Body'].strip()} {row['Question'].strip()}"
    return {"question": question, "answer": _number(row["Answer"])}


def _mmlu(row: dict) -> dict:
    choices = list(row["choices"])
    return {"question": row["question"], "choices": choices, "labels": [chr(65 + i) for i in range(len(choices))],
            "answer_index": int(row["answer"])}


def _csqa(row: dict) -> dict:
    labels = list(row["choices"]["label"])
    return {"question": row["question"], "choices": list(row["choices"]["text"]), "labels": labels,
            "answer_index": labels.index(row["answerKey"])}


BENCHMARKS: dict[str, BenchmarkSpec] = {
    "gsm8k": BenchmarkSpec("openai/gsm8k", "main", "test", "numeric", _gsm8k),
    "svamp": BenchmarkSpec("ChilleD/SVAMP", None, "test", "numeric", _svamp),
    "mmlu": BenchmarkSpec("cais/mmlu", "all", "test", "choice", _mmlu),
    "commonsense_qa": BenchmarkSpec("tau/commonsense_qa", None, "validation", "choice", _csqa),
}


def load_benchmark(name: str, *, split: str | None = None, data_files: str | list[str] | None = None,
                   limit: int | None = None) -> list[dict]:
    """Normalized items of benchmark ``name`` (see the module docstring).

    ``data_files`` reads local JSON lines in the hub schema instead of the hub.
    """
    from datasets import load_dataset

    if name not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark {name!r}: use one of {sorted(BENCHMARKS)}.")
    spec = BENCHMARKS[name]
    if data_files is not None:
        ds = load_dataset("json", data_files=data_files, split="train")
    else:
        ds = load_dataset(spec.path, spec.name, split=split or spec.split)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return [spec.normalize(row) for row in ds]


NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@torch.no_grad()
def numeric_accuracy(model: HookedTransformer, items: list[dict], *, max_new_tokens: int = 12) -> float:
    """Share of items whose greedy continuation starts with the right number."""
    if not items:
        raise ValueError("numeric_accuracy got no items.")
    correct = 0
    for item in items:
        prompt = f"Question: {item['question']}\nAnswer: "
        text = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, verbose=False)[len(prompt):]
        match = NUMBER_RE.search(text)
        correct += bool(match) and _number(match.group()) == item["answer"]
    return correct / len(items)


def choice_prompt(item: dict) -> str:
    """A multiple-choice item as a prompt: the question, one labelled choice per line, then "Answer:"."""
    lines = [f"Question: {item['question']}"]
    lines += [f"{label}. {choice}" for label, choice in zip(item["labels"], item["choices"])]
    return "\n".join(lines) + "\nAnswer:"


@torch.no_grad()
def choice_accuracy(model: HookedTransformer, items: list[dict]) -> float:
    """Share of items where the correct option letter (" A", " B", ...) has the highest logit among the options."""
    if not items:
        raise ValueError("choice_accuracy got no items.")
    correct = 0
    for item in items:
        tokens = model.to_tokens(choice_prompt(item))
        letter_ids = [model.to_single_token(f" {label}") if _single(model, f" {label}") else model.to_single_token(label)
                      for label in item["labels"]]
        logits = end_logits(model, tokens, token_ids=torch.tensor(letter_ids, device=tokens.device))[0]
        correct += int(logits.argmax()) == item["answer_index"]
    return correct / len(items)


def _single(model: HookedTransformer, text: str) -> bool:
    return len(model.tokenizer(text, add_special_tokens=False)["input_ids"]) == 1
