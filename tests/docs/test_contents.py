"""Every long page of docs/ opens with a table of contents whose entries are its ``##`` sections.

A page longer than :data:`LONG` lines must list, before its first ``##`` heading, one link per ``##``
heading, in order, each to the anchor GitHub gives that heading (:func:`github_anchor`), so a section
added, renamed or moved fails here until the contents follow. A failure prints the contents to paste.

Cross-cutting: every markdown page of docs/. Model-free; it reads files only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LONG = 300  # lines: longer pages need contents
LINK_ITEM = re.compile(r"^\s*(?:[-*]|\d+\.)\s+\[(?P<text>.+)\]\(#(?P<anchor>[^)\s]+)\)\s*$")


def github_anchor(heading: str, seen: dict[str, int] | None = None) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    if seen is None:
        return anchor
    count = seen.get(anchor, 0)
    seen[anchor] = count + 1
    return anchor if count == 0 else f"{anchor}-{count}"


def split_page(text: str) -> tuple[list[str], list[str]]:
    """The lines before the first ``##`` heading, and the ``##`` headings' texts (code fences skipped)."""
    head, headings, fenced = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            headings.append(line[3:].strip())
        elif not headings:
            head.append(line)
    return head, headings


def contents_entries(head: list[str]) -> list[tuple[str, str]]:
    """``(text, anchor)`` of the first list of in-page links in ``head``."""
    entries: list[tuple[str, str]] = []
    for line in head:
        item = LINK_ITEM.match(line)
        if item:
            entries.append((item["text"], item["anchor"]))
        elif entries and line.strip():
            break  # the list ended
    return entries


def expected_contents(headings: list[str]) -> list[tuple[str, str]]:
    seen: dict[str, int] = {}
    return [(h, github_anchor(h, seen)) for h in headings]


LONG_PAGES = sorted(p.name for p in DOCS.glob("*.md") if len(p.read_text(encoding="utf-8").splitlines()) > LONG)


def test_the_long_pages_are_found():
    assert {"methods.md", "results.md", "api.md"} <= set(LONG_PAGES)


@pytest.mark.parametrize("name", LONG_PAGES)
def test_a_long_page_lists_its_sections_first(name):
    head, headings = split_page((DOCS / name).read_text(encoding="utf-8"))
    expected = expected_contents(headings)
    found = contents_entries(head)
    paste = "\n".join(f"- [{text}](#{anchor})" for text, anchor in expected)
    assert found == expected, (f"docs/{name} has {len(headings)} sections; its contents (before the first ## "
                               f"heading) must link each of them, in order:\n{paste}")


@pytest.mark.parametrize("heading, anchor", [
    ("Does the toolkit's gemma-3-270m match transformers?", "does-the-toolkits-gemma-3-270m-match-transformers"),
    ("Do our edge scores agree with hannamw/EAP-IG, and how much faster are they?",
     "do-our-edge-scores-agree-with-hannamweap-ig-and-how-much-faster-are-they"),
    ('Norm conventions on post-norm models (`norm="frozen"` / `norm="recompute"`)',
     "norm-conventions-on-post-norm-models-normfrozen--normrecompute"),
    ("`circuits.end_logits`", "circuitsend_logits"),
])
def test_anchors_are_githubs(heading, anchor):
    assert github_anchor(heading) == anchor


def test_a_page_whose_contents_lag_its_sections_fails():
    text = "# T\n\n- [One](#one)\n\n## One\n\n```\n## not a heading\n```\n\n## Two\n\n## One\n"
    head, headings = split_page(text)
    assert headings == ["One", "Two", "One"]
    assert expected_contents(headings) == [("One", "one"), ("Two", "two"), ("One", "one-1")]
    assert contents_entries(head) == [("One", "one")] != expected_contents(headings)
