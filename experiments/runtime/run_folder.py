"""Run folders: where an experiment writes results.json, figures and report.html.

Every file is written atomically (a temporary file in the same folder, then
``os.replace``), so an interrupted run never leaves a half-written file.

A run folder carries a marker file (``.arith-circuits-run.json``) that says the
toolkit wrote it, and ``results.json`` carries a ``status``:

* ``running`` from the moment the folder is prepared, with the results of every
  finished stage saved as it ends (`StageTimer` with ``run_dir``), so a failure in
  the last stage keeps everything before it (a ``running`` folder whose process is
  gone was interrupted);
* ``failed: <stage>: <why>`` when a stage raised;
* ``complete`` only after the last write (`complete_run`).

`prepare_run_dir` never deletes anything. It refuses a non-empty folder unless
``overwrite``; with ``overwrite`` it refuses a folder the toolkit did not write
(no marker) and moves a toolkit run aside (``<name>.replaced-<time>`` next to it),
so nothing stale (an old results.json, report.html or figure) can survive into
the new run. A folder that holds only empty folders (an interrupted run's
``figures/``) counts as empty. What happens to the run moved aside:

* the new run **completes** (`complete_run`): the moved-aside run is deleted, and so
  is every run *it* had moved aside and still kept (a failed ``--overwrite`` run that
  is itself overwritten leaves its predecessor behind otherwise), so no
  ``<name>.replaced-*`` folder of this output is left;
* the new run **fails** or is interrupted (``failed: ...`` or ``running``): nothing is
  deleted. The old run stays, untouched and complete, at the path printed when it was
  moved and recorded as ``replaced`` in the new folder's marker (an absolute path).
  To recover it, delete the failed folder and rename ``<name>.replaced-<time>`` back to
  ``<name>``; or rerun with ``--overwrite``, and once that run completes both the failed
  run and the old one are deleted.

An output folder that cannot be created or written (no permission, a read-only disk)
is refused before any work with :class:`OutputNotWritableError`, one line naming the folder.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import json
import math
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from circuits.atomic_files import write_text_atomic
from circuits.errors import ToolkitError


class OutputExistsError(ToolkitError, FileExistsError):
    """The output folder already holds a run, or holds files the toolkit did not write."""


class OutputNotWritableError(ToolkitError, PermissionError):
    """The output folder (or the folder it goes in) cannot be created or written."""


RUN_MARKER = ".arith-circuits-run.json"
RESULTS_FILE = "results.json"
MARKER_FORMAT = "arith-circuits-run"


def default_run_dir(name: str, root: str | Path = "runs") -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>``."""
    return Path(root) / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _holds_only_empty_folders(path: Path) -> bool:
    return all(child.is_dir() and not child.is_symlink() and _holds_only_empty_folders(child) for child in path.iterdir())


