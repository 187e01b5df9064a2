"""The multiplication circuit: `python -m experiments.multiplication --help` lists every flag (see experiments/_arithmetic.py)."""

from experiments._arithmetic import main

if __name__ == "__main__":
    main("README.md")
