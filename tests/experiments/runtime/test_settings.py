"""experiments.runtime.settings: the settings every experiment shares answer without torch, check their choices,
and hand on to a library's settings record by name."""

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from circuits.errors import InputError
from experiments.runtime.settings import RunSettings, project

ROOT = Path(__file__).resolve().parents[3]


def test_importing_the_settings_loads_neither_torch_nor_transformer_lens():
    code = ("import sys, experiments.runtime.settings; "
            "print(sorted(m for m in ('torch', 'transformer_lens') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_choices_are_checked_for_configs_built_in_code():
    assert RunSettings(dtype="bfloat16").dtype == "bfloat16"
    with pytest.raises(InputError, match=r"RunSettings.dtype = 'float8': choose from"):
        RunSettings(dtype="float8")


def test_project_hands_on_the_shared_fields():
    @dataclass(frozen=True)
    class Search:
        seed: int = 0
        threshold: float = 0.8
        n_bootstrap: int = 100

    search = project(RunSettings(seed=5, threads=2), Search, threshold=0.5)
    assert search == Search(seed=5, threshold=0.5, n_bootstrap=100)
