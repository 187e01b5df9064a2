"""``python -m experiments.numbers``."""

import torch

from experiments.numbers import main
from experiments.runtime import cli

torch.set_grad_enabled(False)
cli.run_cli(main, "numbers")
