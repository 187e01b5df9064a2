"""The whole loop on one model: find the circuit, tune only the circuit, merge, and look at the circuit again.

    python -m experiments.loop [--op +] [--second-op *] [--steps 40] [--out runs/loop-<timestamp>]

1. data: few-shot prompts of ``--op`` that the base model answers correctly; ``--circuit-prompts`` of them
   (shuffled with the seed) are the circuit prompts every circuit below is scored and evaluated on;
   accuracy and drift come from a held-out math suite (``finetune.math_suite``: held-out templates of both
   operations) and general texts;
2. the base circuit: the default learned circuit of the base model on the circuit prompts (the
   straight-through top-n warm-started from EAP-IG-inputs, ``patching.edges.learn.DEFAULT_CIRCUIT``;
   the ``--learn-*`` flags) and its MIB faithfulness curve;
3. tune the circuit: precise SFT of the ``--n-heads`` heads holding the most in-circuit edge score at
   ``--circuit-size`` of the edges (``patching.edges.faithful_circuit.circuit_heads``), ``--steps`` steps
   on the training templates of ``--op``;
4. the circuit after tuning: ``patching.edges.circuit_shift(base, tuned)`` on the circuit prompts;
5. merge: a second expert tuned the same way on ``--second-op`` (its own circuit's heads), and the task
   arithmetic merge of the two experts into the base (``merging.merge``, λ = ``--merge-lambda``);
6. the circuit after merging: ``circuit_shift(tuned, merged)``;
7. outputs: results.json (key ``steps``: accuracy and drift per model, keys ``shift_tuned`` and
   ``shift_merged``), figures/, report.html with the circuit at each step side by side, and beside each shift
   figure the edge-circuit explorer (``circuits.show.explorer``) of the two circuits in compare mode.

Every accuracy carries a 95% Wilson interval over its prompts, every faithfulness point a 95% bootstrap
interval over the circuit prompts.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from experiments.runtime import ModelLoader, Run, RunSettings, cli, option, run_experiment
from circuits.atomic_files import write_text_atomic
from experiments.runtime.settings import BatchSettings, LearnSettings, PromptSettings


@dataclass(frozen=True)
class LoopConfig(LearnSettings, BatchSettings, PromptSettings, RunSettings):
    """Every flag of ``python -m experiments.loop`` beyond :class:`RunSettings`, with its default."""

    op: str = option("+", "the operation whose circuit is found, tuned and merged")
    second_op: str = option("*", "the second expert's operation (merged with the first)")
    circuit_prompts: int = option(32, "correct prompts every circuit is scored and evaluated on", type=cli.positive_int)
    circuit_size: float = option(0.05, "the circuit size (fraction of edges) whose heads are tuned and whose edges "
                                       "are compared", type=cli.fraction)
    n_heads: int = option(8, "heads tuned by precise SFT (those with the most in-circuit edge score)",
                          type=cli.positive_int)
    steps: int = option(40, "precise SFT steps per expert", type=cli.positive_int)
    lr: float = option(1e-4, "precise SFT learning rate", type=cli.positive_float)
    train_batch: int = option(16, "examples per precise SFT step", type=cli.positive_int)
    merge_lambda: float = option(1.0, "task arithmetic's λ for the merge of the two experts", type=cli.positive_float)
    n_heldout: int = option(40, "held-out math prompts per operation for accuracy", type=cli.positive_int)
    drift_tokens: int = option(128, "tokens per general text for the drift KL (every position scores the whole "
                                    "vocabulary, so drift costs in proportion)", type=cli.positive_int)
    n_bootstrap: int = option(500, "bootstrap resamples for every faithfulness interval", type=cli.positive_int)


parser = cli.config_parser(LoopConfig, "loop", __doc__)


def run(cfg: LoopConfig, *, loader: ModelLoader | None = None) -> dict:
    """Run the loop; return the results that are also written to results.json."""
    return run_experiment("loop", cfg, _stages, loader=loader, plan=plan(cfg),
                          results={"experiment": "loop", "settings": dataclasses.asdict(cfg), "model": cfg.model})


def plan(cfg: LoopConfig) -> list[str]:
    """The stages every run goes through, in order (their names as in results.json ``seconds``)."""
    return ["load model", "data", "evaluate base", "base circuit", "tune the circuit", "evaluate tuned",
            "circuit after tuning", "second expert", "merge", "evaluate second expert", "evaluate merged",
            "circuit after merging"]


def _tune(model, cfg: LoopConfig, op: str, heads, out, name: str):
    import torch

    from finetune import ArithmeticMix, TrainConfig, arithmetic_train_set, train

    expert = copy.deepcopy(model)
    data = arithmetic_train_set(expert.tokenizer, ArithmeticMix(ops=(op,), n_examples=cfg.steps * cfg.train_batch,
                                                                seed=cfg.seed))
    with torch.enable_grad():
        result = train(expert, data, TrainConfig(lr=cfg.lr, batch_size=cfg.train_batch, max_steps=cfg.steps,
                                                 seed=cfg.seed), method="precise", heads=heads, out_dir=out / name)
    return expert, {"heads": [str(h) for h in heads], "steps": result.steps, "n_trainable": result.n_trainable,
                    "seconds_per_step": result.seconds_per_step, "losses": result.losses}


def _merged(base, tuned, second, lam: float):
    """Task arithmetic of the two experts ``tuned`` and ``second`` on ``base`` (weight ``lam``): a new model."""
    from merging import merge
    from merging.methods import TaskArithmeticConfig

    merged = copy.deepcopy(base)
    # the merged weights are a full copy until the model takes them: held only inside this function
    merged.load_state_dict(merge("task_arithmetic", base.state_dict(), [tuned.state_dict(), second.state_dict()],
                                 TaskArithmeticConfig(lam=lam), progress=False))
    return merged


def _scores(model, data, cfg: LoopConfig):
    """The default learned circuit's edge scores of ``data`` (warm-started as ``--warm-start`` says)."""
    from patching import SweepOptions
    from patching.edges.faithful_circuit import score_selection

    search = cfg.learned_search(sweep=SweepOptions(batch_size=cfg.batch_size, memory_mb=1024.0))
    return score_selection(model, data, search).scores


