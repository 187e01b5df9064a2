"""``python -m experiments.merge``."""

from experiments.merge import main
from experiments.runtime import cli

cli.run_cli(main, "merge")
