"""Benchmark: how long a learned circuit takes, per step and whole, its settings side by side in one process.

    python -m experiments.bench_learn --out runs/bench_learn

1. Loads the model and keeps ``--n-prompts`` correctly answered prompts of one operation
   (:func:`circuits.prompt_splits.correct_prompt_splits`, its training split).
2. Per step: each arm of :func:`arms` (a :class:`patching.edges.learn.LearnConfig`) learns ``--steps``
   steps on those prompts, the arms alternating over ``--rounds`` rounds so that load changes on a
   shared machine hit all alike; a step's time is the wall time of its forward, backward and update
   (:attr:`patching.edges.learn.LearnedCircuit.step_seconds`), the first step of a run left out
   (allocation). Ratios are against the first arm, the step ``experiments.circuit`` took before
   the top-n default (random-budget masks, two budgets of 8 prompts).
3. The model alone: the default step's sequences (its circuits x prompts, tiled as the step tiles them) run
   forward and backward through every block with no mixing hooks, the gradient taken at the embeddings: what
   the step costs without the edge masks, so the difference is what the hooks add.
4. Whole: the default learned circuit (``patching.edges.learn.DEFAULT_CIRCUIT``) as the commands find
   it: the EAP-IG-inputs warm start on ``--warm-start-prompts`` prompts, then every step, timed end to
   end; the goal is at most ``--goal-seconds``.
5. With ``--profile-steps N``: N steps of the default under torch's profiler, their CPU time split into the
   mixing hooks' forward (:data:`patching.edges.mixing.SENDERS_RANGE`, :data:`~patching.edges.mixing.RECEIVERS_RANGE`),
   their backward (``_MixBelowBackward``) and the rest (the model, the loss, the update, and the backward of the
   senders' head results), with the operators by self time in ``<out>/profile.txt``. The profiler adds a cost
   per operator, so the shares are what to read, not the seconds.
6. Writes ``<out>/results.json``: per arm the median and every step time, the ratios, the model alone, the whole
   run's wall time against the goal, the profile's shares, the threads and load average (a measurement beside
   other work is an upper bound).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass

from circuits.errors import InputError
from experiments.runtime import ModelLoader, Run, RunSettings, cli, run_experiment
from experiments.runtime.cli import option, override
from experiments.runtime.settings import PromptSettings

DEFAULT_OUT = "runs/bench_learn"  # one folder, not runs/<name>-<timestamp>


@dataclass(frozen=True)
class BenchLearnConfig(PromptSettings, RunSettings):
    """Every flag of ``python -m experiments.bench_learn`` beyond :class:`RunSettings`, with its default."""

    op: str = option("+", "the operation whose correct prompts the circuits learn on")
    n_prompts: int = override(PromptSettings, "n_prompts", 64, "correct prompts the circuits learn on")
    steps: int = option(6, "steps per timed run (the first is not counted)", type=cli.positive_int)
    rounds: int = option(2, "alternating runs per arm", type=cli.positive_int)
    warm_start_prompts: int = option(32, "prompts of the warm start of the whole default run",
                                     type=cli.positive_int)
    goal_seconds: float = option(60.0, "the goal for the whole default learned circuit (seconds)",
                                 type=cli.positive_float)
    profile_steps: int = option(0, "steps of the default learned under torch's profiler, their time split into "
                                   "the mixing hooks and the rest (0: no profile)", type=cli.nonnegative_int)
    only_profile: bool = option(False, "skip the timed arms, the model alone and the whole default: only the "
                                       "profile (needs --profile-steps)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.only_profile and not self.profile_steps:
            raise InputError("--only-profile needs --profile-steps N (N >= 1): the profile is all it runs.")


parser = cli.config_parser(BenchLearnConfig, "bench_learn", __doc__,
                           help_texts={"out": f"output folder (default: {DEFAULT_OUT})"})


def arms() -> dict[str, "object"]:
    """The timed settings by label: the earlier step first (the ratios' reference), the default last."""
    from patching.edges import LearnConfig
    from patching.edges.learn import DEFAULT_CIRCUIT

    return {
        "matryoshka, 2 budgets x 8 prompts (experiments.circuit before)": LearnConfig(
            method="matryoshka", samples=2, batch_size=8, progress=False),
        "top-n, all 7 sizes x 8 prompts": dataclasses.replace(DEFAULT_CIRCUIT, samples=7, batch_size=8),
        "top-n, 3 sizes x 8 prompts": dataclasses.replace(DEFAULT_CIRCUIT, samples=3, batch_size=8),
        "top-n, 2 sizes x 4 prompts": dataclasses.replace(DEFAULT_CIRCUIT, samples=2, batch_size=4),
        "default, each step in one chunk (memory_mb 8192)": dataclasses.replace(DEFAULT_CIRCUIT, memory_mb=8192.0),
        "default (DEFAULT_CIRCUIT)": DEFAULT_CIRCUIT,
    }


def time_arms(model, prompts, cfg: BenchLearnConfig) -> dict[str, dict]:
    """``--rounds`` runs of ``--steps`` steps of every arm in turn; per arm the step times after each run's first."""
    from patching.edges import learn_circuit

    settings = arms()
    times: dict[str, list[float]] = {label: [] for label in settings}
    for round_ in range(cfg.rounds):
        for label, config in settings.items():
            learned = learn_circuit(model, prompts, config=dataclasses.replace(config, steps=cfg.steps, seed=round_))
            times[label] += learned.step_seconds[1:]
            print(f"round {round_}: {label:60s} {statistics.median(learned.step_seconds[1:]):6.3f} s/step", flush=True)
    reference = statistics.median(times[next(iter(settings))])
    return {label: {"seconds_per_step_median": statistics.median(t), "seconds_per_step_all": t,
                    "circuits_per_step": min(settings[label].samples, len(settings[label].fractions))
                    if settings[label].method == "top-n" else settings[label].samples,
                    "prompts_per_step": settings[label].batch_size,
                    "speedup_over_first": reference / statistics.median(t)}
            for label, t in times.items()}


def model_alone(model, prompts, cfg: BenchLearnConfig) -> dict:
    """Seconds of a forward and backward of the default step's sequences without the mixing hooks (median of
    ``--steps`` x ``--rounds``, the first left out), on the longest group of equal-length prompts."""
    import torch

    from patching.sweeps import forward, inputs
    from patching.edges.engine import edge_mode, edge_prefix_kv, run_suffix
    from patching.edges.learn import DEFAULT_CIRCUIT
    from patching.sweeps.forward import frozen_weights
    from patching.sweeps.metrics import get_metric, score_end

    circuits = min(DEFAULT_CIRCUIT.samples, len(DEFAULT_CIRCUIT.fractions))
    times = []
    with edge_mode(model), frozen_weights(model):
        group = max(inputs.prompt_groups(model, prompts), key=len)
        rows = slice(0, min(len(group), DEFAULT_CIRCUIT.batch_size))
        tokens, answers = group.tokens[rows], group.answer_ids[rows].repeat(circuits)
        alts = None if group.alt_ids is None else group.alt_ids[rows].repeat(circuits)
        start = forward.shared_prefix_length(tokens, group.cf_tokens[rows])
        kv = edge_prefix_kv(model, tokens[:, :start]) if start else None

        def leaf(act, *, hook):  # the backward runs through every block, as a mask's gradient does
            return act.detach().requires_grad_(True)

        for _ in range(cfg.steps * cfg.rounds):
            started = time.perf_counter()
            with torch.enable_grad():
                end = run_suffix(model, tokens, start, kv, [("blocks.0.hook_resid_pre", leaf)], times=circuits)
                score_end(model, end[:, -1], answers, alts, get_metric("logit")).sum().backward()
            times.append(time.perf_counter() - started)
    median = statistics.median(times[1:])
    print(f"the model alone, {circuits} x {rows.stop} sequences forward and backward: {median:.3f} s")
    return {"seconds_median": median, "seconds_all": times[1:], "sequences": circuits * rows.stop}


def whole_default(model, prompts, cfg: BenchLearnConfig) -> dict:
    """The default learned circuit end to end: warm start, then every step (wall seconds of each part)."""
    from patching import SweepOptions
    from patching.edges import edge_attribution, learn_circuit
    from patching.edges.learn import DEFAULT_CIRCUIT

    started = time.perf_counter()
    warm = edge_attribution(model, prompts.select(range(min(len(prompts), cfg.warm_start_prompts))),
                            method="EAP-IG-inputs", options=SweepOptions(progress=False))
    warm_seconds = time.perf_counter() - started
    learned = learn_circuit(model, prompts, config=DEFAULT_CIRCUIT, init=warm)
    total = time.perf_counter() - started
    print(f"default learned circuit: warm start {warm_seconds:.1f} s + {DEFAULT_CIRCUIT.steps} steps "
          f"{learned.seconds:.1f} s = {total:.1f} s (goal <= {cfg.goal_seconds:g} s)")
    return {"warm_start_seconds": round(warm_seconds, 2), "learn_seconds": learned.seconds,
            "steps": DEFAULT_CIRCUIT.steps, "seconds": round(total, 2), "goal_seconds": cfg.goal_seconds,
            "meets_goal": total <= cfg.goal_seconds, "settings": dataclasses.asdict(DEFAULT_CIRCUIT)}


def _outermost(events, name: str) -> list:
    """The profiler events named ``name`` that no other event of that name encloses (nested ranges counted once)."""
    def enclosed(event) -> bool:
        parent = event.cpu_parent
        while parent is not None:
            if parent.name == name:
                return True
            parent = parent.cpu_parent
        return False

    return [e for e in events if e.name == name and not enclosed(e)]


def profile_default(model, prompts, cfg: BenchLearnConfig, out) -> dict:
    """``--profile-steps`` steps of the default under torch's profiler: the CPU seconds of the mixing hooks'
    forward and backward against the steps' wall time, and the operator table written to ``out``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from circuits.atomic_files import write_text_atomic
    from patching.edges import learn_circuit
    from patching.edges.learn import DEFAULT_CIRCUIT
    from patching.edges.mixing import RECEIVERS_RANGE, SENDERS_RANGE

    config = dataclasses.replace(DEFAULT_CIRCUIT, steps=cfg.profile_steps, seed=0)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        learned = learn_circuit(model, prompts, config=config)
    events = profiler.events()
    backward = "autograd::engine::evaluate_function: _MixBelowBackward"
    parts = {"senders, forward": SENDERS_RANGE, "receivers, forward": RECEIVERS_RANGE, "receivers, backward": backward}
    seconds = {label: sum(e.cpu_time_total for e in _outermost(events, name)) / 1e6 for label, name in parts.items()}
    total = sum(learned.step_seconds)
    seconds["the rest (the model, loss, update; the senders' backward)"] = total - sum(seconds.values())
    table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    write_text_atomic(out / "profile.txt", f"{cfg.profile_steps} steps of the default learned circuit "
                      f"(DEFAULT_CIRCUIT), {torch.get_num_threads()} threads, under torch.profiler\n\n{table}\n")
    shares = {label: value / total for label, value in seconds.items()}
    print(f"profile, {cfg.profile_steps} steps ({total:.1f} s with the profiler's cost): " + ", ".join(
        f"{label} {share:.0%}" for label, share in shares.items()))
    return {"steps": cfg.profile_steps, "seconds": total, "seconds_by_part": seconds, "shares": shares,
            "operators": "profile.txt"}


def run(cfg: BenchLearnConfig, *, loader: ModelLoader | None = None) -> dict:
    """Run the benchmark; return the results dict that is also written to results.json."""
    if cfg.out is None:
        cfg = dataclasses.replace(cfg, out=DEFAULT_OUT)
    return run_experiment("bench_learn", cfg, _stages, loader=loader, plan=plan(cfg),
                          results={"model": cfg.model, "settings": dataclasses.asdict(cfg)})


def plan(cfg: BenchLearnConfig) -> list[str]:
    """The stages a run with these settings goes through, in order (their names as in results.json ``seconds``)."""
    return ["load model", "prompts",
            *([] if cfg.only_profile else ["steps side by side", "the model alone", "the whole default"]),
            *(["the default under the profiler"] if cfg.profile_steps else [])]


def _stages(run: Run) -> None:
    import torch

    from circuits.prompt_splits import correct_prompt_splits

    cfg = run.cfg
    model = run.load_model()
    with run.stage("prompts"):
        prompts = correct_prompt_splits(model, cfg.task_config(), (cfg.n_prompts, 1, 1)).train
    run.results |= {"n_prompts": len(prompts), "steps_per_run": cfg.steps, "rounds": cfg.rounds,
                    "threads": torch.get_num_threads()}
    per_arm = {}
    if not cfg.only_profile:
        with run.stage("steps side by side"):
            per_arm = time_arms(model, prompts, cfg)
        with run.stage("the model alone"):
            alone = model_alone(model, prompts, cfg)
        with run.stage("the whole default"):
            whole = whole_default(model, prompts, cfg)
        run.results |= {"arms": per_arm, "model_alone": alone, "whole_default": whole}
    if cfg.profile_steps:
        with run.stage("the default under the profiler"):
            run.results["profile"] = profile_default(model, prompts, cfg, run.out)
    run.results["load_average"] = os.getloadavg()
    for label, row in per_arm.items():
        print(f"{label:60s} {row['seconds_per_step_median']:6.3f} s/step  ({row['speedup_over_first']:.2f}x the first)")
    print(f"wrote {run.out / 'results.json'}")


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Run the benchmark with command-line flags ``argv`` (default: ``sys.argv``)."""
    return run(cli.parse_config(parser, BenchLearnConfig, argv), loader=loader)


if __name__ == "__main__":
    cli.run_cli(main, "bench_learn")
