"""Kill the training process for real (SIGKILL), resume in another, and get the uninterrupted run's weights.

The in-process test in test_trainer.py interrupts with an exception, which still runs
``finally`` blocks; a kill does not, so this is the check that what reaches the disk is
enough to resume, and that a checkpoint cut off mid-write is ignored rather than loaded.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.tiny_models import tiny_model
from finetune.checkpoints import list_checkpoints
from finetune.trainer import train

HERE = Path(__file__).parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
import kill_train_script as script  # noqa: E402

sys.path.remove(str(HERE))


def _killed_run(out_dir: Path, method: str, when: str) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(HERE / "kill_train_script.py"), str(out_dir), method, when],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, f"expected a SIGKILL, got rc {done.returncode}: {done.stderr[-2000:]}"


@pytest.mark.parametrize("method,when,resumes_at", [
    ("precise", "after-step-3", 2),
    ("full", "after-step-3", 2),
    ("precise", "mid-checkpoint-4", 2),
])
def test_killed_run_resumes_bit_exact(method, when, resumes_at, tmp_path):
    _killed_run(tmp_path, method, when)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [resumes_at]
    if when.startswith("mid-checkpoint"):  # the cut-off write is left as a staging directory, never as step-4
        staging = [p.name for p in (tmp_path / "checkpoints").iterdir() if ".tmp-" in p.name]
        assert staging and all(name.startswith(".step-00000004") for name in staging)

    reference = tiny_model(style="gemma")
    train(reference, script.data(reference), script.CONFIG, method=method, heads=script.HEADS[method])

    resumed = tiny_model(style="gemma")  # a new process starts from the base weights
    result = train(resumed, script.data(resumed), script.CONFIG, method=method, heads=script.HEADS[method],
                   out_dir=tmp_path)
    assert result.resumed_from is not None and result.resumed_from.name == f"step-{resumes_at:08d}"
    assert len(result.losses) == script.CONFIG.max_steps
    after = resumed.state_dict()
    changed = 0
    base = tiny_model(style="gemma").state_dict()
    for name, value in reference.state_dict().items():
        assert torch.equal(value, after[name]), f"{method}/{when}: {name} differs from the uninterrupted run"
        changed += int(not torch.equal(value, base[name]))
    assert changed > 0  # training moved the weights: the comparison is not vacuous
    assert (tmp_path / "final" / "weights.safetensors").is_file()
