"""docs/errors.md must not go stale: every row names a test that exists and checks an error's message,
and every documented message is still what the code raises.

The second check compares text: each literal stretch of a documented message (the parts
between ``{placeholders}`` and ``…``) must occur in a string literal of the toolkit's source,
so a reworded message in the code fails here until the row is updated.

Fast and model-free: it only parses markdown and Python source (``ast``), it imports nothing
from the toolkit.

Cross-cutting: docs/errors.md against the tests and the source of every package.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ERRORS_MD = ROOT / "docs" / "errors.md"
TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
MIN_ROWS = 20


def _cells(line: str) -> list[str]:
    """Cells of a markdown table row, splitting on ``|`` that are not escaped as ``\\|``."""
    body = line.strip()[1:-1]
    return [c.strip() for c in re.split(r"(?<!\\)\|", body)]


def error_rows() -> list[dict]:
    """The data rows of the errors table: ``{"n", "where", "exception", "message", "test", "line"}``."""
    rows = []
    for lineno, line in enumerate(ERRORS_MD.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("|") or not TEST_REF.search(line):
            continue
        cells = _cells(line)
        rows.append({"cells": cells, "line": lineno, "text": line})
    return rows


@lru_cache(maxsize=None)
def _test_functions(path: str) -> dict[str, str]:
    """``{test function name: its source}`` for every (possibly nested or method) function in ``path``."""
    source = (ROOT / path).read_text(encoding="utf-8")
    tree = ast.parse(source)
    return {
        node.name: ast.get_source_segment(source, node) or ""
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def test_errors_doc_exists_and_has_enough_rows():
    assert ERRORS_MD.is_file(), "docs/errors.md is missing"
    rows = error_rows()
    assert len(rows) >= MIN_ROWS, f"docs/errors.md lists {len(rows)} errors; at least {MIN_ROWS} are expected"


def test_rows_are_well_formed_and_numbered():
    rows = error_rows()
    for i, row in enumerate(rows, 1):
        cells = row["cells"]
        assert len(cells) == 5, (
            f"docs/errors.md line {row['line']}: expected 5 cells (#, where, exception, message, test), "
            f"got {len(cells)}; escape a literal | in a message as \\|"
        )
        number, where, exception, message, test = cells
        assert number == str(i), f"docs/errors.md line {row['line']}: row number {number!r}, expected {i}"
        assert where and exception and message, f"docs/errors.md line {row['line']}: empty cell"
        assert TEST_REF.fullmatch(test), f"docs/errors.md line {row['line']}: test cell {test!r} is not tests/...py::name"
        assert re.search(r"\w+(Error|Exception|Exit)\b", exception), (
            f"docs/errors.md line {row['line']}: {exception!r} names no exception type"
        )


def _refs():
    return sorted({(m.group(1), m.group(2)) for row in error_rows() for m in TEST_REF.finditer(row["text"])})


@pytest.mark.parametrize("path, name", _refs() or [("", "")])
def test_referenced_test_exists_and_checks_an_error(path, name):
    assert path, "docs/errors.md references no tests"
    assert (ROOT / path).is_file(), f"docs/errors.md references {path}, which does not exist"
    functions = _test_functions(path)
    assert name in functions, f"docs/errors.md references {path}::{name}, but {path} has no `def {name}`"
    assert re.search(rf"^\s*(async\s+)?def {re.escape(name)}\b", (ROOT / path).read_text(encoding="utf-8"), re.M)
    assert "pytest.raises" in functions[name], (
        f"{path}::{name} no longer contains pytest.raises; update docs/errors.md"
    )
    assert re.search(r"pytest\.raises\([^)]*match=", functions[name]), (
        f"{path}::{name} checks only the type of its errors; give pytest.raises a match= on the message"
    )


PACKAGES = ("circuits", "patching", "finetune", "merging", "experiments")
MIN_FRAGMENT = 12  # shorter stretches ("got ", ", use ") say nothing about drift


@lru_cache(maxsize=None)
def _source_strings() -> tuple[str, ...]:
    """Every literal stretch of every string in the toolkit's source (f-strings split at their fields)."""
    pieces = []
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    pieces.append(node.value)
    return tuple(pieces)


# What a documented message shows in place of an interpolated value: {placeholders}, …, and
# literal lists or tuples of quoted names (a registry's keys, printed with repr).
INTERPOLATED = re.compile(r"\{[^{}]*\}|…|\[[^\]]*…[^\]]*\]|[\[(]'[^\])]*'[\])]")


def message_fragments(message_cell: str) -> list[str]:
    """The literal stretches of a documented message: backticked text split where values are interpolated.

    Stretches are also split at ``: `` and ``; ``, where the code often joins a prefix built
    elsewhere, and trimmed of the punctuation around them.
    """
    fragments = []
    for quoted in re.findall(r"``(.+?)``|`([^`]+)`", message_cell):
        text = (quoted[0] or quoted[1]).replace("\\|", "|")
        for part in INTERPOLATED.split(text):
            for piece in re.split(r"[:;] ", part):
                piece = piece.strip(" .,:;()[]")
                if len(piece) >= 4:
                    fragments.append(piece)
    long = [f for f in fragments if len(f) >= MIN_FRAGMENT]
    return long or fragments  # a message of short stretches only is checked stretch by stretch


@pytest.mark.parametrize("row", error_rows(), ids=lambda row: f"row{row['cells'][0]}")
def test_documented_message_is_what_the_code_raises(row):
    fragments = message_fragments(row["cells"][3])
    assert fragments, f"docs/errors.md line {row['line']}: the message cell quotes no text to check"
    strings = _source_strings()
    for fragment in fragments:
        assert any(fragment in s for s in strings), (
            f"docs/errors.md line {row['line']}: {fragment!r} occurs in no string of the toolkit's source; "
            "the message in the code changed: update the row"
        )
