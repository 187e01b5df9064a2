"""``python -m experiments.numbers``."""

from experiments.numbers import main
from experiments.runtime import cli

cli.run_cli(main, "numbers")
