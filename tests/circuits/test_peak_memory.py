"""circuits.peak_memory: after a reset, the peak is this stretch's own, and it sees memory touched in between."""

import mmap
import os

import pytest

from circuits.peak_memory import peak_rss, reset_peak_rss


def test_a_reset_peak_sees_new_memory_and_never_exceeds_the_process_peak():
    if not os.access("/proc/self/clear_refs", os.W_OK) or not reset_peak_rss():
        pytest.skip("the peak-RSS mark cannot be reset on this system")
    before = peak_rss(since_reset=True)
    # A fresh anonymous mapping: a heap allocation may reuse pages that earlier tests left resident.
    block = mmap.mmap(-1, 256 * 2**20)
    for offset in range(0, len(block), mmap.PAGESIZE):  # touch every page
        block[offset] = 120
    after = peak_rss(since_reset=True)
    assert after - before >= 200 * 2**20
    assert peak_rss(since_reset=False) >= after - 2**20  # the process's peak so far includes this stretch's
    block.close()
