"""``python -m experiments.bench_circuits``."""

from experiments.bench_circuits import main
from experiments.runtime import cli

cli.run_cli(main, "bench_circuits")
