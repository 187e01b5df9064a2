"""``python -m experiments.merge --config recipe.yml``: run a mergekit YAML recipe and save the merged model.

Apart from the experiment itself: one merge as mergekit describes it, loaded into a TransformerLens
architecture and saved (safetensors) with a results.json of its cost (``seconds``: the merge's time;
``wall_seconds``: the whole command). A recipe that cannot be read or merged leaves the run folder
``failed: merge: <why>``.
"""

from __future__ import annotations

from circuits import save_model
from circuits.errors import InputError
from experiments.runtime import ModelLoader, Run, run_experiment
from merging import load_mergekit_config
from merging.state_dicts import StateDictSource, is_buffer

from experiments.merge.experts import measured


def run_mergekit_yaml(cfg, *, loader: ModelLoader | None = None) -> dict:
    """Run the mergekit YAML ``cfg.config`` (``cfg``: an ``experiments.merge.MergeConfig``): merge, load into
    ``cfg.model``'s architecture (through ``loader``), save, write results.json; return its results."""
    # stage_seconds=False: "seconds" is the merge's time here, as it was before the shared lifecycle
    return run_experiment("merge", cfg, _merge_and_save, loader=loader, results={}, default_out="merge-config",
                          stage_seconds=False)


def _merge_and_save(run: Run) -> None:
    cfg, out = run.cfg, run.out
    plan = load_mergekit_config(cfg.config)
    model = run.load_model(stage=None)
    check_architecture(plan.base, model, cfg)
    merged, seconds, peak_mb = measured(plan.run)
    missing, unexpected = model.load_state_dict(merged, strict=False)
    missing = [k for k in missing if not is_buffer(k)]  # buffers (masks, rotary tables) come from the config
    if unexpected or missing:
        raise InputError(f"The merged weights do not fit {cfg.model}: missing {missing[:5]}, unexpected {unexpected[:5]}; "
                         "give --model the architecture of the YAML's models.")
    path = save_model(model, out / "merged", overwrite=cfg.overwrite)
    run.results |= {
        "config": str(cfg.config), "method": plan.method, "method_config": repr(plan.config),
        "weights": plan.weights, "models": plan.expert_names, "seconds": round(seconds, 2),
        "peak_mb": round(peak_mb, 1), "merged": str(path)}
    print(f"{plan.method}: merged {len(plan.experts)} models in {seconds:.1f} s (peak +{peak_mb:.0f} MB) -> {path}")


def check_architecture(base: StateDictSource, model, cfg) -> None:
    """Before any merge: the YAML's base (the experts are checked against it by the merge) must have the parameters,
    with their shapes, of ``--model``, into which the merged weights are loaded."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items() if not is_buffer(k)}
    have = {k: base.shape(k) for k in base.param_keys()}
    if want == have:
        return
    missing, extra = sorted(want.keys() - have.keys()), sorted(have.keys() - want.keys())
    reshaped = [k for k in sorted(want.keys() & have.keys()) if have[k] != want[k]]
    problems = []
    if missing:
        problems.append(f"none of its {len(missing)} parameters {missing[:3]}{'...' if len(missing) > 3 else ''}")
    if extra:
        problems.append(f"{len(extra)} parameters it lacks, e.g. {extra[:3]}")
    if reshaped:
        problems.append(f"{reshaped[0]} of shape {have[reshaped[0]]} where it has {want[reshaped[0]]}"
                        + (f" ({len(reshaped)} such)" if len(reshaped) > 1 else ""))
    raise InputError(f"{cfg.config}: its models do not have the architecture of --model {cfg.model}: the base "
                     f"({base.name}) has {'; '.join(problems)}. Give --model the architecture of the YAML's models "
                     "(nothing was merged).")
