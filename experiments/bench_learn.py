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
6. The consensus circuit's runs (``--consensus-runs k``, :func:`time_consensus`): per step, one default run, the k
   runs trained together (one forward of all their circuits, :func:`patching.edges.learn.learn_circuits`), the k
   runs one after another, and the model alone on the same sequences as one run and as all k runs; every arm draws
   the same prompt length at each step (``LearnConfig.length_seed``), so the arms are compared step for step.
7. Writes ``<out>/results.json``: per arm the median and every step time, the ratios, the model alone, the whole
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
    consensus_runs: int = option(4, "runs of the consensus circuit timed together and one after another (0: none)",
                                 type=cli.nonnegative_int)
    only_profile: bool = option(False, "skip the timed arms, the model alone and the whole default: only the "
                                       "profile (needs --profile-steps)")
    only_consensus: bool = option(False, "skip the timed arms, the model alone and the whole default: only the "
                                         "consensus runs side by side")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps < 2:
            raise InputError(f"--steps {self.steps}: each timed run's first step is left out (allocation), so a run "
                             "needs at least 2 steps to time one.")
        if self.only_profile and not self.profile_steps:
            raise InputError("--only-profile needs --profile-steps N (N >= 1): the profile is all it runs.")
        if self.only_consensus and (self.only_profile or not self.consensus_runs):
            raise InputError("--only-consensus needs --consensus-runs N (N >= 1) and no --only-profile: the consensus "
                             "runs are all it times.")


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
    from patching.sweeps import inputs
    from patching.edges.learn import DEFAULT_CIRCUIT

    circuits = min(DEFAULT_CIRCUIT.samples, len(DEFAULT_CIRCUIT.fractions))
    group = max(inputs.prompt_groups(model, prompts), key=len)
    n_rows = min(len(group), DEFAULT_CIRCUIT.batch_size)
    times = [alone_seconds(model, group, n_rows, circuits) for _ in range(cfg.steps * cfg.rounds)]
    median = statistics.median(times[1:])
    print(f"the model alone, {circuits} x {n_rows} sequences forward and backward: {median:.3f} s")
    return {"seconds_median": median, "seconds_all": times[1:], "sequences": circuits * n_rows}


def alone_seconds(model, group, n_rows: int, tiles: int) -> float:
    """Wall seconds of one forward and backward through every block, with no mixing hooks, of ``group``'s first
    ``n_rows`` prompts tiled ``tiles`` times (from their shared prefix, as a learned step runs them), the gradient
    taken at the embeddings, as a mask's gradient reaches every block."""
    import torch

    from patching.sweeps import forward
    from patching.edges.engine import edge_mode, edge_prefix_kv, run_suffix
    from patching.sweeps.forward import frozen_weights
    from patching.sweeps.metrics import get_metric, score_end

    def leaf(act, *, hook):
        return act.detach().requires_grad_(True)

    with edge_mode(model), frozen_weights(model):
        tokens, answers = group.tokens[:n_rows], group.answer_ids[:n_rows].repeat(tiles)
        alts = None if group.alt_ids is None else group.alt_ids[:n_rows].repeat(tiles)
        start = forward.shared_prefix_length(tokens, group.cf_tokens[:n_rows])
        kv = edge_prefix_kv(model, tokens[:, :start]) if start else None
        started = time.perf_counter()
        with torch.enable_grad():
            end = run_suffix(model, tokens, start, kv, [("blocks.0.hook_resid_pre", leaf)], times=tiles)
            score_end(model, end[:, -1], answers, alts, get_metric("logit")).sum().backward()
        return time.perf_counter() - started


