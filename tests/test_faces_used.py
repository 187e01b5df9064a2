"""The experiments import a face's names from the face: ``from patching import path_patch``, not
``from patching.node_level.path_patching import path_patch``.

A face is a library package's ``__init__.py`` with an ``__all__`` (``circuits``, ``patching``, ``patching.edges``,
``patching.all_for_one``, ``finetune``, ``merging``, ``merging.methods``): the names it lists are the package's entry
points, and their address is the face, so a module can move inside its package without its callers changing. A name
the face does not list is imported from its module as before.

``experiments.runtime`` has an ``__all__`` too, but it is not a library face a researcher imports: it is the
experiments' own runtime, and its only callers are the experiments, which sit in the same package and move with it
(``from experiments.runtime.cli import option`` in a config is one package's module importing another). So the
check reads the faces of the libraries only.

Cross-cutting: one contract over every module of ``experiments/``. It reads the source with ``ast`` (imports inside
functions included, relative imports resolved) and imports nothing from the toolkit. Modules inside a face's own
package are exempt for that face: they are what the face is built from, and importing their own face would be a
cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the libraries whose faces the experiments import through (not ``experiments``: its runtime is no library face)
LIBRARIES = ("circuits", "patching", "finetune", "merging")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def faces(root: Path = ROOT) -> dict[str, set[str]]:
    """``{face package: the names of its __all__}`` for every package of the libraries that declares one."""
    out = {}
    for package in LIBRARIES:
        for init in sorted((root / package).rglob("__init__.py")):
            for node in ast.parse(init.read_text(encoding="utf-8")).body:
                targets = node.targets if isinstance(node, ast.Assign) else []
                if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                    # a face's entry points are a literal list: a computed __all__ would hide them from this test
                    out[module_name(init, root)] = set(ast.literal_eval(node.value))
    return out


def _absolute(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_past_the_face(path: Path, face_names: dict[str, set[str]],
                          root: Path = ROOT) -> list[tuple[int, str, str, str]]:
    """Every ``from <module> import <name>`` of ``path`` (at any depth) where ``<module>`` lies inside a face's
    package, ``<name>`` is in that face's ``__all__``, and ``path`` itself is outside it:
    ``(line, module imported from, name, the face to import it from)``, the nearest face first."""
    importer = module_name(path, root)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _absolute(importer, path.name == "__init__.py", node)
        # the faces above the module imported from, nearest first (the module itself is a face's own address)
        above = [".".join(source.split(".")[:i]) for i in range(source.count("."), 0, -1)]
        for alias in node.names:
            for face in above:
                inside_the_face = importer == face or importer.startswith(face + ".")
                if face in face_names and alias.name in face_names[face] and not inside_the_face:
                    found.append((node.lineno, source, alias.name, face))
                    break
    return found


def experiments_violations(root: Path = ROOT) -> dict[str, list[tuple[int, str, str, str]]]:
    face_names = faces(root)
    out = {}
    for path in sorted((root / "experiments").rglob("*.py")):
        found = imports_past_the_face(path, face_names, root)
        if found:
            out[module_name(path, root)] = found
    return out


def test_the_faces_are_found():
    found = faces()
    assert {"circuits", "patching", "patching.edges", "patching.all_for_one", "finetune", "merging",
            "merging.methods"} <= set(found)
    assert "path_patch" in found["patching"] and "Head" in found["circuits"]


def test_experiments_import_face_names_from_the_face():
    wrong = [f"experiments/{module.replace('.', '/')}: line {line}: from {source} import {name} -> from {face} import "
             f"{name}"
             for module, found in experiments_violations().items()
             for line, source, name, face in found]
    assert not wrong, "import these names from their face:\n" + "\n".join(wrong)


def test_the_check_finds_a_face_name_imported_from_its_module(tmp_path):
    (tmp_path / "patching" / "node_level").mkdir(parents=True)
    (tmp_path / "patching" / "__init__.py").write_text('__all__ = ["path_patch", "SweepOptions"]\n')
    (tmp_path / "patching" / "node_level" / "__init__.py").write_text("")
    (tmp_path / "patching" / "node_level" / "path_patching.py").write_text(
        "from patching.sweeps.options import SweepOptions\n")  # inside the face's package: exempt
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "run.py").write_text(
        "from patching import SweepOptions\n"
        "def main():\n"
        "    from patching.node_level.path_patching import path_patch, helper\n")
    for package in ("circuits", "finetune", "merging"):
        (tmp_path / package).mkdir()
    assert experiments_violations(tmp_path) == {
        "experiments.run": [(3, "patching.node_level.path_patching", "path_patch", "patching")]}
    inside = tmp_path / "patching" / "node_level" / "path_patching.py"
    assert imports_past_the_face(inside, faces(tmp_path), tmp_path) == []
