"""Prompt templates for two-operand arithmetic, written for this project.

A template is plain text with three markers:

* ``{A}`` and ``{B}``: the operands;
* ``[...]``: the operator word or symbol, the span a counterfactual twin replaces
  with an irrelevant word (Zhang et al. 2024, §3: "42 plus 34 is equal to" ->
  "42 nothing 34 is equal to").

Styles follow the paper: ``equation`` ("{A} [+] {B} = "), ``statement``
("The [sum] of {A} and {B} is ") and ``question`` ("Q: What is {A} [plus] {B}? A: ").
``word_problem`` templates (SVAMP-like, with names and objects) are a transfer
format and are not in the default training/identification mix. Every template
ends with a space so that the first answer token is a digit on tokenizers that
split digits (gemma, Llama); :mod:`circuits.tasks` checks this per tokenizer.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

from circuits.errors import InputError

STYLES = ("equation", "statement", "question", "word_problem")
#: the formats :func:`circuits.tasks.transfer_datasets` builds, to test whether key heads transfer
TRANSFER_FORMATS = ("multi_digit", "decimal", "word_problem", "zero_shot")
#: every prompt family a circuit can be found on (:mod:`patching.edges.families`): the template styles, then the
#: transfer formats that are not a style
PROMPT_FAMILIES = STYLES + tuple(f for f in TRANSFER_FORMATS if f not in STYLES)


@dataclass(frozen=True)
class Operation:
    """A binary arithmetic operation: its symbol, name and how to compute it."""

    symbol: str
    name: str
    compute: Callable[[Fraction, Fraction], Fraction]


OPERATIONS: dict[str, Operation] = {
    "+": Operation("+", "addition", operator.add),
    "-": Operation("-", "subtraction", operator.sub),
    "*": Operation("*", "multiplication", operator.mul),
    "/": Operation("/", "division", operator.truediv),
}

OPERATION_ALIASES = {
    "add": "+", "addition": "+", "plus": "+", "sum": "+",
    "sub": "-", "subtraction": "-", "minus": "-",
    "mul": "*", "multiplication": "*", "times": "*", "x": "*",
    "div": "/", "division": "/", "divide": "/",
}


def resolve_operation(op: str) -> Operation:
    """Return the :class:`Operation` for a symbol (``"+"``) or a name (``"addition"``, ``"add"``)."""
    key = OPERATION_ALIASES.get(op.strip().lower(), op.strip())
    if key not in OPERATIONS:
        raise InputError(
            f"Unknown operation {op!r}. Use one of {sorted(OPERATIONS)} or a name such as "
            f"{sorted(OPERATION_ALIASES)}."
        )
    return OPERATIONS[key]


@dataclass(frozen=True)
class Template:
    """One prompt template; see the module docstring for the marker syntax."""

    id: str
    op: str
    style: str
    text: str

    def __post_init__(self) -> None:
        for marker in ("{A}", "{B}"):
            if self.text.count(marker) != 1:
                raise InputError(
                    f"Template {self.id!r} must contain {marker} exactly once, got: {self.text!r}."
                )
        if len(re.findall(r"\[[^\]]+\]", self.text)) != 1:
            raise InputError(
                f"Template {self.id!r} must mark its operator word or symbol once with brackets, "
                f"e.g. '{{A}} [+] {{B}} = ', got: {self.text!r}."
            )
        if self.style not in STYLES:
            raise InputError(f"Template {self.id!r}: unknown style {self.style!r}; use one of {STYLES}.")
        resolve_operation(self.op)

    @property
    def operator_text(self) -> str:
        """The operator word or symbol, without brackets."""
        return re.search(r"\[([^\]]+)\]", self.text).group(1)

    def fill(self, a: str, b: str, operator_text: str | None = None) -> str:
        """The prompt with operands filled in; ``operator_text`` replaces the operator (for twins)."""
        replacement = self.operator_text if operator_text is None else operator_text
        return re.sub(r"\[[^\]]+\]", replacement, self.text).replace("{A}", a).replace("{B}", b)

    def spans(self, a: str, b: str, operator_text: str | None = None) -> dict[str, tuple[int, int]]:
        """Character spans of the operands and the operator in :meth:`fill`'s output."""
        replacement = self.operator_text if operator_text is None else operator_text
        pieces = re.split(r"(\{A\}|\{B\}|\[[^\]]+\])", self.text)
        spans, cursor = {}, 0
        for piece in pieces:
            if piece == "{A}":
                text, role = a, "a"
            elif piece == "{B}":
                text, role = b, "b"
            elif piece.startswith("[") and piece.endswith("]"):
                text, role = replacement, "op"
            else:
                text, role = piece, None
            if role is not None:
                spans[role] = (cursor, cursor + len(text))
            cursor += len(text)
        return spans


def _templates(op: str, style: str, texts: list[str]) -> list[Template]:
    name = OPERATIONS[op].name[:3]
    return [Template(f"{name}-{style}-{i}", op, style, text) for i, text in enumerate(texts)]


