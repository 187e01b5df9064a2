"""circuits.peak_memory: after a reset, the peak is this stretch's own, and it sees memory touched in between."""

import os

import pytest

from circuits.peak_memory import peak_rss, reset_peak_rss


def test_a_reset_peak_sees_new_memory_and_never_exceeds_the_process_peak():
    if not os.access("/proc/self/clear_refs", os.W_OK) or not reset_peak_rss():
        pytest.skip("the peak-RSS mark cannot be reset on this system")
    before = peak_rss(since_reset=True)
    block = bytearray(256 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    after = peak_rss(since_reset=True)
    assert after - before >= 200 * 2**20
    assert peak_rss(since_reset=False) >= after - 2**20  # the process's peak so far includes this stretch's
    del block
