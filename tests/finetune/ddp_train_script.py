"""Run by test_trainer.py (test_two_process_run_matches_single_process) under ``accelerate launch``: a
precise-SFT run on a tiny model.

Usage: ``python ddp_train_script.py OUT_DIR``. Rank 0 writes ``OUT_DIR/weights.safetensors``
(the full trained state dict) and ``OUT_DIR/losses.json``.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from circuits.nodes import Head, MLP
from circuits.process_group import end_process_group
from tests.tiny_models import tiny_model
from finetune.data import ArithmeticMix, arithmetic_train_set
from finetune import TrainConfig
from finetune.trainer import train

CONFIG = TrainConfig(lr=5e-3, batch_size=8, micro_batch_size=2, max_steps=4, progress=False, checkpoint_every=2)
HEADS = [Head(0, 1), Head(1, 3)]
MLPS = [MLP(0)]


def run(out_dir: Path):
    torch.set_num_threads(1)
    model = tiny_model(style="gemma")
    data = arithmetic_train_set(model, ArithmeticMix(n_examples=32, n_shots=1, seed=5))
    result = train(model, data, CONFIG, method="precise", heads=HEADS, mlps=MLPS, out_dir=out_dir)
    return model, result


if __name__ == "__main__":
    out = Path(sys.argv[1])
    model, result = run(out / "run")
    distributed = torch.distributed.is_initialized()
    if not distributed or torch.distributed.get_rank() == 0:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "weights.safetensors"))
        (out / "losses.json").write_text(json.dumps({"losses": result.losses,
                                                     "world": torch.distributed.get_world_size() if distributed else 1}))
    end_process_group()