@cli.no_grad
def _stages(run: Run) -> None:
    import torch

    from circuits.answer_scoring import first_token_hits
    from circuits.tasks import filter_correct, make_dataset
    from circuits.seeds import derived_seed
    from circuits.stats import proportion
    from finetune import MathSuiteConfig, evaluate_suite, math_suite
    from finetune.evaluate import drift_estimates
    from patching.edges.faithful_circuit import circuit_heads
    from patching import ShiftSettings, SweepOptions, circuit_shift

    cfg, results = run.cfg, run.results
    base = run.load_model()
    for p in base.parameters():
        p.requires_grad_(False)
    with run.stage("data", f"{cfg.n_prompts} {cfg.op} prompts, keeping the correct ones"):
        dataset = make_dataset(base, cfg.task_config())
        kept, base_accuracy = filter_correct(base, dataset, mask=first_token_hits(base, dataset, cfg.batch_size))
        circuit_data = kept.shuffle(seed=cfg.seed).select(range(min(cfg.circuit_prompts, len(kept))))
        suite = math_suite(base.tokenizer, MathSuiteConfig(ops=(cfg.op, cfg.second_op), n_heldout=cfg.n_heldout,
                                                           transfer=(), seed=derived_seed(cfg.seed, "test suite")))
    results |= {"n_prompts": len(dataset), "n_kept": len(kept), "n_circuit_prompts": len(circuit_data),
                "base_accuracy": base_accuracy}
    shift_settings = ShiftSettings(n_bootstrap=cfg.n_bootstrap, seed=cfg.seed,
                                   sweep=SweepOptions(batch_size=cfg.batch_size, memory_mb=1024.0),
                                   size=cfg.circuit_size if cfg.circuit_size in ShiftSettings().fractions else 0.05)
    steps = {}

    def score_model(name, model):
        with run.stage(f"evaluate {name}", f"accuracy and drift of the {name} model"):
            scored = evaluate_suite(model, base, suite, progress=False, per_prompt=True, drift_tokens=cfg.drift_tokens)
            steps[name] = {"accuracy": {s: proportion(torch.tensor(v["exact_hits"], dtype=torch.float64)).to_dict()
                                        for s, v in scored["math"].items()},
                           "drift_kl": drift_estimates(scored["drift"]["per_text"])["kl"].to_dict()}
            results["steps"] = steps
            run.save()

    score_model("base", base)
    with run.stage("base circuit", "the learned top-n circuit on the circuit prompts"):
        base_scores = _scores(base, circuit_data, cfg)
        heads = circuit_heads(base_scores, cfg.n_heads, cfg.circuit_size)
    results["circuit_heads"] = [str(h) for h in heads]
    with run.stage("tune the circuit", f"precise SFT of {len(heads)} circuit heads on {cfg.op}"):
        tuned, results["tuning"] = _tune(base, cfg, cfg.op, heads, run.out, "tuned")
    score_model("tuned", tuned)
    with run.stage("circuit after tuning", "the base circuit inside the tuned model, and the tuned model's own"):
        shift_tuned = circuit_shift(base, tuned, circuit_data, shift_settings, reference_scores=base_scores)
    results["shift_tuned"] = shift_tuned.to_dict()
    run.save()
    with run.stage("second expert", f"precise SFT on {cfg.second_op}, on its own circuit's heads"):
        second_data = make_dataset(base, cfg.task_config(op=cfg.second_op))
        second_kept, _ = filter_correct(base, second_data, mask=first_token_hits(base, second_data, cfg.batch_size))
        second_heads = circuit_heads(_scores(base, second_kept.select(range(min(cfg.circuit_prompts, len(second_kept)))),
                                             cfg), cfg.n_heads, cfg.circuit_size)
        second, results["second_expert"] = _tune(base, cfg, cfg.second_op, second_heads, run.out, "second")
    with run.stage("merge", "task arithmetic of the two experts"):
        merged = _merged(base, tuned, second, cfg.merge_lambda)
    results["merge"] = {"method": "task_arithmetic", "lambda": cfg.merge_lambda, "experts": [cfg.op, cfg.second_op]}
    score_model("second expert", second)
    del second  # not needed after its scores: the last shift holds the base, the tuned and the merged model
    score_model("merged", merged)
    with run.stage("circuit after merging", "the tuned circuit inside the merged model, and the merged model's own"):
        shift_merged = circuit_shift(tuned, merged, circuit_data, shift_settings,
                                     reference_scores=shift_tuned.changed_scores, reference_map=shift_tuned.changed_map)
    results["shift_merged"] = shift_merged.to_dict()
    figures = {f"tuned_{k}": v for k, v in shift_tuned.figures().items()}
    figures |= {f"merged_{k}": v for k, v in shift_merged.figures().items()}
    figures |= _compare_explorers(shift_tuned, shift_merged, shift_settings.size)
    for key, fig in figures.items():
        write_text_atomic(run.out / "figures" / f"{key}.json", fig.to_json())
    results["wall_seconds"] = run.wall_seconds
    _report(run, figures)
    print(summary(results))
    print(f"report: {run.out / 'report.html'}")


