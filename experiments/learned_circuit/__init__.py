"""The learned circuit of one operation, settings chosen on validation prompts, numbers reported on test prompts.

    python -m experiments.learned_circuit --op + --seed 0

A circuit found on 16 or 32 prompts fits those prompts, and a setting picked by looking at the reported
numbers inflates them. This experiment keeps the three roles apart (``circuits.prompt_splits``):

1. data: every problem of the operation (template x operand pair), kept where gemma answers it,
   split by problem into training sets (``--stability-sets`` of ``--n-train`` each), a validation
   set and a test set; more few-shot prefix draws where a split is short;
2. warm start: EAP-IG-inputs edge scores on ``--warm-start-prompts`` of the first training set
   (``patching.edges.attribute``; each further set gets its own);
3. sweep: the learned method (``--method``, default ``top-n``: the hard top-n circuits at the reported
   sizes, straight-through gradients) for every setting of the grid (``--steps`` x ``--samples`` x
   ``--learn-batch-size`` x ``--restarts`` x ``--consensus-runs`` (x ``--resampling``) x ``--lrs`` x
   ``--temperatures`` x ``--penalties``; a setting of several runs is the consensus circuit of that many learned
   runs on resamples of the training set, ``patching.edges.consensus``; by default the
   commands' circuit, ``patching.edges.learn.DEFAULT_CIRCUIT``, with and without its |1 − f| penalty) on the first training set, each curved on the
   validation set, and (``--sweep-stability``) learned again on the second training set, the two circuits'
   edge Jaccard at 5 % measured; the setting with the lowest validation CMD + |1 − f(5 %)| +
   ``--stability-weight`` x (1 − Jaccard(5 %)) is chosen (what the goal names: faithful at every size,
   faithful at 5 %, the same circuit from another prompt set);
4. test: the chosen circuit's faithfulness curve on the test set (CPR, CMD, f at MIB's sizes, 95 %
   bootstrap intervals over prompts), beside EAP-IG-inputs and matryoshka (the same steps and prompts per step, its
   own lr, budgets and temperatures) on the same prompts (``--baselines``), with paired differences against EAP-IG-inputs;
5. stability: the chosen setting learned on each further training set (the sweep's second-set circuit is
   reused) and with each ``--stability-seeds`` seed; the edge Jaccard of every pair of circuits at 2, 5
   and 10 % of the edges, the Spearman correlation of their scores, each run's test curve, and the stable
   core (edges more than half of the runs keep) with its own test curve (:func:`patching.edges.stability.compare_runs`);
6. outputs: results.json (docs/results_json.md), the chosen circuit's scores as a Graph JSON, the
   curve figure and report.html.

``--task ioi``, ``--task greater-than`` or ``--task <pair file>`` (``circuits.classic_tasks``,
``circuits.pair_tasks``) replaces stage 1's problems by a pair task's rows: generated (twice the rows the splits ask
for) or read, kept where the model solves them (``patching.sweeps.task_metrics.keep_solved``), shuffled and cut
into the training sets, validation and test (every part scaled down alike when too few are solved;
results.json ``prompts.scaled_down``); every learned circuit, warm start and curve then scores the task's metric
(results.json ``task``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

from circuits.atomic_files import write_text_atomic
from circuits.templates import resolve_operation
from experiments.learned_circuit.config import LearnedCircuitConfig
from experiments.runtime import ModelLoader, Run, cli, run_experiment

logger = logging.getLogger("experiments")

parser = cli.config_parser(LearnedCircuitConfig, "learned_circuit", __doc__)

#: the sizes whose circuits are compared across runs (fractions of the edges)
STABILITY_FRACTIONS = (0.02, 0.05, 0.10)
#: the size the goal names, part of the sweep's criterion
GOAL_FRACTION = 0.05


def parse_config(argv: list[str] | None = None) -> LearnedCircuitConfig:
    """CLI flags for every field of :class:`LearnedCircuitConfig` (``--help`` lists the defaults)."""
    return cli.parse_config(parser, LearnedCircuitConfig, argv)


def problem_disjoint_parts(dataset, n_parts: int, seed: int = 0) -> list:
    """``dataset`` cut into ``n_parts`` parts with no problem (template and operands) in two, of equal size."""
    import random

    from circuits.prompt_splits import problem_key

    rows = dataset.select_columns(["template_id", "a", "b"]).to_list()
    problems = sorted({problem_key(r) for r in rows})
    random.Random(f"parts/{seed}").shuffle(problems)
    part_of = {key: i % n_parts for i, key in enumerate(problems)}
    parts = [[j for j, r in enumerate(rows) if part_of[problem_key(r)] == i] for i in range(n_parts)]
    size = min(map(len, parts))
    return [dataset.select(p[:size]) for p in parts]


def criterion(curve, jaccard: float | None = None, stability_weight: float = 0.0) -> float:
    """The sweep's choice: validation CMD + |1 − f| at :data:`GOAL_FRACTION`, plus ``stability_weight`` x
    (1 − ``jaccard``), the edge Jaccard at that size of the circuits of two training sets (lower is better)."""
    f = curve.faithfulness[curve.fractions.index(GOAL_FRACTION)].value
    unstable = 0.0 if jaccard is None else stability_weight * (1.0 - jaccard)
    return curve.cmd.value + abs(1.0 - f) + unstable


@dataclass
class Learned:
    """One setting's circuit on one training set: its edge scores, and the consensus when it counts several runs
    (whose circuit at each size is rebuilt from the runs, not cut from one score order)."""

    graph: object  # circuits.graph.Graph
    seconds: float
    seconds_per_step: float  # each run's steps counted
    consensus: object = None  # patching.edges.consensus.Consensus

    @property
    def select(self):
        """The circuit's own selector for the curves (None: MIB's pruned top-n of the scores)."""
        return None if self.consensus is None else self.consensus.select

    def circuit(self, fraction: float):
        """The circuit at ``fraction`` of the edges, as the curves select it."""
        from circuits.graph_selection import select_fraction

        return select_fraction(self.graph, fraction) if self.consensus is None else self.consensus.circuit(fraction)


def learn_setting(run: "LearnedCircuitRun", set_index: int, setting: dict, *, on_step, seed: int | None = None) -> Learned:
    """``setting`` (a row of :meth:`LearnedCircuitConfig.grid`) learned on training set ``set_index`` from its warm
    start: one learned circuit, or with ``runs`` above 1 the consensus of that many runs on resamples of the set."""
    import time

    from patching.edges import learn_circuit
    from patching.edges.consensus import learn_consensus

    state = run.state
    fields = {k: v for k, v in setting.items() if k not in ("runs", "resampling")} | (
        {} if seed is None else {"seed": seed})
    config = dataclasses.replace(state.base, **fields)
    prompts, init = state.train_sets[set_index], state.warm[set_index]
    runs = setting.get("runs", 1)
    if runs == 1:
        learned = learn_circuit(state.model, prompts, config=config, init=init, on_step=on_step, metric=state.metric)
        return Learned(learned.graph, learned.seconds, learned.seconds_per_step)
    started = time.perf_counter()
    consensus = learn_consensus(state.model, prompts, runs=runs, resampling=setting["resampling"], config=config,
                                init=init, on_step=on_step, metric=state.metric)
    seconds = time.perf_counter() - started
    return Learned(consensus.graph(), round(seconds, 1), round(seconds / (runs * config.steps), 3), consensus)


def learning_steps(setting: dict) -> int:
    """The optimisation steps one circuit of ``setting`` takes (every restart and run counted)."""
    return setting["steps"] * setting["restarts"] * setting.get("runs", 1)


def chosen_label(method: str, chosen: dict) -> str:
    """The chosen circuit's name in the tables: the method, or the consensus of its runs."""
    return method if chosen.get("runs", 1) == 1 else f"consensus of {chosen['runs']} {method}"


