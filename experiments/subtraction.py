"""The subtraction circuit: `python -m experiments.subtraction --help` lists every flag (see experiments/_arithmetic.py)."""

from experiments._arithmetic import build_parser, cli_main

parser = build_parser("-")

if __name__ == "__main__":
    cli_main("-")
