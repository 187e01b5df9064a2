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


def test_the_prompt_records_are_declared_once_and_keep_each_experiments_defaults():
    """n_prompts / n_shots / batch_size come from PromptSettings and BatchSettings; each experiment keeps its defaults."""
    import dataclasses

    from experiments import af1, bench_patching, loop, measure_edges, transfer
    from experiments.arithmetic.config import PipelineConfig
    from experiments.bench_circuits.config import BenchCircuitsConfig
    from experiments.circuit.config import CircuitConfig
    from experiments.numbers.config import NumbersConfig
    from experiments.runtime.settings import BatchSettings, PromptSettings

    expected = {PipelineConfig: (200, 3, 32), CircuitConfig: (200, 3, 32), loop.LoopConfig: (200, 3, 32),
                af1.AF1ExperimentConfig: (100, 0, 32), transfer.TransferConfig: (96, 3, 32),
                bench_patching.BenchPatchingConfig: (64, 2, None), measure_edges.MeasureEdgesConfig: (32, 2, None),
                BenchCircuitsConfig: (32, 2, None), NumbersConfig: (None, None, 64)}
    for config, defaults in expected.items():
        values = dataclasses.asdict(config())
        assert tuple(values.get(k) for k in ("n_prompts", "n_shots", "batch_size")) == defaults, config.__name__
        assert issubclass(config, PromptSettings) == (defaults[0] is not None), config.__name__
        assert issubclass(config, BatchSettings) == (defaults[2] is not None), config.__name__


def test_override_changes_the_default_and_keeps_the_check():
    from experiments.runtime import cli
    from experiments.runtime.cli import override
    from experiments.runtime.settings import PromptSettings

    @dataclass(frozen=True)
    class Few(PromptSettings, RunSettings):
        n_prompts: int = override(PromptSettings, "n_prompts", 8, "prompts in the batch")

    parser = cli.config_parser(Few, "few", None)
    assert cli.parse_config(parser, Few, []).n_prompts == 8
    assert "prompts in the batch (default: 8)" in " ".join(parser.format_help().split())
    assert "solved examples before each prompt (default: 3)" in " ".join(parser.format_help().split())
    with pytest.raises(SystemExit):
        cli.parse_config(parser, Few, ["--n-prompts", "0"])  # positive_int, inherited


def test_the_learn_flags_default_to_the_librarys_default_circuit():
    """experiments/runtime/settings.py writes DEFAULT_CIRCUIT's values out (it may not import torch)."""
    import dataclasses

    from experiments.arithmetic.config import PipelineConfig
    from patching.edges.learn import DEFAULT_CIRCUIT

    assert dataclasses.asdict(PipelineConfig().learn_config()) == dataclasses.asdict(DEFAULT_CIRCUIT)
    assert PipelineConfig().circuit_method == DEFAULT_CIRCUIT.method and PipelineConfig(warm_start="none") \
        .warm_start_method() is None
