"""``python -m experiments.precise_sft``."""

from experiments.precise_sft import main
from experiments.runtime import cli

cli.run_cli(main, "precise_sft")
