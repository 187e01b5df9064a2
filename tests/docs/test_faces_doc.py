"""docs/index.md's map of the package faces must match each face's ``__all__``, both ways, and no name may be
exported by two faces.

Cross-cutting: docs/index.md against every library package's ``__init__.py``. The first two tests read files
only (``__all__`` is read from the source with ``ast``); the last imports the faces.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "docs" / "index.md"
LIBRARY = ("circuits", "patching", "finetune", "merging")
SECTION = "## What each package face offers"


def faces() -> dict[str, list[str]]:
    """``{dotted package: its __all__}`` for every package of the library (``[]`` when it has none)."""
    out = {}
    for top in LIBRARY:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            names: list[str] = []
            for node in ast.parse(init.read_text(encoding="utf-8")).body:
                target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
                if isinstance(node, (ast.Assign, ast.AugAssign)) and getattr(target, "id", None) == "__all__":
                    names += ast.literal_eval(node.value)
            out[".".join(init.parent.relative_to(ROOT).parts)] = names
    return out


def documented() -> dict[str, list[str]]:
    """The tables under "## What each package face offers": ``{face: names in its first column}``."""
    text = INDEX.read_text(encoding="utf-8")
    assert SECTION in text, f"docs/index.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    out = {}
    for block in section.split("\n### ")[1:]:
        heading, _, body = block.partition("\n")
        face = re.fullmatch(r"`([\w.]+)`", heading.strip())
        assert face, f"docs/index.md: a face heading must be one `package`, got {heading!r}"
        out[face.group(1)] = [re.match(r"\| `(\w+)` \|", line).group(1)
                              for line in body.splitlines() if re.match(r"\| `\w+` \|", line)]
    return out


def test_the_map_lists_every_face_and_exactly_its_names():
    actual, listed = faces(), documented()
    assert set(listed) == set(actual), (f"faces missing from docs/index.md: {sorted(set(actual) - set(listed))}; "
                                        f"listed but absent: {sorted(set(listed) - set(actual))}")
    for face, names in actual.items():
        assert len(listed[face]) == len(set(listed[face])), f"docs/index.md lists a name of {face} twice"
        assert set(listed[face]) == set(names), (
            f"docs/index.md, {face}: missing {sorted(set(names) - set(listed[face]))}, "
            f"not in its __all__ {sorted(set(listed[face]) - set(names))}")


def test_every_public_name_has_one_face():
    seen: dict[str, str] = {}
    twice = []
    for face, names in faces().items():
        assert len(names) == len(set(names)), f"{face}.__all__ lists a name twice"
        twice += [f"{name} ({seen[name]} and {face})" for name in names if name in seen]
        seen.update({name: face for name in names})
    assert not twice, f"names exported by two faces: {twice}"


def test_every_listed_name_is_importable_from_its_face():
    missing = [f"{face}.{name}" for face, names in faces().items()
               for name in names if not hasattr(importlib.import_module(face), name)]
    assert not missing, f"__all__ lists names the face does not have: {missing}"
