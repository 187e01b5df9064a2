"""Atomic file writes: the toolkit's one way to write a file.

A file is written to a temporary file in the same folder and then renamed over its destination
(``os.replace``, atomic on POSIX and Windows within one file system), so a reader, or a run
interrupted mid-write, sees either the old complete file or the new complete one, never half of
it. :func:`atomic_path` is the general form (any writer that takes a path: text, JSON,
safetensors); :func:`write_text_atomic` the common case. Whole directories are published the same
way by ``circuits.model_cache.publish_dir``.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from circuits.errors import ToolkitError


class DestinationExistsError(ToolkitError, FileExistsError):
    """A save function's destination already exists and ``overwrite=True`` was not given."""


class UnwritableDestinationError(ToolkitError, OSError):
    """A save function's destination cannot be a file: it is a folder, or its folder cannot be made or written."""


def refuse_existing(path: str | os.PathLike, overwrite: bool) -> Path:
    """Raise :class:`DestinationExistsError` if ``path`` exists and ``overwrite`` is false; return it as a Path.

    The toolkit's save functions replace nothing the caller did not ask them to replace.
    """
    path = Path(path)
    if not overwrite and (path.exists() or path.is_symlink()):
        raise DestinationExistsError(f"{path} already exists; pass overwrite=True to replace it, or choose another path.")
    return path


@contextmanager
def atomic_path(path: str | os.PathLike, *, mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends, it replaces ``path`` in one rename.

    Parent folders are created. If the block raises, the temporary file is deleted and ``path`` is
    untouched; a destination that is a folder, or whose folder cannot be made or written, is an
    :class:`UnwritableDestinationError` before anything is written. ``mode`` is the file's permission
    (``mkstemp`` creates 0600; results are meant to be shared).
    """
    path = Path(path)
    if path.is_dir():
        raise UnwritableDestinationError(f"{path} is a folder, and a file is written here: give a file path "
                                         "(a new name, or a name inside that folder).")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:  # a parent that is a file, a read-only or virtual file system (/proc), no permission
        raise UnwritableDestinationError(f"Cannot write {path}: {err.strerror or err} ({err.filename or path.parent}). "
                                         "Choose a path in a folder you can write.") from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; return the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
