"""Every method family's names are written once, in its torch-free catalogue; no other module writes them out again,
and no module dispatches on them with a string if-chain.

Cross-cutting: the catalogues (circuit methods, featurizers, causal models, merge methods and levels, expert tasks,
number components, ablations, objectives, prompt families) against every module of the library and the experiments,
read with ``ast``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("circuits", "patching", "finetune", "merging", "experiments")
#: the torch-free catalogues; each must import without torch
CATALOGUE_MODULES = ("patching.edges.catalogue", "patching.variables.catalogue", "merging.methods.catalogue",
                     "finetune.expert_task_names", "circuits.analyze.number_catalogue", "circuits.templates")


def name_sets() -> dict[str, set[str]]:
    """``{what: its names}`` for every catalogued family and sub-family.

    TransformerLens' hook components (``resid_pre``, ``attn_out``, ...) are left out: they are the library's vocabulary,
    named by every module that hooks a model, not a family of the toolkit's.
    """
    from circuits import templates
    from finetune.expert_task_names import EXPERT_TASKS
    from merging.methods import catalogue as merge_catalogue
    from patching.edges import catalogue as edge_catalogue
    from patching.variables import catalogue as variable_catalogue

    return {
        "circuit methods": set(edge_catalogue.CATALOGUE),
        "attribution methods": set(edge_catalogue.ATTRIBUTION_METHODS),
        "learned methods": set(edge_catalogue.LEARNED_METHODS),
        "search methods": set(edge_catalogue.SEARCH_METHODS),
        "ablations": set(edge_catalogue.ABLATIONS),
        "featurizers": set(variable_catalogue.FEATURIZERS),
        "causal models": set(variable_catalogue.CAUSAL_MODELS),
        "merge methods": {e.name for e in merge_catalogue.ENTRIES},
        "data-free merge methods": set(merge_catalogue.DATA_FREE_METHODS),
        "merge levels": set(merge_catalogue.LEVELS),
        "expert tasks": set(EXPERT_TASKS),
        "prompt families": set(templates.PROMPT_FAMILIES),
    }


def is_copy(names: list[str], family: set[str]) -> bool:
    """A literal copies a family when it holds every one of its names (or, for a family of five or more, every one
    but one: a copy less a default, as a list of the featurizers without the full vector)."""
    if set(names) <= {"+", "-", "*", "/"}:  # the operations themselves (task data), not the causal models' list
        return False
    missing = len(family - set(names))
    return len(family) >= 2 and (missing == 0 or (missing == 1 and len(family) >= 5))


def _home(module: str) -> bool:
    return module in CATALOGUE_MODULES


def string_collections(tree: ast.AST):
    """Every tuple, list or set literal of two or more string constants: ``(line, names)``. A dict keyed by names (an
    implementation table: a method's class, its default learning rate) is the implementation, not a copy."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            continue
        values = node.elts
        names = [v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
        if len(names) >= 2:
            yield node.lineno, names


def modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            yield dotted, path


def test_no_module_writes_a_catalogued_family_out_again():
    families = name_sets()
    copies = []
    for dotted, path in modules():
        if _home(dotted):
            continue
        for line, names in string_collections(ast.parse(path.read_text(encoding="utf-8"))):
            copies += [f"{path.relative_to(ROOT)}:{line}: {what} {sorted(set(names) & family)}"
                       for what, family in families.items() if is_copy(names, family)]
    assert not copies, "names written out again instead of read from their catalogue:\n" + "\n".join(copies)


def test_no_string_if_chain_dispatches_on_a_method_name():
    """``if kind == "das": ... elif kind == "dbm": ...``: a chain of two or more comparisons of one variable with
    catalogued method names (circuit methods, featurizers, merge methods)."""
    families = name_sets()
    methods = families["circuit methods"] | families["featurizers"] | families["merge methods"]
    chains = []
    for dotted, path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.If):
                continue
            compared, branch = [], node
            while isinstance(branch, ast.If):
                test = branch.test
                if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
                        and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value in methods):
                    compared.append((ast.dump(test.left), test.comparators[0].value))
                branch = branch.orelse[0] if len(branch.orelse) == 1 else None
            subjects = {s for s, _ in compared}
            if len(compared) >= 2 and len(subjects) == 1:
                chains.append(f"{path.relative_to(ROOT)}:{node.lineno}: {[v for _, v in compared]}")
    assert not chains, "string if-chains on method names (dispatch through the catalogue record):\n" + "\n".join(chains)


@pytest.mark.parametrize("module", CATALOGUE_MODULES)
def test_each_catalogue_imports_without_torch(module):
    code = (f"import sys, {module}; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformer_lens', 'datasets')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_the_walk_finds_a_copy_when_there_is_one(tmp_path):
    """The walk is not vacuous: a config that writes three circuit methods out is caught."""
    families = name_sets()
    learned = sorted(families["learned methods"])
    tree = ast.parse(f"CHOICES = {tuple(learned)!r}\nSOME = {tuple(learned[:2])!r}\nOTHER = ('a', 'b')\n")
    found = [names for _, names in string_collections(tree)]
    assert [is_copy(names, families["learned methods"]) for names in found] == [True, False, False]
    four = sorted(families["featurizers"])[1:]
    assert is_copy(four, families["featurizers"])  # a copy less one name
