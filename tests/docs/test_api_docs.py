"""docs/api.md is generated from the docstrings and must not be stale; every public object has a docstring.

Cross-cutting: docs/api.md against the docstrings of every package."""

import importlib.util
import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_api", ROOT / "docs" / "gen_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_md_is_up_to_date():
    gen = load_generator()
    assert gen.API_FILE.read_text() == gen.render(), "docs/api.md is stale: run `python docs/gen_api.py`"


def test_every_public_function_and_class_has_a_docstring():
    gen = load_generator()
    missing = [
        f"{module.__name__}.{name}"
        for module in gen.iter_modules()
        for name, member in gen.public_members(module)
        if not inspect.getdoc(member)
    ]
    missing += [module.__name__ for module in gen.iter_modules() if not module.__doc__]
    assert not missing, f"public objects without a docstring: {missing}"
