"""Data-parallel training under ``accelerate launch`` with two CPU processes (about 20-40 s).

accelerate 1.x starts a *single* process for ``--cpu --num_processes 2`` unless an MPI
hostfile is given; ``--multi_gpu --num_processes 2`` on a machine without CUDA starts two
processes through torchrun, with the gloo backend, which is what a CPU test needs.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.tiny_models import tiny_model

HERE = Path(__file__).parent
REPO = HERE.parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="the two-process launch is a CPU (gloo) check")
def test_two_process_run_matches_single_process(tmp_path):
    sys.path.insert(0, str(HERE))
    try:
        import ddp_train_script as script
    finally:
        sys.path.remove(str(HERE))
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    # `python -m accelerate.commands.launch` is the `accelerate launch` of this interpreter's environment.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29731",
           str(HERE / "ddp_train_script.py"), str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads((tmp_path / "losses.json").read_text())
    assert info["world"] == 2
    ddp = load_file(str(tmp_path / "weights.safetensors"))

    single, result = script.run(tmp_path / "single")
    base = tiny_model(style="gemma").state_dict()
    tuned = {s.name: s.index for s in result.selection.slices}
    for name, value in single.state_dict().items():
        # Same update up to float summation order across processes.
        torch.testing.assert_close(ddp[name], value, rtol=1e-4, atol=1e-5, msg=name)
        if name not in tuned:
            assert torch.equal(ddp[name], base[name]), f"{name} changed under DDP"
    assert not torch.equal(ddp["blocks.0.attn.W_Q"][1], base["blocks.0.attn.W_Q"][1])
    assert torch.equal(ddp["blocks.0.attn.W_Q"][0], base["blocks.0.attn.W_Q"][0])
    assert len(info["losses"]) == len(result.losses)
    assert (tmp_path / "run" / "final" / "weights.safetensors").is_file()