def curve_row(curve) -> dict:
    """The numbers of one curve a table shows: CPR, CMD, f at each size (with intervals)."""
    return {"cpr": curve.cpr.to_dict(), "cmd": curve.cmd.to_dict(),
            "f": {f"{100 * x:g}%": f.to_dict() for x, f in zip(curve.fractions, curve.faithfulness)},
            "n_prompts": curve.n_prompts}


# ---------------------------------------------------------------------------- main


@dataclass
class LearnedCircuitState:
    """What the stages carry from one to the next (``run.state``)."""

    model: object
    base: object  # the LearnConfig every learned circuit starts from (--method, --seed, --memory-mb)
    train_sets: list = field(default_factory=list)
    validation: object = None
    test: object = None
    warm: list = field(default_factory=list)  # each training set's EAP-IG-inputs scores (None: no warm start)
    graphs: list = field(default_factory=list)  # each swept setting's Learned circuit on the first training set
    second: list = field(default_factory=list)  # ... and on the second one (--sweep-stability)
    best: int = 0  # the index of the setting chosen on validation
    curves: dict = field(default_factory=dict)  # label -> test curve (the chosen circuit and the baselines)
    metric: object = "logit"  # what every curve, warm start and learned circuit scores (a pair task's own metric)


LearnedCircuitRun = Run[LearnedCircuitConfig, LearnedCircuitState]


