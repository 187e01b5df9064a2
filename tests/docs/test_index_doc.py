"""docs/index.md must not go stale: every file it cites exists, and its map of the packages lists every package,
sub-package and module there is, and nothing else.

Cross-cutting: docs/index.md against the layout of every package. Model-free; it reads files only.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "docs" / "index.md"
PACKAGES = ("circuits", "patching", "finetune", "merging", "experiments")
CITED = re.compile(r"(?<![\w/.])((?:circuits|patching|finetune|merging|experiments|tests|docs)/[\w/]+\.(?:py|md|ipynb))")


def package_modules() -> dict[str, set[str]]:
    """``{dotted package: names of its modules}`` (``__init__`` and ``__main__`` left out)."""
    out = {}
    for top in PACKAGES:
        for init in (ROOT / top).rglob("__init__.py"):
            package = ".".join(init.parent.relative_to(ROOT).parts)
            out[package] = {p.stem for p in init.parent.glob("*.py") if p.stem not in ("__init__", "__main__")}
    return out


def map_rows() -> dict[str, set[str]]:
    """The table under "## The packages": ``{package: modules listed}``."""
    section = INDEX.read_text(encoding="utf-8").split("## The packages", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first, _, modules = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`([\w.]+)`", first)
        packages = [names[0]] + [names[0].rsplit(".", 1)[0] + n if n.startswith(".") else n for n in names[1:]]
        groups = modules.split(";") if len(packages) > 1 else [modules]
        assert len(groups) == len(packages), f"docs/index.md: {line[:60]}...: one ';'-group of modules per package"
        for package, group in zip(packages, groups):
            rows[package] = set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", group)))
    return rows


def test_every_file_the_index_cites_exists():
    cited = set(CITED.findall(INDEX.read_text(encoding="utf-8")))
    assert len(cited) > 20
    missing = sorted(p for p in cited if not (ROOT / p).exists())
    assert not missing, f"docs/index.md cites files that do not exist: {missing}"


def test_the_map_lists_every_package_and_module_and_nothing_else():
    actual, listed = package_modules(), map_rows()
    assert set(listed) == set(actual), (
        f"packages missing from the map: {sorted(set(actual) - set(listed))}; "
        f"listed but absent: {sorted(set(listed) - set(actual))}")
    for package, modules in actual.items():
        assert listed[package] == modules, (
            f"docs/index.md, {package}: missing {sorted(modules - listed[package])}, "
            f"stale {sorted(listed[package] - modules)}")
