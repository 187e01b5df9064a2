"""The division circuit: `python -m experiments.division --help` lists every flag (see experiments/arithmetic/__init__.py)."""

from experiments.arithmetic import build_parser, cli_main

parser = build_parser("/")

if __name__ == "__main__":
    cli_main("/")
