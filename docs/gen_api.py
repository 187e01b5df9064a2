"""Regenerate docs/api.md from the docstrings: `python docs/gen_api.py` (or `--check`)."""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("circuits", "patching", "finetune", "merging")
API_FILE = ROOT / "docs" / "api.md"


def iter_modules():
    """Every importable module of the library packages, sorted by name."""
    sys.path.insert(0, str(ROOT))
    names = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        names.append(package_name)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                names.append(info.name)
    for name in sorted(names):
        yield importlib.import_module(name)


def public_members(module):
    """Functions and classes defined in ``module`` whose names do not start with an underscore."""
    exported = getattr(module, "__all__", None)
    for name, member in vars(module).items():
        if name.startswith("_") or not (inspect.isfunction(member) or inspect.isclass(member)):
            continue
        if getattr(member, "__module__", None) != module.__name__:
            continue
        if exported is not None and name not in exported:
            continue
        yield name, member


def summary(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ")


def signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def render() -> str:
    lines = ["# API reference", "", "Generated from the docstrings by `python docs/gen_api.py`; do not edit by hand.", ""]
    documented = [(module, members) for module in iter_modules() if (members := list(public_members(module)))]
    # GitHub's anchor of a heading `a.b_c` drops the backticks and the dots
    lines += ["Contents:", ""] + [f"- [`{m.__name__}`](#{m.__name__.replace('.', '')})" for m, _ in documented] + [""]
    for module, members in documented:
        lines += [f"## `{module.__name__}`", "", summary(module), ""]
        for name, member in members:
            kind = "class" if inspect.isclass(member) else "def"
            lines.append(f"- **`{kind} {name}{signature(member)}`**  ")
            lines.append(f"  {summary(member)}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale (default: rewrite it)")
    args = parser.parse_args()
    text = render()
    if args.check:
        stale = not API_FILE.exists() or API_FILE.read_text() != text
        print("docs/api.md is stale: run `python docs/gen_api.py`" if stale else "docs/api.md is up to date")
        return int(stale)
    tmp = API_FILE.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(API_FILE)
    print(f"wrote {API_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
