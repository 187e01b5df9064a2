"""Two CPU processes under ``accelerate launch``: how the launched tests start their scripts.

accelerate 1.x starts a *single* process for ``--cpu --num_processes 2``; ``--multi_gpu --num_processes 2`` on a
machine without CUDA starts two through torchrun with the gloo backend.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def launch_two_processes(script: Path, *args: str, port: int, timeout: int) -> None:
    """Run ``script args...`` in two processes (one thread each, offline); fail with stderr's tail unless it exits 0.

    ``port``: the rendezvous port, one per test so that tests never meet on it.
    """
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    # `python -m accelerate.commands.launch` is the `accelerate launch` of this interpreter's environment.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port), str(script), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
