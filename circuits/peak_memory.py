"""Peak resident memory of this process, measured per stage.

The kernel keeps a high-water mark of the process's resident set (``VmHWM`` in
``/proc/self/status``). Writing ``5`` to ``/proc/self/clear_refs`` resets it (Linux), so a stage's
own peak is ``peak_rss(reset_peak_rss())`` read after the stage. Where the reset is not possible
(other systems, restricted /proc), :func:`peak_rss` falls back to the process's peak so far
(``ru_maxrss``), which may be an earlier stage's. Finetuning records its run's peak this way, and
``experiments.cost_model`` each sweep's.
"""

from __future__ import annotations

import resource


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (Linux: ``5`` to /proc/self/clear_refs); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss(since_reset: bool) -> int:
    """Peak resident memory in bytes: since :func:`reset_peak_rss` (VmHWM), else the process's peak so far."""
    if since_reset:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    # ru_maxrss is KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
