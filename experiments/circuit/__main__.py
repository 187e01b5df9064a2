"""``python -m experiments.circuit``."""

from experiments.circuit import main
from experiments.runtime import cli

cli.run_cli(main, "circuit")
