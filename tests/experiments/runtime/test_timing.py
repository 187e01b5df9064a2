"""experiments.runtime.timing: a call's value, wall time and this process's CPU time; sleeping costs wall time only."""

import time

from experiments.runtime.timing import wall_and_cpu


def test_sleeping_is_wall_time_and_busy_work_is_cpu_time():
    value, wall, cpu = wall_and_cpu(lambda: (time.sleep(0.2), "done")[1])
    assert value == "done" and wall >= 0.2 and cpu < 0.1

    def busy():
        end = time.process_time() + 0.15
        while time.process_time() < end:
            pass
        return 7

    value, wall, cpu = wall_and_cpu(busy)
    assert value == 7 and cpu >= 0.15 and wall >= 0.1
