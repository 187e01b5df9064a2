"""patching.options: a sweep's settings as one record, keywords replacing its fields, unknown keywords refused."""

import math

import pytest

from circuits.errors import InputError
from patching.options import FIELDS, SweepOptions, split_sweep_keywords, sweep_options


def test_keywords_replace_the_records_fields_and_defaults_are_the_methods():
    base = SweepOptions(metric="prob", memory_mb=64)
    opts = sweep_options(base, {"batch_size": 4}, "edge_patch")
    assert (opts.metric, opts.memory_mb, opts.batch_size) == ("prob", 64, 4) and base.batch_size is None
    assert SweepOptions().budget(2048.0) == 2048.0 and opts.budget(2048.0) == 64.0
    assert SweepOptions().shows_progress(False) is False and SweepOptions(progress=True).shows_progress(False) is True


def test_split_sweep_keywords_takes_only_the_sweep_options():
    opts, rest = split_sweep_keywords({"options": SweepOptions(reuse_prefix=False), "metric": "logprob",
                                       "shard": 3, "ig_steps": 5}, "distributed.distributed_edge_attribution")
    assert (opts.metric, opts.reuse_prefix) == ("logprob", False) and rest == {"shard": 3, "ig_steps": 5}


def test_bad_settings_are_refused_with_the_fields_listed():
    with pytest.raises(InputError, match=r"path_patch\(\) got unexpected keyword argument\(s\) batchsize; its sweep "
                                         r"options are " + ", ".join(FIELDS)):
        sweep_options(None, {"batchsize": 3}, "path_patch")
    with pytest.raises(InputError, match="options must be a patching.SweepOptions"):
        sweep_options({"metric": "logit"}, {}, "path_patch")
    for bad in (0, -1.0, math.inf, True):
        with pytest.raises(InputError, match="memory_mb must be a finite number of MB > 0"):
            SweepOptions(memory_mb=bad)
    with pytest.raises(InputError, match="batch_size must be an integer >= 1"):
        SweepOptions(batch_size=0)
