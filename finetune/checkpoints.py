"""Checkpoints that hold only what training changed, and resume from them exactly.

A checkpoint is a directory ``<out_dir>/checkpoints/step-<NNNNNNNN>/`` with

* ``weights.safetensors``: the tuned tensors only. For a sliced parameter the
  key is the parameter name and the value its tuned rows (``p[index]``), so a
  precise-SFT checkpoint of a few heads is a few MB, not the whole model;
* ``optimizer.safetensors``: the AdamW moment buffers (:class:`finetune.optim.SliceAdamW`);
* ``state.json``: the step, the optimizer's step count, which rows each tensor
  holds, and the training configuration (scalars only: no pickle anywhere).

Directories are written under a temporary name and renamed into place
(``os.replace``), so a process killed mid-write leaves no half-written
checkpoint: only complete ones carry the final name. Training state is a pure
function of (weights, optimizer state, step), since the data order is a
function of the step and the seed, so restoring them continues a run bit for
bit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from finetune.masks import Selection, TunableSlice
from circuits.errors import ToolkitError

CHECKPOINT_RE = re.compile(r"^step-(\d{8})$")


class CheckpointError(ToolkitError, ValueError):
    """A checkpoint that does not fit the model or run it is loaded into."""


def slice_tensors(model: nn.Module, selection: Selection) -> dict[str, torch.Tensor]:
    """The tuned part of each selected tensor (rows for sliced parameters), as contiguous CPU copies."""
    params = dict(model.named_parameters())
    out = {}
    for s in selection.slices:
        p = params[s.name].detach()
        t = p if s.index is None else p.index_select(0, torch.tensor(s.index, device=p.device))
        out[s.name] = t.to("cpu").contiguous().clone()
    return out


def selection_to_json(selection: Selection) -> dict[str, Any]:
    """The tuned slices of a run as JSON, stored with each checkpoint so resume can check it."""
    return {
        "description": selection.description,
        "slices": [{"name": s.name, "index": None if s.index is None else list(s.index),
                    "grad_scale": s.grad_scale, "decay": s.decay} for s in selection.slices],
    }


def selection_from_json(data: dict[str, Any]) -> Selection:
    """Inverse of :func:`selection_to_json`."""
    return Selection(
        tuple(TunableSlice(d["name"], None if d["index"] is None else tuple(d["index"]), d["grad_scale"], d["decay"])
              for d in data["slices"]),
        data.get("description", ""),
    )


def _write_dir_atomically(final: Path, write) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        write(staging)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def save_tuned(
    model: nn.Module,
    selection: Selection,
    path: str | os.PathLike,
    *,
    optimizer=None,
    state: dict[str, Any] | None = None,
) -> Path:
    """Write the tuned tensors (and optionally optimizer state and JSON ``state``) to directory ``path``, atomically."""

    def write(staging: Path) -> None:
        save_file(slice_tensors(model, selection), str(staging / "weights.safetensors"))
        meta = {"selection": selection_to_json(selection), **(state or {})}
        if optimizer is not None:
            save_file({k: v.detach().cpu().contiguous() for k, v in optimizer.state_tensors().items()},
                      str(staging / "optimizer.safetensors"))
            meta["optimizer_step_count"] = optimizer.step_count
        (staging / "state.json").write_text(json.dumps(meta, indent=2, sort_keys=True))

    return _write_dir_atomically(Path(path), write)


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    """The ``state.json`` of a checkpoint or tuned-weights directory."""
    state_file = Path(path) / "state.json"
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a checkpoint: it has no state.json.")
    return json.loads(state_file.read_text())


@torch.no_grad()
def load_tuned(model: nn.Module, path: str | os.PathLike, *, optimizer=None) -> dict[str, Any]:
    """Write a directory's tuned tensors into ``model`` (and its moments into ``optimizer``); return its state.

    Works on any model with the same parameter shapes as the one trained,
    e.g. a freshly loaded base model: the result is the tuned model.
    """
    path = Path(path)
    state = read_state(path)
    selection = selection_from_json(state["selection"])
    tensors = load_file(str(path / "weights.safetensors"))
    params = dict(model.named_parameters())
    for s in selection.slices:
        if s.name not in params or s.name not in tensors:
            raise CheckpointError(f"{path}: tensor {s.name!r} is missing from the model or the checkpoint.")
        p, t = params[s.name], tensors[s.name]
        expected = p.shape if s.index is None else (len(s.index), *p.shape[1:])
        if tuple(t.shape) != tuple(expected):
            raise CheckpointError(f"{path}: {s.name} has shape {tuple(t.shape)}, the model needs {tuple(expected)}.")
        t = t.to(device=p.device, dtype=p.dtype)
        if s.index is None:
            p.copy_(t)
        else:
            p.index_copy_(0, torch.tensor(s.index, device=p.device), t)
    if optimizer is not None:
        opt_file = path / "optimizer.safetensors"
        if not opt_file.is_file():
            raise CheckpointError(f"{path} has no optimizer state to resume from.")
        device = next(iter(optimizer.exp_avg.values())).device
        optimizer.load_state_tensors({k: v.to(device) for k, v in load_file(str(opt_file)).items()},
                                     state["optimizer_step_count"])
    return state


def checkpoint_dir(out_dir: str | os.PathLike, step: int) -> Path:
    """Where the checkpoint of ``step`` lives under a run's ``out_dir``."""
    return Path(out_dir) / "checkpoints" / f"step-{step:08d}"


def list_checkpoints(out_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``out_dir`` as (step, path), oldest first."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = CHECKPOINT_RE.match(child.name)
        if match and (child / "state.json").is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under ``out_dir``, or None."""
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def prune_checkpoints(out_dir: str | os.PathLike, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (and stale temporary directories)."""
    root = Path(out_dir) / "checkpoints"
    for _, path in list_checkpoints(out_dir)[: max(0, len(list_checkpoints(out_dir)) - keep)]:
        shutil.rmtree(path, ignore_errors=True)
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(".step-") and ".tmp-" in child.name:
                shutil.rmtree(child, ignore_errors=True)