def run(cfg: LearnedCircuitConfig, *, loader: ModelLoader | None = None) -> dict:
    """Run the stages; return the results dict that is also written to results.json."""
    name = f"learned_circuit-{cfg.task_name}"
    return run_experiment(name, cfg, _stages, loader=loader, plan=plan(cfg),
                          results={"experiment": name, "settings": dataclasses.asdict(cfg), "model": cfg.model})


def plan(cfg: LearnedCircuitConfig) -> list[str]:
    """The stages every run goes through, in order (their names as in results.json ``seconds``)."""
    return ["load model", "data", "warm start", "sweep", "test", "stability"]


def _stages(run: LearnedCircuitRun) -> None:
    from patching.edges import LearnConfig

    cfg = run.cfg
    model = run.load_model()
    run.state = LearnedCircuitState(model, LearnConfig(method=cfg.method, seed=cfg.seed, memory_mb=cfg.memory_mb,
                                                       progress=False))
    split_prompts(run)
    warm_start(run)
    chosen = sweep(run)
    evaluate_on_test(run, chosen)
    measure_stability(run, chosen)
    run.results["wall_seconds"] = run.wall_seconds
    _report(run, run.state.curves)
    print(summary(run.results))


def _curve(run: LearnedCircuitRun, scores, prompts, select=None):
    """The faithfulness curve of ``scores`` on ``prompts`` at MIB's sizes (``select``: a circuit's own selector),
    with the run's bootstrap settings."""
    from patching.edges import faithfulness_curve

    from patching import SweepOptions

    return faithfulness_curve(run.state.model, scores, prompts, select=select, n_bootstrap=run.cfg.n_bootstrap,
                              seed=run.cfg.seed, options=SweepOptions(metric=run.state.metric))


def split_prompts(run: LearnedCircuitRun) -> None:
    """Stage 1: every problem of the operation the model answers, split by problem into training sets, validation
    and test."""
    from circuits.prompt_splits import correct_prompt_splits

    cfg, state = run.cfg, run.state
    if not cfg.arithmetic:
        return split_pair_task(run)
    with run.stage("data", f"every {resolve_operation(cfg.op).name} problem, kept where the model answers it, "
                           "split by problem"):
        task = cfg.task_config()
        splits = correct_prompt_splits(state.model, task,
                                       (cfg.stability_sets * cfg.n_train, cfg.n_validation, cfg.n_test),
                                       max_shot_draws=cfg.max_shot_draws, batch_size=cfg.batch_size)
        check_splits_filled(splits, cfg)
        state.train_sets = problem_disjoint_parts(splits.train, cfg.stability_sets, cfg.seed)
        state.validation, state.test = splits.validation, splits.test
    run.results["prompts"] = splits.to_dict() | {"train_sets": [len(s) for s in state.train_sets]}
    if splits.short:
        run.results["prompts_short"] = f"splits short of their size: {splits.short}"
    print(f"prompts: {len(state.train_sets)} training set(s) of {len(state.train_sets[0])}, validation "
          f"{len(state.validation)}, test {len(state.test)} (the model answers {100 * splits.accuracy:.1f}% of "
          f"{splits.n_checked} prompts)")


