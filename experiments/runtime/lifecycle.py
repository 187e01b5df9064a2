"""One lifecycle for every experiment: run folder, threads, seed, model, timed stages, results.json, status.

An experiment is a config (a :class:`experiments.runtime.settings.RunSettings` subclass) and a
function of a :class:`Run` that does the work in named stages::

    def run(cfg: CircuitConfig, *, loader: ModelLoader | None = None) -> dict:
        return run_experiment("circuit", cfg, _stages, loader=loader)

    def _stages(run: Run[CircuitConfig, None]) -> None:
        model = run.load_model()
        with run.stage("data", "building the prompts"):
            with run.step("scoring them"):
                run.results["n_kept"] = ...

:class:`Run` is the one record every stage reads: the settings (``run.cfg``), the folder
(``run.out``), ``run.results`` (results.json), ``run.save()``, the model through the injected loader
(``run.load_model()``), the stages (``run.stage``) and their sub-steps (``run.step``). What an
experiment carries from stage to stage (its model, data, scores so far) is its own dataclass in
``run.state``, typed by the second parameter: ``Run[PipelineConfig, PipelineState]``.

Progress goes to stderr through one printer (:class:`experiments.runtime.run_folder.StageTimer`):
given a ``plan`` (the stage names in order), every planned stage prints ``[3/10] knockout ...`` as
it starts and its time as it ends; an unplanned stage prints its ``message`` (if any) and
``done in N s``; ``run.step(message)`` prints a sub-step the same way. A stage that works through known units
(methods, prompt sets, learning steps) says how far it has come and when it will be done with
``run.progress(total, label)`` (:class:`experiments.runtime.timing.Progress`): ``methods: 2/5, elapsed 10m12s,
ETA 15m18s`` every ~15 s of work and at the end. An experiment's plan is its module's ``plan(cfg)``: the stages
a run with those flags goes through, in order.

:func:`run_experiment` does the rest, the same way for every experiment:

1. the run folder (:func:`experiments.runtime.run_folder.prepare_run_dir`): ``--out`` or
   ``runs/<name>-<timestamp>``, marked as the toolkit's, ``results.json`` with status ``running``;
   a folder the toolkit did not write is refused, an earlier run is replaced only with ``--overwrite``
   and only once this run completes;
2. torch's CPU threads (``--threads``) and every random generator seeded from ``--seed``, here and
   nowhere else;
3. the stages: each ``with run.stage(name)`` is timed into ``results["seconds"]`` and saves
   ``results.json`` when it ends, so a failure late in a run keeps what the earlier stages found;
4. the status: ``complete`` after the last write, ``failed: <stage>: <why>`` when anything raises
   (``failed: <stage>: interrupted`` on Ctrl-C, and on SIGTERM under :func:`experiments.runtime.cli.run_cli`),
   and the exception goes on to the command line.

The model comes from an injected loader (``loader=``, default :func:`circuits.loading.load_model`):
tests pass a function that returns a tiny model instead of monkeypatching the loading module.

A run of several processes (``accelerate launch``, ``torchrun``) calls :func:`run_experiment` on every
process with ``main_process=`` true on one of them only: that one prepares, saves and completes (or
fails) the run folder; the others run the same stages with threads and seeds set, but write nothing
(their :attr:`Run.main_process` is false, their ``save()`` and stage ends write no file).

A run may span several commands (``experiments.precise_sft --resume``):

* ``resume=True`` continues ``--out`` as it stands when the toolkit wrote it: it is neither refused nor
  moved aside; ``results=`` are what it holds (the experiment reads them and checks the settings
  match *before* calling, so a mismatch leaves the folder untouched); its status goes back to
  ``running``, and ``seconds`` and ``wall_seconds`` go on adding up over the commands
  (:attr:`Run.earlier_wall_seconds`). A folder the toolkit did not write is prepared as usual.
* stages that did only part of the work set ``run.complete = False``: the run then ends with its
  results saved and status ``running`` (for a later ``--resume``), not ``complete``.

``stage_seconds=False`` leaves ``results["seconds"]`` to the stages (``merge --config`` records the
merge's time there): stage times are then not recorded, results.json is written by ``run.save()`` and
at the end only, and a failure is recorded as ``failed: <name>: <why>``.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Generic, Optional, TypeVar

from experiments.runtime.run_folder import (
    StageTimer, complete_run, default_run_dir, fail_run, prepare_run_dir, read_marker, read_status, save_results,
)
from experiments.runtime.settings import RunSettings
from experiments.runtime.timing import Progress

#: ``loader(name_or_folder, *, device, dtype) -> HookedTransformer``; :func:`circuits.loading.load_model` by default.
ModelLoader = Callable[..., Any]
ConfigT = TypeVar("ConfigT", bound=RunSettings)
StateT = TypeVar("StateT")


def default_loader(name: str, *, device: str = "auto", dtype: Optional[str] = None):
    """:func:`circuits.loading.load_model` (imported here, so a parser is built before TransformerLens loads)."""
    from circuits import load_model

    return load_model(name, device=device, dtype=dtype)


def set_threads(threads: int) -> None:
    """``--threads N``: torch CPU threads (0 keeps torch's default)."""
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (methods that draw take explicit generators too)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class Run(Generic[ConfigT, StateT]):
    """One experiment run in progress: its settings, folder, results (``results.json``), stage timer and the
    experiment's own state (``state``: what its stages carry from one to the next, set by the experiment)."""

    name: str
    cfg: ConfigT
    out: Path
    loader: ModelLoader
    results: dict = field(default_factory=dict)
    timer: StageTimer = field(default_factory=StageTimer)
    #: the experiment's own dataclass (model, data, scores so far); None until its first stage sets it
    state: StateT = None  # type: ignore[assignment]
    started: float = field(default_factory=time.perf_counter)
    #: False on the other processes of a launch: the folder ``out`` is the main process's, never written here
    main_process: bool = True
    #: set False by stages that did only part of the work: the run ends ``running`` (resumable), not ``complete``
    complete: bool = True
    #: the wall time of the earlier commands of a resumed run (``resume=True``), counted in :attr:`wall_seconds`
    earlier_wall_seconds: float = 0.0

    def stage(self, name: str, message: Optional[str] = None) -> ContextManager[None]:
        """Time ``name`` into ``results["seconds"]``; save results.json after it; on an error, mark the run failed.

        A planned stage prints its number and time; otherwise ``message`` (what the stage does, for the
        terminal), if given, is printed before it starts and its time after.
        """
        return self.timer.stage(name, message)

    def step(self, message: str) -> ContextManager[None]:
        """A sub-step of a stage on the terminal: ``message ...`` before it, its time after (not recorded)."""
        return self.timer.step(message)

    def progress(self, total: int, label: str) -> Progress:
        """A progress line for ``total`` units of work of the stage now running: call ``.advance()`` as each ends
        (``label: i/total, elapsed ..., ETA ...``, at most every ~15 s and at the end, beside the stage lines)."""
        return Progress(total, label)

    def load_model(self, name: Optional[str | Path] = None, *, stage: Optional[str] = "load model"):
        """The model ``name`` (default ``cfg.model``) through the injected loader, on the run's device and dtype,
        timed as the stage ``stage`` (None: no stage of its own, e.g. a model loaded inside a stage)."""
        name = str(name or self.cfg.model)
        if stage is None:
            return self.loader(name, device=self.cfg.device, dtype=self.cfg.dtype)
        with self.stage(stage, f"loading {name}"):
            return self.loader(name, device=self.cfg.device, dtype=self.cfg.dtype)

    def save(self) -> None:
        """Write results.json now (status ``running``); on a process that is not the main one, nothing."""
        if self.main_process:
            save_results(self.out, self.results)

    @property
    def wall_seconds(self) -> float:
        """Seconds since this command started, plus :attr:`earlier_wall_seconds`."""
        return round(self.earlier_wall_seconds + time.perf_counter() - self.started, 1)


def run_experiment(name: str, settings: RunSettings, stages: Callable[[Run], Any], *,
                   loader: Optional[ModelLoader] = None, results: Optional[dict] = None,
                   default_out: Optional[str] = None, main_process: bool = True, resume: bool = False,
                   stage_seconds: bool = True, plan: Optional[list[str]] = None) -> dict:
    """Run ``stages(run)`` under the lifecycle of the module docstring; return the final results (as results.json
    holds them, ``status`` first).

    ``results``: the keys results.json starts with (default: ``settings``, every field of the config);
    ``default_out``: the folder name used when ``--out`` is not given (default ``runs/<name>-<timestamp>``);
    ``main_process``: false on every process of a launch but one; such a process neither prepares nor
    writes the folder (``run.out`` is where the main process writes: with the default ``--out``, this
    process's own timestamp, which may differ by a second), records no status and saves nothing;
    ``resume``: continue ``--out`` if the toolkit wrote it, ``results`` being what it holds;
    ``stage_seconds``: false leaves ``results["seconds"]`` to the stages (both: see the module docstring);
    ``plan``: the stage names in the order they will run, numbered on the terminal as they start.
    """
    folder = settings.out or default_run_dir(default_out or name)
    continuing = resume and main_process and read_marker(folder) is not None
    if continuing or not main_process:
        out = Path(folder)
    else:
        out = prepare_run_dir(folder, overwrite=settings.overwrite)
    run = Run(name, settings, out, loader or default_loader,
              results=dict(results) if results is not None else {"settings": asdict(settings)},
              timer=StageTimer(plan=plan), main_process=main_process)
    run.results.pop("status", None)  # results read back from a run folder carry its old status; the lifecycle owns it
    if continuing:
        run.earlier_wall_seconds = float(run.results.get("wall_seconds") or 0.0)
        if isinstance(run.results.get("seconds"), dict):
            run.timer.seconds.update(run.results["seconds"])
        save_results(out, run.results)  # status back to running
    if main_process and stage_seconds:
        run.timer.run_dir, run.timer.results = out, run.results
    if stage_seconds:
        run.results["seconds"] = run.timer.seconds
    try:
        set_threads(settings.threads)
        seed_everything(settings.seed)
        stages(run)
    except BaseException as err:
        # a stage that raised has already written ``failed: <stage>: ...``; anything else fails here
        why = "interrupted" if isinstance(err, KeyboardInterrupt) else f"{type(err).__name__}: {err}"
        if main_process and (read_status(out) or "").startswith("running"):
            fail_run(out, run.results, f"{name}: {why}")
        raise
    if stage_seconds:
        run.results["seconds"] = run.timer.seconds
    run.results["wall_seconds"] = run.wall_seconds
    if main_process:
        (complete_run if run.complete else save_results)(out, run.results)
    return {"status": "complete" if run.complete else "running", **run.results}
