"""Checkpoints that hold only what training changed, and resume from them exactly.

A checkpoint is a directory ``<out_dir>/checkpoints/step-<NNNNNNNN>/`` with

* ``weights.safetensors``: the tuned tensors only. For a sliced parameter the
  key is the parameter name and the value its tuned rows (``p[index]``), so a
  precise-SFT checkpoint of a few heads is a few MB, not the whole model;
* ``optimizer.safetensors``: the AdamW moment buffers (:class:`finetune.optim.SliceAdamW`);
* ``state.json``: the step, the optimizer's step count, which rows each tensor
  holds, and the training configuration (scalars only: no pickle anywhere);
* ``manifest.json``: size and sha256 of each of those files, written last.

Before anything is copied into a model or optimizer, `load_tuned` checks every
file against the manifest, parses ``state.json``, checks that a checkpoint's step
is the one its folder is named after (a ``state.json`` edited and its manifest
refreshed would otherwise resume from the wrong step), reads every tensor and checks
names, shapes and finiteness; any failure is a `CheckpointError` naming the file,
and the model is left untouched. `latest_intact_checkpoint` skips damaged
checkpoints (with a warning) to resume from the newest intact one.

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
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from circuits.model_cache import check_files, file_entries
from circuits.errors import ToolkitError
from circuits.file_reads import load_safetensors, read_json
from finetune.masks import Selection, TunableSlice

CHECKPOINT_RE = re.compile(r"^step-(\d{8})$")
MANIFEST = "manifest.json"
TUNED_FORMAT = "arith-circuits-tuned"  # the manifest's format: a folder this module wrote (and may replace)


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


def _names(entries: list[str], limit: int = 5) -> str:
    return ", ".join(entries[:limit]) + (f" and {len(entries) - limit} more" if len(entries) > limit else "")


def _not_ours(folder: Path) -> str | None:
    """Why the toolkit may not replace or delete ``folder`` (None: it may).

    It may only when the folder is empty, or has a manifest of the toolkit's format and holds nothing but
    that manifest and the files it lists: a file put there since (or a manifest listing nothing) is not
    the toolkit's, and deleting the folder would lose it.
    """
    if not folder.is_dir() or folder.is_symlink():
        return "is not a folder"
    entries = sorted(folder.iterdir())
    if not entries:
        return None
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        manifest = None
    if not (isinstance(manifest, dict) and manifest.get("format") == TUNED_FORMAT):
        return f"no {MANIFEST} of format {TUNED_FORMAT!r}"
    listed = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    foreign = [e.name + ("/" if e.is_dir() and not e.is_symlink() else "") for e in entries
               if not (e.name == MANIFEST or e.name in listed) or e.is_symlink() or not e.is_file()]
    return f"holds files the toolkit did not write: {_names(foreign)}" if foreign else None


def _check_replaceable(final: Path) -> None:
    """Raise `CheckpointError` unless ``final`` is absent or a folder the toolkit may replace (see `_not_ours`)."""
    if not (final.exists() or final.is_symlink()) or (reason := _not_ours(final)) is None:
        return
    if reason.startswith("holds files"):
        raise CheckpointError(f"{final} {reason}; move them or choose another folder (a folder the toolkit wrote is "
                              f"replaced only while it holds nothing but the files its {MANIFEST} lists).")
    raise CheckpointError(f"{final} exists and is not a tuned-weights or checkpoint folder written by the toolkit "
                          f"(no {MANIFEST} of format {TUNED_FORMAT!r}), so it is not replaced: choose another path.")


def _write_dir_atomically(final: Path, write) -> Path:
    _check_replaceable(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        write(staging)
        if final.exists():
            _check_replaceable(final)  # again: a file may have been added while the new one was written
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
        manifest = {"format": TUNED_FORMAT, "files": file_entries(staging, exclude=(MANIFEST,))}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))

    return _write_dir_atomically(Path(path), write)


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    """The ``state.json`` of a checkpoint or tuned-weights directory."""
    state_file = Path(path) / "state.json"
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a checkpoint: it has no state.json.")
    state = read_json(state_file, "a checkpoint's state.json", error=CheckpointError,
                      hint="The checkpoint is damaged.")
    if not isinstance(state, dict) or not isinstance(state.get("selection"), dict):
        raise CheckpointError(f"{state_file} lacks the tuned selection; the checkpoint is damaged.")
    check_step(path, state)
    return state


def check_step(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """A checkpoint folder ``step-<N>`` must hold the state of step N (other folders, e.g. ``final``, are not checked).

    The step decides where a resumed run continues (and which examples come next), so a ``state.json``
    whose step was edited, or a folder renamed, would resume from the wrong step without a word.
    """
    path = Path(path)
    match = CHECKPOINT_RE.match(path.name)
    if match is None:
        return
    step, named = state.get("step"), int(match.group(1))
    if isinstance(step, bool) or not isinstance(step, int) or step != named:
        raise CheckpointError(
            f"{path / 'state.json'} records step {step!r}, but its folder {path.name} is the checkpoint of step "
            f"{named}: the state was edited or the folder renamed, and resuming would continue from the wrong step. "
            "Restore the checkpoint, or delete its folder to resume from an older one.")
    losses = state.get("losses")
    if isinstance(losses, list) and len(losses) != named:
        raise CheckpointError(
            f"{path / 'state.json'} records {len(losses)} losses for step {named} (one per step is written): the "
            "state was edited. Restore the checkpoint, or delete its folder to resume from an older one.")


def verify_checkpoint(path: str | os.PathLike) -> list[str]:
    """Check a checkpoint's files against its manifest; one message per problem (empty: intact)."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return [f"{path / MANIFEST} is missing or unreadable (the checkpoint is incomplete or was written "
                "by an older version that kept no checksums)"]
    files = manifest.get("files") if isinstance(manifest, dict) else None
    problems = check_files(path, files, MANIFEST)
    if isinstance(files, dict) and not {"weights.safetensors", "state.json"} <= set(files):
        problems.append(f"{MANIFEST} does not list weights.safetensors and state.json")
    return [p if p.startswith(str(path)) else f"{path}: {p}" for p in problems]


