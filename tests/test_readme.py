"""The README's commands are what CI runs.

Cross-cutting: README.md against the CI script."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines()]


def test_readme_opens_with_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    assert "experiments.addition" in commands[0]
    assert "pytest" in commands[1]
    # A CPU machine must not pull a multi-GB CUDA torch.
    assert all("torch==2.13.0" in c for c in commands)


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert readme_commands()[1] in ci.splitlines()