_TEXTS: dict[str, dict[str, list[str]]] = {
    "+": {
        "equation": ["{A} [+] {B} = ", "{A} [+] {B} equals ", "Compute {A} [+] {B} = ", "Calculate: {A} [+] {B} = "],
        "statement": ["The [sum] of {A} and {B} is ", "{A} [plus] {B} is equal to ", "Adding {A} [and] {B} gives ",
                      "The [total] of {A} and {B} is "],
        "question": ["Q: What is {A} [plus] {B}? A: ", "Question: What is the [sum] of {A} and {B}? Answer: ",
                     "Q: How much is {A} [plus] {B}? A: ", "Q: What do you get if you [add] {A} and {B}? A: "],
        "word_problem": [
            "Anna has {A} apples. Tom [gives] her {B} more apples. How many apples does Anna have now? Answer: ",
            "A shelf holds {A} books. Maria [adds] {B} books. How many books are on the shelf? Answer: ",
            "There are {A} birds on a tree and {B} more birds [arrive]. How many birds are there? Answer: ",
        ],
    },
    "-": {
        "equation": ["{A} [-] {B} = ", "{A} [-] {B} equals ", "Compute {A} [-] {B} = ", "Calculate: {A} [-] {B} = "],
        "statement": ["The [difference] of {A} and {B} is ", "{A} [minus] {B} is equal to ",
                      "Subtracting {B} [from] {A} gives ", "{A} [less] {B} is "],
        "question": ["Q: What is {A} [minus] {B}? A: ", "Question: What is the [difference] of {A} and {B}? Answer: ",
                     "Q: How much is {A} [minus] {B}? A: ", "Q: What do you get if you [subtract] {B} from {A}? A: "],
        "word_problem": [
            "Anna has {A} apples. She [eats] {B} of them. How many apples does Anna have now? Answer: ",
            "A shelf holds {A} books. Maria [removes] {B} books. How many books are on the shelf? Answer: ",
            "There are {A} birds on a tree and {B} birds [leave]. How many birds are there? Answer: ",
        ],
    },
    "*": {
        "equation": ["{A} [*] {B} = ", "{A} [*] {B} equals ", "Compute {A} [*] {B} = ", "Calculate: {A} [*] {B} = "],
        "statement": ["The [product] of {A} and {B} is ", "{A} [times] {B} is equal to ",
                      "Multiplying {A} [by] {B} gives ", "{A} [multiplied] by {B} is "],
        "question": ["Q: What is {A} [times] {B}? A: ", "Question: What is the [product] of {A} and {B}? Answer: ",
                     "Q: How much is {A} [times] {B}? A: ", "Q: What do you get if you [multiply] {A} by {B}? A: "],
        "word_problem": [
            "Anna has {A} bags with {B} apples [in each]. How many apples does Anna have? Answer: ",
            "A shelf has {A} rows of {B} books [each]. How many books are on the shelf? Answer: ",
            "There are {A} trees with {B} birds [on each]. How many birds are there? Answer: ",
        ],
    },
    "/": {
        "equation": ["{A} [/] {B} = ", "{A} [/] {B} equals ", "Compute {A} [/] {B} = ", "Calculate: {A} [/] {B} = "],
        "statement": ["The [quotient] of {A} and {B} is ", "{A} [divided] by {B} is equal to ",
                      "Dividing {A} [by] {B} gives ", "{A} [over] {B} is "],
        "question": ["Q: What is {A} [divided] by {B}? A: ", "Question: What is the [quotient] of {A} and {B}? Answer: ",
                     "Q: How much is {A} [divided] by {B}? A: ", "Q: What do you get if you [divide] {A} by {B}? A: "],
        "word_problem": [
            "Anna [shares] {A} apples equally among {B} friends. How many apples does each friend get? Answer: ",
            "Maria [splits] {A} books into {B} equal piles. How many books are in each pile? Answer: ",
            "{A} birds [sit] in {B} equal groups. How many birds are in each group? Answer: ",
        ],
    },
}

TEMPLATES: dict[str, list[Template]] = {
    op: [t for style, texts in by_style.items() for t in _templates(op, style, texts)]
    for op, by_style in _TEXTS.items()
}


def get_templates(op: str, styles: tuple[str, ...] | list[str] | None = None) -> list[Template]:
    """Templates of an operation, optionally restricted to some styles (default: all but word problems)."""
    symbol = resolve_operation(op).symbol
    wanted = ("equation", "statement", "question") if styles is None else tuple(styles)
    unknown = set(wanted) - set(STYLES)
    if unknown:
        raise InputError(f"Unknown template styles {sorted(unknown)}; use any of {STYLES}.")
    return [t for t in TEMPLATES[symbol] if t.style in wanted]


def template_by_id(template_id: str) -> Template:
    """Look a template up by its id (e.g. ``"add-equation-0"``)."""
    for templates in TEMPLATES.values():
        for template in templates:
            if template.id == template_id:
                return template
    known = [t.id for ts in TEMPLATES.values() for t in ts]
    raise InputError(f"No template with id {template_id!r}. Known ids: {known}.")


# Irrelevant replacements for the operator (paper §3). Symbols first for symbol operators,
# words first for word operators; the first one with the same token length wins.
COUNTERFACTUAL_SYMBOLS = ("#", "&", "@", "|", "~", "$", "^")
COUNTERFACTUAL_WORDS = (
    "nothing", "apple", "window", "yellow", "river", "table", "cloud", "green", "stone",
    # one word per length, so character-level tokenizers always find a twin
    "ox", "cat", "tree", "house", "orange", "blanket", "elephant", "pineapple", "watermelon",
)
