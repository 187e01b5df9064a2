"""What every experiment shares: its settings, its command line, and one lifecycle from run folder to status.

* :class:`RunSettings` (:mod:`experiments.runtime.settings`): model, device, dtype, threads, seed,
  out and overwrite, one default and one help text each; every experiment's config extends it;
* :mod:`experiments.runtime.cli`: flags generated from a config (:func:`option`), parse-time checks,
  errors as one line and a hint (exit status 2);
* :func:`run_experiment` and :class:`Run` (:mod:`experiments.runtime.lifecycle`): the run folder with
  its status (running -> complete / failed: <stage>: <why>), threads, seeds, the injected model
  loader, timed stages that save results.json as they end and print one kind of progress line,
  and a typed slot (``run.state``) for what an experiment carries from stage to stage;
* :mod:`experiments.runtime.run_folder`: run folders that never lose a file the toolkit did not write;
* :mod:`experiments.runtime.edge_circuit`: the edge-circuit stage ``experiments.circuit`` and the
  arithmetic pipeline share (an experiment never imports another: what two share lives here);
* :mod:`experiments.runtime.timing`, :mod:`experiments.runtime.bench_prompts`: what the benchmarks share.
"""

from experiments.runtime.cli import option, run_cli
from experiments.runtime.lifecycle import ModelLoader, Run, default_loader, run_experiment
from experiments.runtime.settings import RunSettings

__all__ = ["ModelLoader", "Run", "RunSettings", "default_loader", "option", "run_cli", "run_experiment"]
