"""Counterfactual twins: the rules that turn a prompt into the twin path patching compares it with.

Path patching (Zhang et al. 2024 §3) runs a model on a reference prompt and on its *twin*, the
same prompt with the operator replaced by an irrelevant word or symbol ("7 + 5 = " -> "7 # 5 = "),
and patches activations from one run into the other. Two rules say which operators change
(``corrupt``, :data:`CORRUPTIONS`):

* ``"query"`` (the paper's): only the queried line's operator; the few-shot lines still show the
  operation, so a head that reads the operation from the examples is not credited;
* ``"all"``: every operator in the prompt, the few-shot lines' too (:func:`parse_shots` reads the
  solved lines back, :func:`shot_prefix` writes them again with the replacement), so the
  operation cannot be read from anywhere.

Replacements are tried in a fixed order (:func:`replacement_operators`): symbols first for a
symbolic operator ("+"), words first for a worded one ("plus"), then two-word replacements for
operators of several tokens ("in each"). The words and symbols are
:data:`circuits.templates.COUNTERFACTUAL_WORDS` and ``COUNTERFACTUAL_SYMBOLS``. A twin must
tokenize to exactly as many tokens as its reference, so :func:`twin_candidates` yields the twin
prompts in that order and :func:`circuits.tasks.make_row` keeps the first one of the right length.
"""

from __future__ import annotations

import re
from typing import Iterator, Literal, get_args

from circuits.errors import TaskDataError
from circuits.templates import COUNTERFACTUAL_SYMBOLS, COUNTERFACTUAL_WORDS, Template

Corrupt = Literal["query", "all"]
CORRUPTIONS: tuple[str, ...] = get_args(Corrupt)


def check_corrupt(corrupt: str) -> None:
    """An error that explains both rules unless ``corrupt`` is one of :data:`CORRUPTIONS`."""
    if corrupt not in CORRUPTIONS:
        raise TaskDataError(f"corrupt must be one of {CORRUPTIONS} ('query': the queried line's operator only; "
                            f"'all': every operator, few-shot lines included), got {corrupt!r}.")


def parse_shots(template: Template, prefix: str) -> list[tuple[str, str, str]]:
    """The (a, b, answer) strings of a few-shot prefix written by ``template`` (one solved line per shot)."""
    pieces = re.split(r"(\{A\}|\{B\}|\[[^\]]+\])", template.text)
    pattern = "".join("(-?[0-9.]+)" if p in ("{A}", "{B}") else re.escape(template.operator_text) if p.startswith("[")
                      else re.escape(p) for p in pieces) + "(.+)"
    shots = []
    for line in prefix.splitlines():
        match = re.fullmatch(pattern, line)
        if match is None:
            raise TaskDataError(f"Few-shot line {line!r} is not a solved {template.id!r} problem; corrupt='all' "
                                f"needs a prefix written by the same template.")
        shots.append(match.groups())
    return shots


def shot_prefix(template: Template, shots, operator_text: str | None = None) -> str:
    """Solved lines ``(a, b, answer)`` written by ``template``, with ``operator_text`` in place of the operator if given."""
    return "".join(template.fill(a, b, operator_text=operator_text) + answer + "\n" for a, b, answer in shots)


def replacement_operators(template: Template) -> tuple[str, ...]:
    """The irrelevant operators tried for ``template``, in order: its own kind first, then two-word ones."""
    symbol_first = not template.operator_text.isalpha()
    candidates = COUNTERFACTUAL_SYMBOLS + COUNTERFACTUAL_WORDS if symbol_first else COUNTERFACTUAL_WORDS + COUNTERFACTUAL_SYMBOLS
    # Multi-token operators ("in each") need multi-word replacements of the same token count.
    pairs = tuple(f"{w} {v}" for w in COUNTERFACTUAL_WORDS for v in COUNTERFACTUAL_WORDS if w != v)
    return candidates + pairs


def twin_candidates(template: Template, a: str, b: str, prefix: str, corrupt: Corrupt = "query") -> Iterator[str]:
    """The twin prompts of ``prefix + template.fill(a, b)``, one per replacement operator, in the order they are tried.

    ``corrupt="all"`` puts the replacement in every few-shot line of ``prefix`` too.
    """
    shots = parse_shots(template, prefix) if corrupt == "all" else None
    for word in replacement_operators(template):
        cf_prefix = prefix if shots is None else shot_prefix(template, shots, operator_text=word)
        yield cf_prefix + template.fill(a, b, operator_text=word)