def split_pair_task(run: LearnedCircuitRun) -> None:
    """Stage 1 for a pair task (``--task``): its rows the model solves, shuffled and cut into the splits."""
    from circuits.pair_tasks import split_pairs
    from patching.sweeps.task_metrics import solved_rows

    cfg, state = run.cfg, run.state
    sizes = [cfg.n_train] * cfg.stability_sets + [cfg.n_validation, cfg.n_test]
    with run.stage("data", f"{cfg.task_name} rows, kept where the model solves them, split at random"):
        rows, state.metric, share, record = solved_rows(state.model, cfg.task, n_prompts=2 * sum(sizes),
                                                         seed=cfg.seed, batch_size=cfg.batch_size)
        parts, scaled = split_pairs(rows, sizes, cfg.seed)
        state.train_sets, (state.validation, state.test) = parts[:-2], parts[-2:]
    run.results["task"] = record | {"solved_share": share}
    run.results["prompts"] = {"train_sets": [len(s) for s in state.train_sets], "validation": len(state.validation),
                              "test": len(state.test), "scaled_down": scaled}
    print(f"prompts: {len(state.train_sets)} training set(s) of {len(state.train_sets[0])}, validation "
          f"{len(state.validation)}, test {len(state.test)} (the model solves {100 * share:.1f}% of {record['n_rows']} "
          f"{cfg.task_name} rows)")


def warm_start(run: LearnedCircuitRun) -> None:
    """Stage 2: EAP-IG-inputs scores on ``--warm-start-prompts`` of each training set (none with 0)."""
    from patching import SweepOptions
    from patching.edges import edge_attribution

    cfg, state = run.cfg, run.state
    with run.stage("warm start", f"EAP-IG-inputs on {cfg.warm_start_prompts} prompts of each training set"):
        options = SweepOptions(memory_mb=cfg.memory_mb, batch_size=cfg.batch_size, metric=state.metric)
        state.warm = [edge_attribution(state.model, s.select(range(min(len(s), cfg.warm_start_prompts))),
                                       method="EAP-IG-inputs", options=options) if cfg.warm_start_prompts else None
                      for s in state.train_sets]


def sweep(run: LearnedCircuitRun) -> dict:
    """Stage 3: every setting of the grid learned on the first training set (and the second, with sweep
    stability), curved on validation; returns the setting the criterion chooses (``state.best`` its index)."""
    cfg, state = run.cfg, run.state
    grid, paired = cfg.grid(), cfg.measures_sweep_stability()
    rows = []
    with run.stage("sweep", f"{len(grid)} settings of {cfg.method}, each learned on {len(state.train_sets[0])} prompts"
                            + (" (and again on the second training set)" if paired else "")
                            + f" and curved on {len(state.validation)} validation prompts"):
        steps = run.progress(sum(map(learning_steps, grid)) * (2 if paired else 1), "learning steps")
        for i, setting in enumerate(grid):
            label = ", ".join(f"{k} {v}" for k, v in setting.items())
            with run.step(f"setting {i + 1}/{len(grid)}: {label}"):
                row, val = sweep_setting(run, setting, paired, on_step=lambda _: steps.advance())
            rows.append(row)
            jaccard = row.get("jaccard_training_sets")
            print(f"      validation CMD {val.cmd.value:.3f}, f(5%) "
                  f"{val.faithfulness[val.fractions.index(GOAL_FRACTION)].value:.3f}"
                  + (f", Jaccard(5%) of two training sets {jaccard['5%']:.2f}" if jaccard else "")
                  + f" ({row['seconds_per_step']:.2f} s/step)", flush=True)
    state.best = min(range(len(grid)), key=lambda i: rows[i]["criterion"])
    run.results["sweep"] = {"rows": rows, "chosen": grid[state.best], "criterion": "validation CMD + |1 - f(5%)|" + (
        f" + {cfg.stability_weight:g} x (1 - Jaccard(5%) of two training sets)" if paired else "")}
    return grid[state.best]


