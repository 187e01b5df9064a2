"""No function in the library or the experiments runs over 80 lines.

A long function is a list of steps nobody has named. Past 80 lines (``def`` to its last line, docstring included)
it is split along its ideas into short functions whose names say what each step does, so the function that calls
them reads as the list of steps.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("circuits", "patching", "finetune", "merging", "experiments")
MAX_LINES = 80


def long_functions(folder: Path) -> list[str]:
    """``path:line name (N lines)`` of every function or method under ``folder`` longer than :data:`MAX_LINES`."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_LINES:
                    found.append(f"{path.relative_to(folder.parent)}:{node.lineno} {node.name} ({length} lines)")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_is_longer_than_80_lines(package):
    assert long_functions(ROOT / package) == [], f"split these into named steps (at most {MAX_LINES} lines each)"


def test_the_measure_counts_from_def_to_the_last_line_methods_included(tmp_path):
    package = tmp_path / "package"
    package.mkdir()
    (package / "module.py").write_text("def fits():\n" + "    x = 1\n" * 79 + "\n\nclass Thing:\n"
                                       + "    def too_long(self):\n" + "        x = 1\n" * 80)
    assert long_functions(package) == ["package/module.py:84 too_long (81 lines)"]
