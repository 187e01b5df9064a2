"""Run by test_checkpoints.py (test_killed_run_resumes_bit_exact): a training run that SIGKILLs its own
process part-way.

Usage: ``python kill_train_script.py OUT_DIR METHOD WHEN`` where WHEN is

* ``after-step-3``: killed right after optimizer step 3 (the step-2 checkpoint is on disk);
* ``mid-checkpoint-4``: killed while the step-4 checkpoint is being written, after its
  weights file and before its optimizer file, so a half-written staging directory is left.

A kill (not an exception) skips every ``finally`` and ``except`` block: what is on disk is
exactly what a crash or an out-of-memory kill would leave.
"""

import os
import signal
import sys
from pathlib import Path

import torch

from circuits.nodes import Head
from tests.tiny_models import tiny_model
from finetune import checkpoints
from finetune.data import ArithmeticMix, arithmetic_train_set
from finetune import TrainConfig

CONFIG = TrainConfig(lr=5e-3, batch_size=8, micro_batch_size=4, max_steps=6, checkpoint_every=2, progress=False)
HEADS = {"precise": [Head(0, 1), Head(1, 2)], "full": None}


def data(model):
    return arithmetic_train_set(model, ArithmeticMix(n_examples=48, n_shots=1, seed=3))


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(out_dir: Path, method: str, when: str) -> None:
    from finetune.trainer import train

    torch.set_num_threads(1)
    model = tiny_model(style="gemma")
    on_step = None
    if when == "after-step-3":
        on_step = lambda step, loss: _kill() if step == 3 else None  # noqa: E731
    elif when == "mid-checkpoint-4":
        real_save = checkpoints.save_file

        def save_then_maybe_kill(tensors, filename, *args, **kwargs):
            if "step-00000004" in filename and filename.endswith("optimizer.safetensors"):
                _kill()
            return real_save(tensors, filename, *args, **kwargs)

        checkpoints.save_file = save_then_maybe_kill
    else:
        raise SystemExit(f"unknown WHEN {when!r}")
    train(model, data(model), CONFIG, method=method, heads=HEADS[method], out_dir=out_dir, on_step=on_step)
    raise SystemExit("the run finished: it should have been killed")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