def sweep_setting(run: LearnedCircuitRun, setting: dict, paired: bool, *, on_step) -> tuple[dict, object]:
    """One setting of the sweep: its circuit learned and curved on validation (and learned again on the second
    training set, the two circuits' Jaccard measured, if ``paired``); its results row and validation curve."""
    from circuits.graph_selection import edge_jaccard

    cfg, state = run.cfg, run.state
    learned = learn_setting(run, 0, setting, on_step=on_step)
    val = _curve(run, learned.graph, state.validation, learned.select)
    row = setting | curve_row(val) | {"seconds": learned.seconds, "seconds_per_step": learned.seconds_per_step}
    jaccard = None
    if paired:
        other = learn_setting(run, 1, setting, on_step=on_step)
        state.second.append(other)
        jaccard = {f"{100 * x:g}%": edge_jaccard(learned.circuit(x).in_graph, other.circuit(x).in_graph)
                   for x in STABILITY_FRACTIONS}
        row["jaccard_training_sets"] = jaccard
    row["criterion"] = criterion(val, jaccard and jaccard[f"{100 * GOAL_FRACTION:g}%"], cfg.stability_weight)
    state.graphs.append(learned)
    return row, val


def evaluate_on_test(run: LearnedCircuitRun, chosen: dict) -> None:
    """Stage 4: the chosen circuit's test curve beside the baselines' (``--baselines``), paired against
    EAP-IG-inputs; the chosen circuit saved as a Graph JSON."""
    from circuits.graph_io import save_eap_json
    from patching.edges import learn_circuit
    from patching.edges.curves import paired_curve_difference

    cfg, state, results = run.cfg, run.state, run.results
    best = state.graphs[state.best]
    with run.stage("test", f"the chosen circuit and the baselines on {len(state.test)} test prompts"):
        curves = state.curves
        curves[chosen_label(cfg.method, chosen)] = _curve(run, best.graph, state.test, best.select)
        if cfg.baselines:
            if state.warm[0] is not None:
                curves["EAP-IG-inputs"] = _curve(run, state.warm[0], state.test)
            if cfg.method != "matryoshka":
                # the same steps and prompts per step; its own lr, budgets and temperatures
                matryoshka = learn_circuit(state.model, state.train_sets[0], init=state.warm[0],
                                           config=dataclasses.replace(state.base, method="matryoshka", samples=2,
                                                                      steps=chosen["steps"],
                                                                      batch_size=chosen["batch_size"],
                                                                      restarts=chosen["restarts"]),
                                           metric=state.metric)
                curves["matryoshka"] = _curve(run, matryoshka.graph, state.test)
        results["test"] = {label: curve_row(c) for label, c in curves.items()}
        if "EAP-IG-inputs" in curves:
            results["test_minus_EAP-IG-inputs"] = {
                label: paired_curve_difference(c, curves["EAP-IG-inputs"], n_bootstrap=cfg.n_bootstrap, seed=cfg.seed)
                for label, c in curves.items() if label != "EAP-IG-inputs"}
    save_eap_json(best.graph, run.out / "learned_circuit.json", state.model.cfg.d_model, overwrite=True)


