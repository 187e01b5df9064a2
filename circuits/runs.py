"""Run folders: where an experiment writes results.json, figures and report.html.

Every file is written atomically (a temporary file in the same folder, then
``os.replace``), so an interrupted run never leaves a half-written file. A run
refuses to write into an existing, non-empty folder unless told to overwrite.
"""

from __future__ import annotations

import ctypes
import gc
import json
import math
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from circuits.errors import ToolkitError


class OutputExistsError(ToolkitError, FileExistsError):
    """The output folder already holds a run."""


def default_run_dir(name: str, root: str | Path = "runs") -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>``."""
    return Path(root) / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def prepare_run_dir(path: str | Path, overwrite: bool = False) -> Path:
    """Create the run folder; refuse a non-empty existing one unless ``overwrite``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputExistsError(f"Output path {path} exists and is not a folder; choose another --out.")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise OutputExistsError(
            f"Output folder {path} already holds a run; pass --overwrite to replace its files or choose another --out."
        )
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # tensors and numpy arrays
        return _jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {k: _jsonable(getattr(value, k)) for k in value.__dataclass_fields__}
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON (tensors become lists, NaN becomes null), atomically."""
    return write_text_atomic(path, json.dumps(_jsonable(obj), indent=2, allow_nan=False) + "\n")


@dataclass
class StageTimer:
    """Wall time per named stage: ``with timer.stage("path patching"): ...``; ``timer.seconds`` for results.json."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 2)

    @property
    def total(self) -> float:
        return round(sum(self.seconds.values()), 2)


def release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    Call it between runs that each report their peak resident memory: otherwise heap that the
    allocator kept from an earlier run counts in the next run's peak.
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