def _compare_explorers(shift_tuned, shift_merged, size: float) -> dict:
    """Compare mode of each shift's two circuits (the earlier model's against the changed model's own, MIB's pruned
    top-n at each size), starting at ``size``: ``{"tuned_explorer", "merged_explorer"}``."""
    from circuits.show.explorer import circuit_explorer

    out = {}
    for prefix, shift, labels in (("tuned", shift_tuned, ("base", "tuned")),
                                  ("merged", shift_merged, ("tuned", "merged"))):
        out[f"{prefix}_explorer"] = circuit_explorer(
            shift.reference_scores, compare=shift.changed_scores, labels=labels, start=size,
            title=f"The {labels[0]} model's circuit against the {labels[1]} model's own")
    return out


def summary(results: dict) -> str:
    """One line: how faithful the base circuit stays after tuning and after merging."""
    t, m = results["shift_tuned"], results["shift_merged"]
    size = f"{100 * t['settings']['size']:g}%"
    return (f"base circuit CPR {t['reference_curve']['cpr']['value']:.3f} in the base model, "
            f"{t['transferred_curve']['cpr']['value']:.3f} in the tuned one; tuned circuit CPR "
            f"{m['transferred_curve']['cpr']['value']:.3f} in the merged model; Jaccard at {size}: tuned "
            f"{t['jaccard'][size]['value']:.2f}, merged {m['jaccard'][size]['value']:.2f}")


