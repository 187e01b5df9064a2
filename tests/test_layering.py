"""The packages' layering (docs/index.md, "The packages"): who may import whom, no import cycles, no library
module importing the tests, no experiment importing another, no library module importing another module's private
names.

Cross-cutting: one contract over every module of every package. It reads the source with ``ast`` (imports
inside functions included, relative imports resolved) and imports nothing from the toolkit.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("circuits", "patching", "finetune", "merging", "experiments")

# layer -> the layers its modules may import (their own included). circuits.analyze and circuits.show are layers of
# their own: the core never imports them; patching reads two of them (number tokens, its results' figures).
CORE = "circuits"
ALLOWED = {
    "circuits": {"circuits"},
    "circuits.analyze": {"circuits", "circuits.analyze"},
    "circuits.show": {"circuits", "circuits.analyze", "circuits.show"},
    "patching": {"patching", "circuits", "circuits.analyze", "circuits.show"},
    "finetune": {"finetune", "circuits"},
    "merging": {"merging", "circuits"},
    "experiments": {"experiments", "patching", "finetune", "merging", "circuits", "circuits.analyze", "circuits.show"},
}


def project_modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """``{dotted module name: file}`` for every module of ``packages`` under ``root`` (a package is its __init__)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(modules: dict[str, Path], foreign=("tests",)) -> list[tuple[str, int, str]]:
    """Every import of a project module (or of ``foreign`` top-level names): ``(importer, line, imported module)``.

    ``from a.b import c`` imports ``a.b.c`` when that is a module, else ``a.b``; an imported name that is not a
    module counts as its nearest enclosing module.
    """
    tops = {name.split(".")[0] for name in modules} | set(foreign)
    found = []
    for importer, path in modules.items():
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
            else:
                continue
            for target in targets:
                if target.split(".")[0] not in tops:
                    continue
                while target not in modules and "." in target and target.split(".")[0] not in foreign:
                    target = target.rpartition(".")[0]
                found.append((importer, node.lineno, target))
    return found


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == CORE and len(parts) > 1 and parts[1] in ("analyze", "show"):
        return f"{CORE}.{parts[1]}"
    return parts[0]


#: the commands of the arithmetic experiment, one per operation: thin modules that run ``experiments.arithmetic``
OPERATION_COMMANDS = {"addition": "arithmetic", "subtraction": "arithmetic", "multiplication": "arithmetic",
                      "division": "arithmetic"}
SHARED = "runtime"  # experiments.runtime: what every experiment shares (settings, lifecycle, shared stages)


def experiment_of(module: str) -> str | None:
    """The experiment a module of ``experiments`` belongs to (``experiments.merge.stats`` -> ``merge``; the
    operation commands -> ``arithmetic``); None for a module outside an experiment."""
    parts = module.split(".")
    if parts[0] != "experiments" or len(parts) < 2:
        return None
    return OPERATION_COMMANDS.get(parts[1], parts[1])


def sibling_imports(imports) -> list[str]:
    """Imports of one experiment by another, or of any experiment by ``experiments.runtime``: what two experiments
    share belongs in the runtime or the library."""
    out = []
    for importer, line, target in imports:
        a, b = experiment_of(importer), experiment_of(target)
        if a is not None and b is not None and b not in (a, SHARED):
            out.append(f"{importer}:{line} imports {target} (experiment {a} -> experiment {b})")
    return out


def layering_violations(imports, allowed=ALLOWED) -> list[str]:
    out = []
    for importer, line, target in imports:
        a, b = layer_of(importer), layer_of(target)
        if b == "tests":
            out.append(f"{importer}:{line} imports {target}: a library module imports the tests")
        elif b not in allowed.get(a, {a}):
            out.append(f"{importer}:{line} imports {target} ({a} -> {b} is not allowed)")
    return out