def _read_tensors(file: Path) -> dict[str, torch.Tensor]:
    if not file.is_file():
        raise CheckpointError(f"{file} is missing; the checkpoint is incomplete.")
    tensors = load_safetensors(file, error=CheckpointError)  # "{file} is not a readable safetensors file (...)."
    for key, t in tensors.items():
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise CheckpointError(f"{file}: tensor {key!r} holds NaN/Inf values; the checkpoint is damaged.")
    return tensors


@torch.no_grad()
def load_tuned(model: nn.Module, path: str | os.PathLike, *, optimizer=None) -> dict[str, Any]:
    """Write a directory's tuned tensors into ``model`` (and its moments into ``optimizer``); return its state.

    Works on any model with the same parameter shapes as the one trained,
    e.g. a freshly loaded base model: the result is the tuned model. Everything is
    verified first (see the module docstring); on any problem ``model`` and
    ``optimizer`` are unchanged and a `CheckpointError` names the file.
    """
    path = Path(path)
    if not path.is_dir():  # nothing is damaged: the path is wrong
        what = "is a file, not a checkpoint folder" if path.exists() else "does not exist"
        raise CheckpointError(f"{path} {what}: pass the folder save_tuned or train wrote (the one holding {MANIFEST}, "
                              "e.g. <out_dir>/final or <out_dir>/checkpoints/step-<N>).")
    if problems := verify_checkpoint(path):
        raise CheckpointError(f"Checkpoint {path} is damaged: {'; '.join(problems)}.")
    state = read_state(path)
    try:
        selection = selection_from_json(state["selection"])
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path / 'state.json'}: its selection is malformed ({err!r}).") from err
    tensors = _read_tensors(path / "weights.safetensors")
    params = dict(model.named_parameters())
    updates = []
    for s in selection.slices:
        if s.name not in params or s.name not in tensors:
            raise CheckpointError(f"{path}: tensor {s.name!r} is missing from the model or the checkpoint.")
        p, t = params[s.name], tensors[s.name]
        bad_rows = [] if s.index is None else \
            [i for i in s.index if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < p.shape[0]]
        if bad_rows:
            raise CheckpointError(f"{path / 'state.json'}: the rows of {s.name} include {bad_rows[:5]}, but the model's "
                                  f"{s.name} has rows 0..{p.shape[0] - 1}: the checkpoint was written for another "
                                  "model, or its state was edited.")
        expected = p.shape if s.index is None else (len(s.index), *p.shape[1:])
        if tuple(t.shape) != tuple(expected):
            raise CheckpointError(f"{path}: {s.name} has shape {tuple(t.shape)}, the model needs {tuple(expected)}.")
        updates.append((s, p, t))
    moments = None
    if optimizer is not None:
        opt_file = path / "optimizer.safetensors"
        if not opt_file.is_file():
            raise CheckpointError(f"{path} has no optimizer state to resume from ({opt_file.name} is missing).")
        moments = _read_tensors(opt_file)
        for kind, store in (("exp_avg", optimizer.exp_avg), ("exp_avg_sq", optimizer.exp_avg_sq)):
            for name, buf in store.items():
                key = f"{kind}/{name}"
                if key not in moments or tuple(moments[key].shape) != tuple(buf.shape):
                    raise CheckpointError(f"{opt_file}: {key} is missing or has another shape; the checkpoint was "
                                          "written for other slices.")
        if not isinstance(state.get("optimizer_step_count"), int):
            raise CheckpointError(f"{path / 'state.json'} lacks the optimizer's step count.")
    # Everything checked: only now touch the model and the optimizer.
    for s, p, t in updates:
        t = t.to(device=p.device, dtype=p.dtype)
        if s.index is None:
            p.copy_(t)
        else:
            p.index_copy_(0, torch.tensor(s.index, device=p.device), t)
    if moments is not None:
        device = next(iter(optimizer.exp_avg.values())).device
        optimizer.load_state_tensors({k: v.to(device) for k, v in moments.items()}, state["optimizer_step_count"])
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
    """The newest complete checkpoint under ``out_dir``, or None (not verified: see `latest_intact_checkpoint`)."""
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def latest_intact_checkpoint(out_dir: str | os.PathLike, *, need_optimizer: bool = True) -> Path | None:
    """The newest checkpoint under ``out_dir`` that passes `verify_checkpoint` (None if there is none at all).

    Damaged ones are skipped with a warning that names them; if checkpoints exist but none
    is intact, `CheckpointError` lists what is wrong with each (resuming from scratch silently
    would hide the damage).
    """
    found = list_checkpoints(out_dir)
    damaged = []
    for _, path in reversed(found):
        problems = verify_checkpoint(path)
        if need_optimizer and not problems and not (path / "optimizer.safetensors").is_file():
            problems = [f"{path}: optimizer.safetensors is missing"]
        if not problems:
            if damaged:
                warnings.warn(f"Skipping damaged checkpoint(s) {'; '.join(damaged)}; resuming from {path}.",
                              RuntimeWarning, stacklevel=2)
            return path
        damaged.append("; ".join(problems))
    if damaged:
        raise CheckpointError(f"No intact checkpoint under {out_dir}: {' | '.join(damaged)}. "
                              "Delete the checkpoints folder to start over, or pass resume=False.")
    return None


