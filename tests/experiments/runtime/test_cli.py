"""The experiments as a user meets them: `python -m experiments.<name>`, its --help, its errors, every operation end to end."""

import importlib
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.runtime import cli

ROOT = Path(__file__).resolve().parents[3]
# an experiment is a module experiments/<name>.py or a package experiments/<name>/ with a __main__.py
EXPERIMENTS = sorted({p.stem for p in (ROOT / "experiments").glob("*.py") if not p.stem.startswith("_")}
                     | {p.parent.name for p in (ROOT / "experiments").glob("*/__main__.py")})
OPERATIONS = ["addition", "subtraction", "multiplication", "division"]


def _python(code: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_experiment_list_is_complete():
    assert set(OPERATIONS) | {"af1", "merge", "transfer", "precise_sft", "bench_patching", "bench_finetune", "numbers",
                              "measure_edges", "bench_circuits", "circuit", "cost_model", "edge_sweeps", "loop", "variables",
                              "learned_circuit", "bench_learn"} == set(EXPERIMENTS)


# One interpreter runs every module as `python -m` does (runpy, run_name="__main__"), so torch and
# TransformerLens are imported once, not eleven times.
HELP_ALL = """
import contextlib, io, json, runpy, sys
out = {}
for name in sys.argv[1:]:
    sys.argv = [name, "--help"]
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_module(f"experiments.{name}", run_name="__main__")
        code = "no exit"
    except SystemExit as exit:
        code = exit.code
    except BaseException as err:
        code = f"{type(err).__name__}: {err}"
    out[name] = {"code": code, "text": buf.getvalue()}
print(json.dumps(out))
"""


def test_every_experiment_help_runs_as_a_module():
    done = _python(HELP_ALL, *EXPERIMENTS)
    assert done.returncode == 0, done.stderr[-3000:]
    helps = json.loads(done.stdout.splitlines()[-1])
    for name in EXPERIMENTS:
        code, text = helps[name]["code"], helps[name]["text"]
        assert code == 0, f"python -m experiments.{name} --help: {code}"
        assert text.startswith(f"usage: python -m experiments.{name} "), text[:200]
        assert "``" not in text
        options = text.split("\noptions:\n", 1)[1]
        for entry in re.split(r"\n(?=  -)", options):  # one entry per flag, its help wrapped over lines
            entry = " ".join(entry.split())
            assert entry.count("(default") <= 1 and "(default: None)" not in entry, f"{name}: {entry}"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_flag_has_help_and_one_default(name):
    parser = importlib.import_module(f"experiments.{name}").parser
    for action in parser._actions:
        if action.option_strings:
            assert action.help, f"experiments.{name}: {action.option_strings[0]} has no help"
    assert parser.prog == f"python -m experiments.{name}"


def test_an_unknown_model_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "experiments.addition", "--model", "not-a-model",
                           "--out", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Cannot load 'not-a-model'" in errors[0], done.stderr
    assert max(len(line) for line in done.stderr.splitlines()) < 500  # not TransformerLens' list of every model
    assert "hint:" in done.stderr


BAD_FLAGS = [
    (["--top-k", "0"], "--top-k: must be an integer >= 1"),
    (["--knockout-ks", "a,b"], "--knockout-ks: expected comma-separated integers"),
    (["--batch-size", "0"], "--batch-size: must be an integer >= 1"),
    (["--device", "bogus"], "unknown device 'bogus'"),
    (["--af1-stride", "-1"], "--af1-stride: must be an integer >= 0"),
    (["--threads", "-2"], "--threads: must be an integer >= 0"),
    (["--dtype", "float8"], "--dtype: invalid choice"),
    (["--figures", "svg,eps"], "--figures: Unknown figure format(s) 'eps'"),
]


@pytest.mark.parametrize("argv, message", BAD_FLAGS, ids=[a[0] for a, _ in BAD_FLAGS])
def test_bad_flags_fail_before_the_model_loads(argv, message, tmp_path, capsys):
    from experiments import arithmetic as _arithmetic

    def loader(*args, **kwargs):
        pytest.fail("the model was loaded")

    with pytest.raises(SystemExit) as exit:
        cli.run_cli(lambda a: _arithmetic.main("+", a, loader=loader), "addition", [*argv, "--out", str(tmp_path / "run")])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 2, err  # the error line and the hint line
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
@pytest.mark.parametrize("flag", ["cuda", "cuda:1"])
def test_cuda_without_cuda_is_a_clear_message(flag, capsys):
    from experiments import arithmetic as _arithmetic

    with pytest.raises(SystemExit) as exit:
        _arithmetic.parse_config("+", ["--device", flag])
    assert exit.value.code == 2
    assert f"'{flag}' is not available: torch {torch.__version__}" in capsys.readouterr().err


def test_device_accepts_what_torch_has():
    assert cli.device("auto") == "auto" and cli.device("cpu") == "cpu"


def test_a_toolkit_error_is_one_line_and_a_hint(capsys):
    from circuits.errors import InputError

    def main(argv):
        raise InputError("n_prompts must be >= 1, got 0.\nPass a positive --n-prompts.")

    with pytest.raises(SystemExit) as exit:
        cli.run_cli(main, "demo", [])
    assert exit.value.code == 2
    assert capsys.readouterr().err == ("python -m experiments.demo: error: n_prompts must be >= 1, got 0.\n"
                                       "hint: Pass a positive --n-prompts.\n")
    with pytest.raises(InputError):  # --debug: the exception itself, with its traceback
        cli.run_cli(main, "demo", ["--debug"])


def test_a_bug_keeps_its_traceback():
    def main(argv):
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        cli.run_cli(main, "demo", [])


FAST = ["--n-prompts", "40", "--top-k", "2", "--knockout-prompts", "4", "--knockout-ks", "1,2", "--knockout-seeds", "1",
        "--transfer-prompts", "4", "--af1-stride", "0", "--batch-size", "16", "--threads", "1",
        "--circuit-prompts", "0"]


@pytest.mark.filterwarnings("ignore:.*found in sys.modules")  # runpy: the module was imported by an earlier test
@pytest.mark.parametrize("name", OPERATIONS)
def test_every_operation_runs_end_to_end_as_a_module(name, tiny_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", [f"experiments.{name}", "--model", str(tiny_dir), "--out", str(out), *FAST])
    threads = torch.get_num_threads()
    try:
        runpy.run_module(f"experiments.{name}", run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    results = json.loads((out / "results.json").read_text())
    assert results["experiment"] == name and results["n_prompts"] == 40 and len(results["key_heads"]) == 2
    rule = results["key_heads_rule"]
    assert rule["combine"] == "per-op" and rule["top_k"] == 2 and rule["corrupt"] == "query" and len(rule["ops"]) == 1
    assert (out / "report.html").is_file() and (out / "figures" / "path_patching.json").is_file()


# One interpreter per experiment runs it as `python -m` does with --help, an unknown flag and a bad value,
# then says whether torch or TransformerLens were imported: none of the three may need them.
LIGHT = """
import contextlib, io, json, runpy, sys
name, runs = sys.argv[1], json.loads(sys.argv[2])
out = []
for argv in runs:
    sys.argv = [name, *argv]
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            runpy.run_module(f"experiments.{name}", run_name="__main__")
        code = "no exit"
    except SystemExit as exit:
        code = exit.code
    out.append({"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()})
print(json.dumps({"runs": out, "heavy": sorted({"torch", "transformer_lens"} & set(sys.modules))}))
"""
SUBCOMMANDS = {"cost_model": ["measure", "fit"]}  # flags belong to a subcommand


@pytest.mark.filterwarnings("ignore:.*found in sys.modules")
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_help_and_flag_errors_answer_before_torch_loads(name):
    """`python -m experiments.<name> --help`, an unknown flag and a bad value answer without importing torch."""
    prefixes = [[sub] for sub in SUBCOMMANDS.get(name, [])] or [[]]
    runs = [["--help"]] + [[*p, "--help"] for p in prefixes if p] + [[*prefixes[0], "--no-such-flag"],
                                                                     [*prefixes[0], "--seed", "x"]]
    done = _python(LIGHT, name, json.dumps(runs), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.splitlines()[-1])
    helps, errors = answer["runs"][:-2], answer["runs"][-2:]
    for run in helps:
        assert run["code"] == 0 and run["stdout"].startswith(f"usage: python -m experiments.{name}"), run
    for run, what in zip(errors, ["unrecognized arguments: --no-such-flag", "argument --seed: invalid int value: 'x'"]):
        lines = run["stderr"].splitlines()
        assert run["code"] == 2 and len(lines) == 2, run
        assert lines[0].startswith(f"python -m experiments.{name}") and f"error: {what}" in lines[0], run
        assert lines[1].startswith("hint: "), run
    assert answer["heavy"] == [], f"python -m experiments.{name} imported {answer['heavy']} to answer --help or a bad flag"


def test_an_override_of_a_field_the_record_lacks_names_the_fields():
    """override(PromptSettings, 'n_prompt', ...) was a bare KeyError: 'n_prompt'."""
    from experiments.runtime.cli import override
    from experiments.runtime.settings import PromptSettings

    with pytest.raises(TypeError, match=r"PromptSettings has no field 'n_prompt'; its fields are \[.*'n_prompts'"):
        override(PromptSettings, "n_prompt", 32)
