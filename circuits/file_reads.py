"""Reading files the toolkit did not just write: JSON and safetensors, every failure one error naming the file.

A file handed to the toolkit (a graph file, a saved model, a checkpoint, a state dict) may be anything:
a folder, a binary file, JSON nested deeper than Python's parser follows, a safetensors file whose header
was forged or cut. Read through these functions, each such failure is one
:class:`circuits.errors.ToolkitError` (the caller chooses the class: :class:`UnreadableFileError` by
default, or its own, e.g. ``GraphFileError``, ``CheckpointError``) whose message starts with the file's
path and says what the file should have been; no ``IsADirectoryError``, ``UnicodeDecodeError``,
``RecursionError`` or ``SafetensorError`` reaches the caller raw.

Safetensors files are read with ``safetensors`` only: no pickle is ever read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from circuits.errors import ToolkitError

__all__ = ["UnreadableFileError", "read_json", "load_safetensors", "open_safetensors"]


class UnreadableFileError(ToolkitError, ValueError):
    """A file is missing, a folder, not UTF-8 text, not valid JSON (or nested too deep), or not safetensors."""


def _unreadable(path: Path, what: str, err: BaseException) -> str | None:
    """Why ``path`` cannot be read as ``what`` (None: the error is not a file-level problem)."""
    if isinstance(err, IsADirectoryError) or path.is_dir():
        return f"{path} is a folder, not {what}"
    if isinstance(err, FileNotFoundError):
        return f"{path} does not exist; expected {what}"
    if isinstance(err, PermissionError):
        return f"{path} cannot be read ({err.strerror or 'permission denied'}); expected {what}"
    if isinstance(err, UnicodeDecodeError):
        return f"{path} is not a text file (byte {err.start} is not UTF-8); expected {what}"
    if isinstance(err, json.JSONDecodeError):
        return f"{path} is not valid JSON ({err}); expected {what}"
    if isinstance(err, RecursionError):
        return f"{path} nests its JSON deeper than Python's parser follows; {what} is a few levels deep"
    if isinstance(err, OSError):
        return f"{path} cannot be read ({err}); expected {what}"
    return None


def read_json(path: str | os.PathLike, what: str = "a JSON file", *, error: type[ToolkitError] = UnreadableFileError,
              hint: str = "") -> Any:
    """The JSON value in ``path``; any reason it cannot be read raises ``error`` naming the file and ``what``.

    ``what`` says what the file should be (``"an EAP-IG graph file"``); ``hint`` is appended to the message
    (what to do instead).
    """
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        why = _unreadable(path, what, err)
        if why is None:
            raise
        raise error(why + "." + (f" {hint}" if hint else "")) from None


def _safetensors_problem(path: Path, err: BaseException) -> str:
    if path.is_dir():
        return f"{path} is a folder, not a safetensors file"
    if not path.exists():
        return f"{path} does not exist"
    return f"{path} is not a readable safetensors file ({' '.join(str(err).split()) or type(err).__name__})"


def open_safetensors(path: str | os.PathLike, *, error: type[ToolkitError] = UnreadableFileError, prefix: str = "",
                     hint: str = ""):
    """``safetensors.safe_open(path)`` (lazy, CPU); a forged, cut or foreign file raises ``error`` naming it.

    ``prefix`` starts the message (e.g. ``"expert 1: "``), ``hint`` ends it.
    """
    from safetensors import safe_open

    path = Path(path)
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as err:  # SafetensorError for forged headers, OSError for folders and missing files
        raise error(f"{prefix}{_safetensors_problem(path, err)}." + (f" {hint}" if hint else "")) from err


def load_safetensors(path: str | os.PathLike, *, device: str = "cpu", error: type[ToolkitError] = UnreadableFileError,
                     prefix: str = "", hint: str = "") -> dict:
    """Every tensor of the safetensors file ``path``; a forged, cut or foreign file raises ``error`` naming it."""
    from safetensors.torch import load_file

    path = Path(path)
    try:
        return load_file(str(path), device=str(device))
    except Exception as err:  # SafetensorError, OSError, and the RuntimeError/ValueError of odd dtypes
        raise error(f"{prefix}{_safetensors_problem(path, err)}." + (f" {hint}" if hint else "")) from err