def _fmt(estimate: dict) -> str:
    return f"{estimate['value']:.3f} [{estimate['low']:.3f}, {estimate['high']:.3f}]"


def _report(run: Run, figures: dict) -> None:
    from circuits.show.html_report import Report

    results, cfg = run.results, run.cfg
    report = Report(f"Identify, tune, merge, look again: {cfg.op} on {cfg.model}", summary(results))
    rows = []
    for name, step in results["steps"].items():
        row = {"model": name} | {s: f"{_fmt(e)} (n = {e['n']})" for s, e in step["accuracy"].items()}
        row["drift KL per token"] = _fmt(step["drift_kl"])
        rows.append(row)
    report.add_table(rows, heading="Accuracy and drift at each step", caption=(
        "Exact-answer accuracy on held-out templates of both operations (95% Wilson intervals), and the per-token KL "
        "drift from the base model on general texts (95% bootstrap over texts)."))
    for key, label in (("shift_tuned", "after tuning"), ("shift_merged", "after merging")):
        shift = results[key]
        report.add_heading(f"The circuit {label}")
        prefix = "tuned" if key == "shift_tuned" else "merged"
        report.add_figure(figures[f"{prefix}_shift_curves"], caption=(
            f"Faithfulness on {results['n_circuit_prompts']} circuit prompts: the earlier circuit in the earlier model, "
            f"the same edges in the changed model (its own full and empty runs), and the changed model's own "
            f"circuit; bands: 95% bootstrap over prompts. CPR {_fmt(shift['reference_curve']['cpr'])} -> "
            f"{_fmt(shift['transferred_curve']['cpr'])}; Spearman of edge scores {shift['spearman']['value']:.3f}."))
        report.add_figure(figures[f"{prefix}_circuit_shift"], caption=(
            f"Edges at {100 * shift['settings']['size']:g}% of the graph: {shift['edges']['n_kept']} kept, "
            f"{shift['edges']['n_gained']} gained, {shift['edges']['n_lost']} lost."))
        if f"{prefix}_explorer" in figures:
            report.add_explorer(figures[f"{prefix}_explorer"], caption=(
                "The same two circuits at every MIB size: switch the view to compare mode for the edges both keep, "
                "only the earlier model's circuit keeps and only the changed model's own keeps; hover an edge for "
                "its score in each model, click a node for its paths to the logits."))
        report.add_table(shift["node_mass"][:12], heading="Nodes whose in-circuit edge mass changed most")
    report.add_table(run.timer.seconds | {"total": results["wall_seconds"]}, heading="Wall time per stage",
                     columns=("stage", "seconds"))
    report.add_settings(dataclasses.asdict(cfg))
    report.save(run.out / "report.html")


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Parse ``argv`` (default: ``sys.argv``) and run."""
    return run(cli.parse_config(parser, LoopConfig, argv), loader=loader)


if __name__ == "__main__":
    cli.run_cli(main, "loop")
