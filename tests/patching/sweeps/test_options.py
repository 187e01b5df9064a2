"""patching.sweeps.options: a sweep's settings as one record, None meaning the defaults, unused settings refused."""

import math

import pytest

from circuits.errors import InputError
from patching.sweeps.options import SweepOptions, sweep_options


def test_none_means_the_defaults_and_the_defaults_are_the_methods():
    opts = SweepOptions(metric="prob", memory_mb=64, batch_size=4)
    assert sweep_options(opts, "edge_patch") is opts and sweep_options(None, "edge_patch") == SweepOptions()
    assert SweepOptions().budget(2048.0) == 2048.0 and opts.budget(2048.0) == 64.0
    assert SweepOptions().batch(32) == 32 and opts.batch(32) == 4
    assert SweepOptions().shows_progress(False) is False and SweepOptions(progress=True).shows_progress(False) is True


def test_a_setting_the_method_does_not_use_is_refused_and_defaults_pass():
    applies = ("batch_size", "progress")
    assert sweep_options(SweepOptions(batch_size=8, progress=False), "knockout", applies).batch_size == 8
    with pytest.raises(InputError, match=r"knockout does not use the sweep option\(s\) metric, reuse_prefix \(it uses "
                                         r"batch_size, progress\)"):
        sweep_options(SweepOptions(metric="prob", reuse_prefix=False), "knockout", applies)


def test_bad_settings_are_refused():
    with pytest.raises(InputError, match="options must be a patching.SweepOptions"):
        sweep_options({"metric": "logit"}, "path_patch")
    for bad in (0, -1.0, math.inf, True):
        with pytest.raises(InputError, match="memory_mb must be a finite number of MB > 0"):
            SweepOptions(memory_mb=bad)
    with pytest.raises(InputError, match="batch_size must be an integer >= 1"):
        SweepOptions(batch_size=0)
