"""The addition circuit: `python -m experiments.addition --help` lists every flag (see experiments/arithmetic/__init__.py)."""

from experiments.arithmetic import build_parser, cli_main

parser = build_parser("+")

if __name__ == "__main__":
    cli_main("+")