def import_cycles(imports) -> list[list[str]]:
    """The strongly connected components of more than one module (and modules importing themselves)."""
    graph = {}
    for importer, _, target in imports:
        graph.setdefault(importer, set()).add(target)
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(start):  # iterative Tarjan: no recursion limit on long chains
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def private_imports(modules: dict[str, Path]) -> list[str]:
    """Every import of a private name (``_x``, not ``__x__``) from another project module: ``importer:line ...``.

    A leading underscore says "this module's own"; what another module needs is public where it belongs.
    """
    tops = {name.split(".")[0] for name in modules}
    found = []
    for importer, path in modules.items():
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                names = [module + "." + a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                private = [p for p in parts if p.startswith("_") and not (p.startswith("__") and p.endswith("__"))]
                if parts[0] in tops and private:
                    found.append(f"{importer}:{node.lineno} imports {name}")
    return found


@pytest.fixture(scope="module")
def imports():
    found = imports_of(project_modules(ROOT))
    assert len(found) > 500, "the scan found too few imports: is ROOT the repository?"
    return found


def test_no_module_imports_upward_or_sideways(imports):
    problems = layering_violations(imports)
    assert not problems, "imports against the layering of docs/index.md:\n" + "\n".join(problems)


def test_no_experiment_imports_another(imports):
    problems = sibling_imports(imports)
    assert not problems, "experiments importing each other (move what they share to experiments.runtime):\n" \
        + "\n".join(problems)


def test_no_import_cycle_among_the_modules(imports):
    cycles = import_cycles(imports)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_module_imports_a_private_name_of_another():
    """The library's modules only (the tests may reach into a module's private helpers to test them)."""
    problems = private_imports(project_modules(ROOT))
    assert not problems, "private names imported across modules (make them public where they belong):\n" + \
        "\n".join(problems)


def test_the_private_import_check_finds_them(tmp_path):
    root = _tree(tmp_path, {
        "circuits/__init__.py": "from circuits.graph import Graph, __version__\n",  # public and dunder: fine
        "circuits/graph.py": "Graph = 1\n__version__ = '0'\ndef _owner():\n    pass\n",
        "circuits/selection.py": "def f():\n    from circuits.graph import _owner\n",  # lazily, still private
        "circuits/show/__init__.py": "from .. import graph\nfrom ..graph import _owner as owner\n",  # relative
        "circuits/other.py": "import circuits._hidden\nfrom os import _exit\n",  # a private module; not ours
    })
    found = private_imports(project_modules(root, ("circuits",)))
    assert found == ["circuits.other:1 imports circuits._hidden", "circuits.selection:2 imports circuits.graph._owner",
                     "circuits.show:2 imports circuits.graph._owner"], found


def test_every_package_of_the_toolkit_has_its_layer():
    packages = {layer_of(name) for name, path in project_modules(ROOT).items() if path.name == "__init__.py"}
    assert packages <= set(ALLOWED), f"packages without a rule here: {packages - set(ALLOWED)}"


def _tree(tmp_path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checks_find_upward_sideways_and_test_imports_and_cycles(tmp_path):
    """The checks can fail: a small made-up tree with each kind of problem, and one that has none."""
    root = _tree(tmp_path, {
        "circuits/__init__.py": "",
        "circuits/core.py": "from circuits.analyze import reads\n",  # the core reads an analysis: upward
        "circuits/analyze/__init__.py": "",
        "circuits/analyze/reads.py": "from . import helper\n",
        "circuits/analyze/helper.py": "def f():\n    from circuits.analyze.reads import g\n",  # a cycle, lazily
        "patching/__init__.py": "",
        "patching/sweep.py": "import finetune.trainer\nfrom circuits.core import x\n",  # sideways, then fine
        "finetune/__init__.py": "",
        "finetune/trainer.py": "from tests.tiny_models import tiny_model\n",  # a library importing the tests
    })
    found = imports_of(project_modules(root, ("circuits", "patching", "finetune")))
    assert ("circuits.analyze.reads", 1, "circuits.analyze.helper") in found  # relative import resolved
    problems = layering_violations(found)
    assert len(problems) == 3, problems
    assert any("circuits.core:1" in p and "circuits -> circuits.analyze" in p for p in problems)
    assert any("patching.sweep:1" in p and "patching -> finetune" in p for p in problems)
    assert any("finetune.trainer:1" in p and "imports the tests" in p for p in problems)
    assert import_cycles(found) == [["circuits.analyze.helper", "circuits.analyze.reads"]]
    clean = imports_of(project_modules(_tree(tmp_path / "clean", {
        "circuits/__init__.py": "", "circuits/a.py": "import circuits.b\n", "circuits/b.py": "x = 1\n",
        "merging/__init__.py": "from merging.m import y\n", "merging/m.py": "from circuits import a\ny = 2\n",
    }), ("circuits", "merging")))
    assert layering_violations(clean) == [] and import_cycles(clean) == []


def test_the_sibling_check_finds_an_experiment_importing_another(tmp_path):
    """The check can fail: one experiment importing another (lazily), and the runtime importing an experiment."""
    root = _tree(tmp_path, {
        "experiments/__init__.py": "",
        "experiments/runtime/__init__.py": "",
        "experiments/runtime/shared.py": "from experiments.merge import stats\n",  # the runtime reads an experiment
        "experiments/merge/__init__.py": "from experiments.runtime import shared\n",  # fine: the runtime
        "experiments/merge/stats.py": "x = 1\n",
        "experiments/arithmetic/__init__.py": "def f():\n    from experiments.circuit import stage\n",  # sideways
        "experiments/circuit/__init__.py": "",
        "experiments/circuit/stage.py": "y = 2\n",
        "experiments/addition.py": "from experiments.arithmetic import f\n",  # fine: the arithmetic experiment's command
        "experiments/loop.py": "from experiments.addition import f\n",  # sideways, through a command
    })
    problems = sibling_imports(imports_of(project_modules(root, ("experiments",))))
    assert len(problems) == 3, problems
    assert any("experiments.runtime.shared:1" in p and "experiment runtime -> experiment merge" in p for p in problems)
    assert any("experiments.arithmetic:2" in p and "experiment arithmetic -> experiment circuit" in p for p in problems)
    assert any("experiments.loop:1" in p and "experiment loop -> experiment arithmetic" in p for p in problems)