def check_splits_filled(splits, cfg) -> None:
    """A :class:`circuits.errors.TaskDataError` naming the sizes asked and found when a split came out empty (the
    operation has fewer answered problems than the sizes ask for), before any circuit is learned on nothing."""
    from circuits.errors import TaskDataError

    found = {"training": len(splits.train), "validation": len(splits.validation), "test": len(splits.test)}
    if all(found.values()):
        return
    raise TaskDataError(
        f"The {resolve_operation(cfg.op).name} prompts the model answers fill the training split "
        f"({cfg.stability_sets} set(s) x --n-train {cfg.n_train}) and leave {', '.join(f'{n} {k}' for k, n in found.items())} "
        f"prompts (of {splits.n_checked} checked): lower --n-train (or --stability-sets) so that validation "
        f"(--n-validation {cfg.n_validation}) and test (--n-test {cfg.n_test}) get prompts too.")


def measure_stability(run: LearnedCircuitRun, chosen: dict) -> None:
    """Stage 5: the chosen setting learned on each further training set (the sweep's second-set circuit reused)
    and with each ``--stability-seeds`` seed; the runs compared and each curved on the test prompts."""
    cfg, state, results = run.cfg, run.state, run.results
    reused = 1 if cfg.measures_sweep_stability() else 0  # the sweep learned set 1 already
    further = [index for index in range(1, len(state.train_sets)) if index > reused]
    runs = [(0, cfg.seed, state.graphs[state.best])]
    with run.stage("stability", f"the chosen setting on {cfg.stability_sets} training set(s) and "
                                f"{1 + len(cfg.stability_seeds)} seed(s)"):
        steps = run.progress((len(further) + len(cfg.stability_seeds)) * learning_steps(chosen), "learning steps")
        for index in range(1, len(state.train_sets)):
            if index <= reused:
                runs.append((1, cfg.seed, state.second[state.best]))
                continue
            runs.append((index, cfg.seed, learn_setting(run, index, chosen, on_step=lambda _: steps.advance())))
        for seed in cfg.stability_seeds:
            runs.append((0, seed, learn_setting(run, 0, chosen, seed=seed, on_step=lambda _: steps.advance())))
        results["stability"] = stability(state.model, runs, state.test, cfg, state.metric)
        # each run's own test curve (the first run is the chosen circuit, already curved): a stable method is
        # faithful whichever prompts and seed it was learned with
        rows = [results["test"][chosen_label(cfg.method, chosen)]] + [
            curve_row(_curve(run, learned.graph, state.test, learned.select)) for _, _, learned in runs[1:]]
        for entry, row in zip(results["stability"]["runs"], rows):
            entry["test"] = row


def stability(model, runs, test, cfg: LearnedCircuitConfig, metric="logit") -> dict:
    """Jaccard and Spearman of every pair of runs, and the stable core's test curve (the module docstring)."""
    from patching import SweepOptions
    from patching.edges import CircuitSearch
    from patching.edges.stability import compare_runs

    out = {"runs": [{"set": s, "seed": seed} for s, seed, _ in runs], "fractions": list(STABILITY_FRACTIONS),
           "pairs": []}
    if len(runs) < 2:
        return out
    circuits = [[learned.circuit(x) for x in STABILITY_FRACTIONS] for _, _, learned in runs]
    search = CircuitSearch(n_bootstrap=cfg.n_bootstrap, seed=cfg.seed,
                           sweep=SweepOptions(batch_size=32, memory_mb=cfg.memory_mb, metric=metric))
    compared = compare_runs(model, [(s, seed) for s, seed, _ in runs], [learned.graph for _, _, learned in runs],
                            circuits, test, search, method=cfg.method, kind="learned mask",
                            fractions=STABILITY_FRACTIONS, n_per_set=cfg.n_train)
    spearman, jaccard, node_jaccard = compared.spearman(), compared.jaccard(), compared.node_jaccard()
    for p, (a, b) in enumerate(compared.pairs()):
        kind = "sets" if runs[a][0] != runs[b][0] else "seeds"
        out["pairs"].append({"runs": [a, b], "differ_in": kind, "spearman": spearman[p],
                             "jaccard": {f"{100 * x:g}%": jaccard[i][p] for i, x in enumerate(STABILITY_FRACTIONS)},
                             "node_jaccard": {f"{100 * x:g}%": node_jaccard[i][p]
                                              for i, x in enumerate(STABILITY_FRACTIONS)}})
    out["core"] = [{"fraction": x, "n_edges": int(c.in_graph.sum()), "f": f.to_dict()}
                   for x, c, f in zip(STABILITY_FRACTIONS, compared.cores, compared.core_curve.faithfulness)]
    return out


