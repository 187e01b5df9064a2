"""``python -m experiments.variables``."""

from experiments.runtime import cli
from experiments.variables import main

cli.run_cli(main, "variables")