def _foreign_step_folders(out_dir: str | os.PathLike) -> list[str]:
    """``"step-<N> (why)"`` for each step folder under ``out_dir/checkpoints`` the toolkit may not delete."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return [f"{child.name} ({reason})" for child in sorted(root.iterdir())
            if CHECKPOINT_RE.match(child.name) and (reason := _not_ours(child)) is not None]


def prune_checkpoints(out_dir: str | os.PathLike, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (and stale temporary directories).

    Only checkpoints the toolkit wrote are deleted (and counted): a step folder without a manifest of the
    toolkit's format, or holding a file its manifest does not list, is left as it is, with a
    ``RuntimeWarning`` naming it.
    """
    root = Path(out_dir) / "checkpoints"
    ours, foreign = [], []
    for _, path in list_checkpoints(out_dir):
        reason = _not_ours(path)
        if reason is None:
            ours.append(path)
        else:
            foreign.append(f"{path.name} ({reason})")
    if foreign:
        warnings.warn(f"Not pruning {', '.join(foreign)} under {root}: the toolkit did not write them, so they are "
                      f"left as they are; move them out of {root} to silence this.", RuntimeWarning, stacklevel=2)
    for path in ours[: max(0, len(ours) - keep)]:
        shutil.rmtree(path, ignore_errors=True)
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(".step-") and ".tmp-" in child.name:
                shutil.rmtree(child, ignore_errors=True)