def summary(results: dict) -> str:
    """The headline lines: the chosen setting, its test numbers beside the baselines, its stability."""
    lines = [f"chosen on validation: {results['sweep']['chosen']}"]
    for label, row in results["test"].items():
        f = row["f"]
        lines.append(f"{label:24s} test CPR {row['cpr']['value']:.3f} CMD {row['cmd']['value']:.3f}  f@2% "
                     f"{f['2%']['value']:.2f}  f@5% {f['5%']['value']:.2f} [{f['5%']['low']:.2f}, {f['5%']['high']:.2f}]"
                     f"  f@10% {f['10%']['value']:.2f}  f@20% {f['20%']['value']:.2f}  f@50% {f['50%']['value']:.2f}")
    for i, entry in enumerate(results["stability"]["runs"]):
        if "test" in entry:
            row, f = entry["test"], entry["test"]["f"]["5%"]
            lines.append(f"run {i} (training set {entry['set']}, seed {entry['seed']}): test CMD {row['cmd']['value']:.3f}"
                         f"  f@5% {f['value']:.2f} [{f['low']:.2f}, {f['high']:.2f}]")
    for pair in results["stability"]["pairs"]:
        j, nodes = pair["jaccard"], pair["node_jaccard"]
        lines.append(f"runs {pair['runs']} (differ in {pair['differ_in']}): Jaccard 2% {j['2%']:.2f}, 5% {j['5%']:.2f},"
                     f" 10% {j['10%']:.2f}; nodes {nodes['2%']:.2f}, {nodes['5%']:.2f}, {nodes['10%']:.2f}; "
                     f"Spearman {pair['spearman']:.2f}")
    for core in results["stability"].get("core", []):
        lines.append(f"stable core at {100 * core['fraction']:g}%: {core['n_edges']} edges, test f "
                     f"{core['f']['value']:.2f} [{core['f']['low']:.2f}, {core['f']['high']:.2f}]")
    return "\n".join(lines)


def _report(run: Run, curves: dict) -> None:
    from circuits.show.html_report import Report
    from circuits.show.edge_figures import faithfulness_figure

    results = run.results
    report = Report(f"The learned {run.cfg.task_name} circuit of {run.cfg.model}", summary(results))
    figure = faithfulness_figure(list(curves.items()), title="Faithfulness on the test prompts")
    write_text_atomic(run.out / "figures" / "test_curves.json", figure.to_json())
    report.add_figure(figure, heading="Faithfulness on the test prompts")
    report.add_table([{k: v for k, v in row.items() if k in ("steps", "samples", "batch_size", "restarts", "runs", "resampling", "lr", "temperature",
                                                             "faithfulness_penalty", "criterion", "seconds")}
                      | {"validation CMD": row["cmd"]["value"], "validation f@5%": row["f"]["5%"]["value"]}
                      | ({"Jaccard@5% (training sets)": row["jaccard_training_sets"]["5%"]}
                         if "jaccard_training_sets" in row else {})
                      for row in results["sweep"]["rows"]], heading="Sweep (validation prompts)")
    report.add_table(run.timer.seconds | {"total": results["wall_seconds"]}, heading="Wall time per stage",
                     columns=("stage", "seconds"))
    report.add_settings(dataclasses.asdict(run.cfg))
    report.save(run.out / "report.html")


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Parse ``argv`` (default: ``sys.argv``), run, return the results; errors propagate (see :func:`cli_main`)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    return run(parse_config(argv), loader=loader)