def time_consensus(model, prompts, cfg: BenchLearnConfig) -> dict:
    """The consensus circuit's runs, per step, side by side over ``--rounds`` rounds of ``--steps`` steps: one default
    run, ``--consensus-runs`` runs trained together (their circuits rows of one forward) and the same runs one after
    another, each run on a stratified half-sample (as ``"consensus"`` draws them) and every arm drawing the same
    prompt length at each step; with the model alone on each step's sequences, for one run and for all runs."""
    from patching.sweeps import inputs
    from patching.edges import learn_circuit
    from patching.edges.consensus import resample_rows
    from patching.edges.learn import DEFAULT_CIRCUIT, learn_circuits, restart_seed

    k = cfg.consensus_runs
    lengths = [len(tokens) for tokens in prompts["tokens"]]
    seeds = [restart_seed(0, i) for i in range(k)]
    sets = [prompts.select(resample_rows(lengths, "half", seed)) for seed in seeds]
    groups = {len(g.tokens[0]): g for g in inputs.prompt_groups(model, sets[0])}
    circuits = min(DEFAULT_CIRCUIT.samples, len(DEFAULT_CIRCUIT.fractions))
    times: dict[str, list[float]] = {name: [] for name in CONSENSUS_ARMS}
    for round_ in range(cfg.rounds):
        config = dataclasses.replace(DEFAULT_CIRCUIT, steps=cfg.steps, length_seed=round_)
        one = learn_circuit(model, sets[0], config=dataclasses.replace(config, seed=seeds[0]))
        together = learn_circuits(model, sets, seeds=seeds, config=config, together=True)[0]
        apart = learn_circuits(model, sets, seeds=seeds, config=config, together=False)
        floor_one, floor_all = [], []
        for length in one.step_lengths[1:]:
            n_rows = min(len(groups[length]), config.batch_size)
            floor_one.append(alone_seconds(model, groups[length], n_rows, circuits))
            floor_all.append(alone_seconds(model, groups[length], n_rows, circuits * k))
        rows = zip(one.step_seconds[1:], together.step_seconds[1:], zip(*[a.step_seconds[1:] for a in apart]),
                   floor_one, floor_all)
        for step_one, step_together, steps_apart, alone_one, alone_all in rows:
            for name, value in zip(CONSENSUS_ARMS, (step_one, step_together, sum(steps_apart), alone_one, alone_all)):
                times[name].append(value)
        print(f"round {round_}: " + ", ".join(f"{name} {statistics.median(t[-(cfg.steps - 1):]):.3f} s"
                                              for name, t in times.items()), flush=True)
    median = {name: statistics.median(t) for name, t in times.items()}
    one_name, together_name, apart_name, alone_one_name, alone_all_name = CONSENSUS_ARMS
    return {"runs": k, "prompts_per_run": [len(s) for s in sets], "seconds_per_step_median": median,
            "seconds_per_step_all": times,
            "together_vs_apart": median[apart_name] / median[together_name],
            "together_vs_one_run": median[together_name] / median[one_name],
            "one_run_vs_model_alone": median[one_name] / median[alone_one_name],
            "together_vs_model_alone": median[together_name] / median[alone_all_name]}


#: the arms of :func:`time_consensus`, each a step of every run it trains (or the model alone on those sequences)
CONSENSUS_ARMS = ("one default run", "the runs together", "the runs one after another",
                  "the model alone, one run's sequences", "the model alone, every run's sequences")


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
            *([] if cfg.only_profile or cfg.only_consensus else ["steps side by side", "the model alone",
                                                                 "the whole default"]),
            *(["the consensus runs side by side"] if cfg.consensus_runs and not cfg.only_profile else []),
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
    if not (cfg.only_profile or cfg.only_consensus):
        with run.stage("steps side by side"):
            per_arm = time_arms(model, prompts, cfg)
        with run.stage("the model alone"):
            alone = model_alone(model, prompts, cfg)
        with run.stage("the whole default"):
            whole = whole_default(model, prompts, cfg)
        run.results |= {"arms": per_arm, "model_alone": alone, "whole_default": whole}
    if cfg.consensus_runs and not cfg.only_profile:
        with run.stage("the consensus runs side by side"):
            run.results["consensus"] = consensus = time_consensus(model, prompts, cfg)
        print(f"{consensus['runs']} runs together: {consensus['together_vs_apart']:.2f}x faster than one after another, "
              f"{consensus['together_vs_one_run']:.2f}x one run's step; one run's step is "
              f"{consensus['one_run_vs_model_alone']:.2f}x the model alone on its sequences")
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
