"""No package attribute hides one of its modules: ``patching.knockout`` must be the module, not a function.

A package that imports a function named like one of its own modules (``from patching.x import x``) rebinds
the attribute: ``patching.x`` is then the function, ``import patching.x as m`` gives the function, and
``patching.x.helper`` fails although the module defines ``helper``. The test imports every package of the
project (sub-packages too) and checks, for each of its modules, that the package attribute of that name, when
there is one, is the module.

Cross-cutting: one contract over every package of the project.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest

PACKAGES = ("circuits", "patching", "finetune", "merging", "experiments")


def all_packages(roots=PACKAGES) -> list[str]:
    """Dotted names of ``roots`` and every package below them (each imported to find its sub-packages)."""
    names = []
    for root in roots:
        package = importlib.import_module(root)
        names.append(root)
        names += [info.name for info in pkgutil.walk_packages(package.__path__, prefix=f"{root}.") if info.ispkg]
    return names


def hidden_modules(package: types.ModuleType) -> list[str]:
    """``"package.name (a function)"`` for every module of ``package`` whose name is bound to something else."""
    hidden = []
    for info in pkgutil.iter_modules(package.__path__):
        # the package's own namespace, then its lazy face (a module-level __getattr__), as a caller's lookup goes
        value = package.__dict__.get(info.name)
        if value is None and hasattr(package, "__getattr__"):
            try:
                value = getattr(package, info.name)
            except AttributeError:
                value = None
        if value is not None and not inspect.ismodule(value):
            hidden.append(f"{package.__name__}.{info.name} ({type(value).__name__})")
    return hidden


def test_the_walk_reaches_every_package():
    packages = all_packages()
    assert {"patching.edges", "patching.all_for_one", "merging.methods", "circuits.analyze",
            "experiments.runtime"} <= set(packages)


@pytest.mark.parametrize("name", all_packages())
def test_no_package_attribute_hides_a_module(name):
    hidden = hidden_modules(importlib.import_module(name))
    assert not hidden, (f"{name} binds names of its own modules to other objects: {hidden}; rename the function "
                        "or the module so that each name means one thing.")


def test_a_function_named_like_its_module_is_found(tmp_path, monkeypatch):
    package = tmp_path / "shadowing_pkg"
    package.mkdir()
    (package / "tool.py").write_text("def tool():\n    return 1\n")
    (package / "other.py").write_text("def helper():\n    return 2\n")
    (package / "__init__.py").write_text("from shadowing_pkg.tool import tool\nfrom shadowing_pkg import other\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert hidden_modules(importlib.import_module("shadowing_pkg")) == ["shadowing_pkg.tool (function)"]
