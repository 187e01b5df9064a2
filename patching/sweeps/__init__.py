"""What every sweep of :mod:`patching` shares: the prompt forms it accepts, cached forwards, metrics, options, results.

* :mod:`patching.sweeps.inputs`: the prompt forms every method accepts, checked once;
* :mod:`patching.sweeps.forward`: cached runs, shared-prefix reuse, END-only block pieces, frozen weights;
* :mod:`patching.sweeps.metrics`: what a run is scored by;
* :mod:`patching.sweeps.options`: :class:`patching.SweepOptions`, a sweep's metric, batching, memory budget, prefix
  reuse and progress as one record;
* :mod:`patching.sweeps.results`: the result containers (node scores, knockout curves) and their figures.
"""
