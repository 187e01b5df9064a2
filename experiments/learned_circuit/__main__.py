"""``python -m experiments.learned_circuit``."""

from experiments.learned_circuit import main
from experiments.runtime import cli

cli.run_cli(main, "learned_circuit")
