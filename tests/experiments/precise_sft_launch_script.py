"""Run by test_precise_sft.py (test_two_processes_write_one_run_folder) under ``accelerate launch``: the
precise-SFT experiment on a tiny model, data-parallel over the launched processes.

Usage: ``python precise_sft_launch_script.py OUT_DIR``; the main process writes the run folder OUT_DIR.
"""

import sys

import torch

from experiments.precise_sft import main
from tests.tiny_models import tiny_model

ARGV = ["--heads", "L1H0,L1H2", "--k", "2", "--n-train", "16", "--steps", "2", "--batch-size", "8",
        "--micro-batch-size", "4", "--n-heldout", "2", "--n-transfer", "1", "--n-val", "2", "--n-shots", "0",
        "--n-pydoc", "1", "--n-sentences", "2", "--methods", "precise,precise_nokv,full,lora",
        "--precise-lrs", "1e-2,1e-3", "--full-lrs", "1e-3", "--lora-lrs", "1e-3",
        "--ablation-k", "1", "--threads", "1"]


def loader(name, **kwargs):
    return tiny_model(style="gemma", n_layers=2)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main([*ARGV, "--out", sys.argv[1]], loader=loader)
