"""Experiments run end to end in seconds on tiny random models: a model directory (``tiny_dir``), a model loader to
inject (``tiny_loader``), ``run_main``, which runs an experiment's command line with that loader, and ``one_thread``
for the training experiments."""

import importlib

import pytest
import torch

from circuits.loading import save_model
from experiments.runtime import cli
from tests.tiny_models import tiny_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    model = tiny_model(style="gemma", n_layers=2, n_ctx=1024)  # character-level word problems are long
    digits = [model.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    with torch.no_grad():  # make the random model answer with digits, so some answers are right
        model.unembed.b_U[digits] += 20.0
    path = tmp_path_factory.mktemp("models") / "tiny"
    save_model(model, path)
    return path


@pytest.fixture
def tiny_loader():
    """A model loader (``main(argv, loader=...)``) that returns a fresh tiny gemma-style model; an experiment may set
    torch's thread count (``--threads``), so it is restored afterwards."""
    before = torch.get_num_threads()
    yield lambda name, **kw: tiny_model(style="gemma", n_layers=2)
    torch.set_num_threads(before)


@pytest.fixture
def run_main():
    """``run_main(module, argv, loader)``: ``python -m <module> <argv>`` with the model loader ``loader``; the command
    line's errors come out as one line with exit status 2, as from a shell."""

    def run(module: str, argv: list[str], loader) -> None:
        main = importlib.import_module(module).main
        cli.run_cli(lambda a: main(a, loader=loader), module.rsplit(".", 1)[1], argv)

    return run


@pytest.fixture
def one_thread():
    """torch on one thread for the test, as under tests/finetune/conftest.py: tiny models train fastest so."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