def read_marker(path: str | Path) -> dict | None:
    """The run marker of folder ``path`` (None when the toolkit did not write that folder)."""
    try:
        marker = json.loads((Path(path) / RUN_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return marker if isinstance(marker, dict) and marker.get("format") == MARKER_FORMAT else None


def prepare_run_dir(path: str | Path, overwrite: bool = False) -> Path:
    """Create the run folder, mark it as the toolkit's and start results.json with status ``running``.

    Refuses a non-empty existing folder unless ``overwrite``; with ``overwrite``, refuses a
    folder without the toolkit's marker and moves a marked one aside (see the module
    docstring). Nothing is deleted here, so callers may prepare before validating.
    """
    path = Path(path)
    with _writable(path):  # a folder that cannot be created, read or written: one line, before any work
        return _prepare(path, overwrite)


def _prepare(path: Path, overwrite: bool) -> Path:
    if path.exists() and not path.is_dir():
        raise OutputExistsError(f"Output path {path} exists and is not a folder; choose another --out.")
    replaced = None
    if path.is_dir() and not _holds_only_empty_folders(path):
        if read_marker(path) is None:  # checked first: --overwrite would not help, so it is not suggested
            raise OutputExistsError(
                f"Output folder {path} holds files this toolkit did not write (no {RUN_MARKER}); "
                "--overwrite only replaces run folders the toolkit wrote: move it away yourself or choose another --out."
            )
        if not overwrite:
            status = read_status(path) or "unknown status"
            raise OutputExistsError(
                f"Output folder {path} already holds a run ({status}); pass --overwrite to replace it "
                "or choose another --out."
            )
        replaced = path.with_name(f"{path.name}.replaced-{datetime.now().strftime('%Y%m%d-%H%M%S-%f')}").absolute()
        os.replace(path, replaced)  # one rename: the old run is either here or there, never half-moved
        print(f"moved the earlier run in {path} aside to {replaced}; it is deleted when this run completes "
              "(kept if it fails)")
    path.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path / RUN_MARKER, {"format": MARKER_FORMAT, "created": datetime.now().isoformat(),
                                          "replaced": None if replaced is None else str(replaced)})
    save_results(path, {}, status="running")
    return path


@contextmanager
def _writable(path: Path) -> Iterator[None]:
    """Turn "cannot create or write ``path``" into one :class:`OutputNotWritableError` (no traceback)."""
    try:
        yield
    except PermissionError as err:
        raise OutputNotWritableError(
            f"Cannot write the output folder {path}: {err.strerror or 'permission denied'} ({err.filename or path}). "
            "Choose an --out you can write to, or fix the folder's permissions.") from None
    except OSError as err:
        if err.errno not in (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.ENOENT):
            raise
        raise OutputNotWritableError(
            f"Cannot write the output folder {path}: {err.strerror} ({err.filename or path}). "
            "Choose another --out.") from None


def read_status(path: str | Path) -> str | None:
    """The ``status`` in ``path/results.json`` (None when there is none)."""
    try:
        results = json.loads((Path(path) / RESULTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return results.get("status") if isinstance(results, dict) else None


def save_results(path: str | Path, results: dict, *, status: str = "running") -> Path:
    """Write ``results`` to ``path/results.json`` with ``status`` first, atomically."""
    return write_json_atomic(Path(path) / RESULTS_FILE, {"status": status, **{k: v for k, v in results.items() if k != "status"}})


def fail_run(path: str | Path, results: dict, why: str) -> Path:
    """Save the results so far with status ``failed: <why>``; the run moved aside (if any) is kept."""
    return save_results(path, results, status=f"failed: {' '.join(why.split())}")


def complete_run(path: str | Path, results: dict) -> Path:
    """Save the final results with status ``complete``, then delete the run this one replaced (and its own).

    A replaced run that had itself replaced one (and failed, so kept it) hands that one on: the chain
    is followed, so completing leaves no ``<name>.replaced-*`` folder (module docstring).
    """
    out = save_results(path, results, status="complete")
    for old in replaced_runs(path):
        shutil.rmtree(old)
    return out


def replaced_runs(path: str | Path) -> list[Path]:
    """The moved-aside runs ``path`` still keeps: the one its marker names, the one *its* marker names, ...

    Only folders that still carry the toolkit's marker are listed (what the toolkit wrote), each once, and only
    this output's own: ``<name>.replaced-*`` beside ``path``. A run folder copied from another keeps the other's
    marker, whose chain names the other output's moved-aside runs: those are not this run's to delete.
    """
    chain, seen = [], set()
    path = Path(path)
    replaced = (read_marker(path) or {}).get("replaced")
    while isinstance(replaced, str) and replaced:
        old = Path(replaced)
        if not old.is_absolute():  # markers of older versions: relative to the run folder's parent
            old = path.parent / old.name
        if not _moved_aside_from(old, path):
            break
        if old.resolve() in seen or not old.is_dir() or read_marker(old) is None:
            break
        seen.add(old.resolve())
        chain.append(old)
        replaced = read_marker(old).get("replaced")
    return chain


def _moved_aside_from(old: Path, path: Path) -> bool:
    """Whether ``old`` is a name :func:`prepare_run_dir` gives a run it moves aside from ``path``."""
    return old.resolve().parent == path.resolve().parent and old.name.startswith(f"{path.name}.replaced-")


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
    """Wall time per named stage: ``with timer.stage("path patching"): ...``; ``timer.seconds`` for results.json.

    Given ``run_dir`` and the run's ``results`` dict, it also saves the results (status
    ``running``, with ``seconds``) after every stage, and marks the run ``failed: <stage>: <why>``
    when a stage raises, so an error late in a run keeps what the earlier stages found.

    It is also the run's one progress printer, on stderr. Given a ``plan`` (the stage names in the
    order they will run), every planned stage prints a lasting line as it starts (``[3/10] knockout ...``)
    and its time as it ends; a stage that is not planned prints its ``message`` if it has one
    (``message ...``, then ``done in N s``), and :meth:`step` prints a sub-step of a stage the same way.
    """

    seconds: dict[str, float] = field(default_factory=dict)
    run_dir: Path | None = None
    results: dict | None = None
    plan: list[str] | None = None

    @contextmanager
    def stage(self, name: str, message: str | None = None) -> Iterator[None]:
        number = f"[{self.plan.index(name) + 1}/{len(self.plan)}] " if self.plan and name in self.plan else None
        if number:
            _progress(f"{number}{name} ...")
        elif message:
            _progress(f"{message} ...")
        start = time.perf_counter()
        try:
            yield
        except BaseException as err:
            self._add(name, start)
            if self.run_dir is not None:
                why = "interrupted" if isinstance(err, KeyboardInterrupt) else f"{type(err).__name__}: {err}"
                fail_run(self.run_dir, {**(self.results or {}), "seconds": self.seconds}, f"{name}: {why}")
            raise
        self._add(name, start)
        if number:
            _progress(f"{' ' * len(number)}{name}: {time.perf_counter() - start:.0f} s")
        elif message:
            _progress(f"  done in {time.perf_counter() - start:.0f} s")
        if self.run_dir is not None:
            save_results(self.run_dir, {**(self.results or {}), "seconds": self.seconds})

    @contextmanager
    def step(self, message: str) -> Iterator[None]:
        """``message ...``, then ``done in N s``: a sub-step of a stage, shown but not recorded in ``seconds``."""
        _progress(f"{message} ...")
        start = time.perf_counter()
        yield
        _progress(f"  done in {time.perf_counter() - start:.0f} s")

    def _add(self, name: str, start: float) -> None:
        self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 2)

    @property
    def total(self) -> float:
        return round(sum(self.seconds.values()), 2)

    def table(self) -> str:
        """The stage times as aligned lines, slowest first, with the total."""
        width = max((len(k) for k in self.seconds), default=5)
        lines = [f"  {k:<{width}}  {v:7.1f} s" for k, v in sorted(self.seconds.items(), key=lambda kv: -kv[1])]
        return "\n".join(lines + [f"  {'total':<{width}}  {self.total:7.1f} s"])


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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
