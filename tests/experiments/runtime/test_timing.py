"""experiments.runtime.timing: a call's value, wall time and this process's CPU time (sleeping costs wall time only), and
the progress line of a long stage: how far it has come and when it will be done."""

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


class FakeClock:
    """A clock the test moves by hand: progress lines depend on elapsed time, not on how fast the test runs."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_durations_read_as_seconds_minutes_or_hours():
    from experiments.runtime.timing import format_duration

    assert [format_duration(s) for s in (0, 44.6, 65, 3599, 3600, 7380)] == ["0s", "45s", "1m05s", "59m59s", "1h00m",
                                                                            "2h03m"]


def test_progress_prints_an_eta_at_most_every_so_often_and_at_the_end():
    from experiments.runtime.timing import Progress

    clock, lines = FakeClock(), []
    progress = Progress(4, "circuit methods", every=15, clock=clock, write=lines.append)
    clock.now += 65
    progress.advance()  # a minute since the start: printed, with the mean unit's time for each unit left
    assert lines == ["  circuit methods: 1/4, elapsed 1m05s, ETA 3m15s"]
    clock.now += 5
    progress.advance()  # 5 s after the last line: quiet
    assert len(lines) == 1
    clock.now += 10
    progress.advance()  # 15 s after the last line: printed
    assert lines[-1] == "  circuit methods: 3/4, elapsed 1m20s, ETA 27s"
    clock.now += 1
    progress.advance()  # the last unit: always printed, without an ETA
    assert lines[-1] == "  circuit methods: 4/4, elapsed 1m21s" and len(lines) == 3


def test_work_that_needed_none_leaves_the_estimate_to_the_work_that_did():
    from experiments.runtime.timing import Progress

    clock, lines = FakeClock(), []
    progress = Progress(3, "stability runs", every=0, clock=clock, write=lines.append)
    progress.skip()  # the comparison's run stood for this one: off the total, not a unit done in 0 s
    clock.now += 120
    progress.advance()
    assert lines == ["  stability runs: 1/2, elapsed 2m00s, ETA 2m00s"]


def test_progress_counts_the_stages_a_library_loop_opens():
    from contextlib import contextmanager

    from experiments.runtime.timing import Progress

    clock, lines, opened = FakeClock(), [], []

    @contextmanager
    def stage(name):
        opened.append(name)
        yield

    progress = Progress(2, "methods", every=0, clock=clock, write=lines.append)
    counted = progress.counting(stage)
    for name in ("EAP", "top-n"):
        with counted(f"circuit method {name}"):
            clock.now += 30
    assert opened == ["circuit method EAP", "circuit method top-n"]
    assert lines == ["  methods: 1/2, elapsed 30s, ETA 30s", "  methods: 2/2, elapsed 1m00s"]


def test_a_run_prints_its_progress_on_stderr_beside_the_stage_lines(tmp_path, capsys):
    from experiments.runtime import RunSettings, run_experiment

    def stages(run):
        with run.stage("work"):
            progress = run.progress(2, "units")
            progress.advance()
            progress.advance()

    run_experiment("demo", RunSettings(out=str(tmp_path / "run")), stages, plan=["work"])
    err = capsys.readouterr().err
    assert err.index("[1/1] work ...") < err.index("  units: 2/2, elapsed") < err.index("work: 0 s")
