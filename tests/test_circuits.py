"""circuits (the package): its names load on first use, so importing the light modules pulls in nothing heavy."""

import subprocess
import sys
from pathlib import Path

import pytest

import circuits

ROOT = Path(__file__).resolve().parents[1]


def test_importing_the_errors_loads_neither_transformer_lens_nor_plotly():
    code = ("import sys, circuits, circuits.errors; "
            "print(sorted(m for m in ('transformer_lens', 'plotly', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_exported_names_are_the_modules_objects():
    from circuits import graph, loading, nodes, tasks

    assert circuits.load_model is loading.load_model and circuits.Head is nodes.Head
    assert circuits.Graph is graph.Graph and circuits.tasks is tasks
    assert {"load_model", "Head", "Graph", "tasks", "templates"} <= set(dir(circuits))
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        circuits.nonexistent  # noqa: B018
