"""How does the model represent numbers? Fourier features, helix, mod-T probes, heuristic neurons.

    python -m experiments.numbers [--model gemma-3-270m] [--out runs/numbers-<timestamp>] [--overwrite]

1. **numbers alone**: h(n) for n = 0..``--n-numbers``−1 at the number's last token ("{n}"),
   every layer and component; the embedding / unembedding rows of single-token numbers;
2. **sums**: prompts "a + b = " (a, b in 0..``--operand-max``, every sum present
   ``--per-result`` times), h at END per prompt, indexed by the sum;
3. for every (layer, component) of both: Fourier spectrum vs the shuffled-n null, helix
   fit vs PCA of equal rank (held-out numbers), mod-T probes (κ, held-out, vs shuffled labels);
4. **frequency filter** on the sum prompts: remove the low band (periods ≥ ``--low-min-period``),
   the high band (periods ≤ ``--high-max-period``) or, as a control, the mid band between them,
   of every MLP's or every attention layer's output over the sum; first-token accuracy;
5. **helix-subspace patching** at END (resid_post, ``--patch-layers``): pairs of correctly answered
   sum prompts with different first answer digits; helix vs PCA vs random subspace of the
   same dimension vs the whole layer; fraction of the logit difference moved;
6. **heuristic neurons** on the one-digit grid a, b in 0..9: the ``--top-neurons`` END MLP neurons
   by attribution, classified by their (a, b) pattern; mean-ablation knockout per type vs
   as many random neurons;
7. results.json, figures.html and report.html in ``--out``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

# only light imports here: the parser answers --help and flag errors before torch or TransformerLens load
from circuits.errors import InputError
from experiments.numbers.config import NumbersConfig

from experiments.runtime import ModelLoader, Run, cli, run_experiment

if TYPE_CHECKING:
    import torch

MODULI = (2, 5, 10)


parser = cli.config_parser(NumbersConfig, "numbers", __doc__)


def check_settings_against_model(cfg: NumbersConfig, model) -> None:
    """Refuse, right after the model loads, ``--patch-layers`` the model does not have (they were skipped silently)."""
    if cfg.patch_layers is None:
        return
    n_layers = model.cfg.n_layers
    bad = [layer for layer in cfg.patch_layers if not 0 <= layer < n_layers]
    if bad:
        raise InputError(f"--patch-layers {' '.join(map(str, cfg.patch_layers))}: {bad} "
                         f"{'is' if len(bad) == 1 else 'are'} not a layer of {cfg.model}, which has layers "
                         f"0..{n_layers - 1}.")
    if "resid_post" not in cfg.components:
        raise InputError(f"--patch-layers patches resid_post, which --components {' '.join(cfg.components)} leaves "
                         "out: add resid_post to --components, or drop --patch-layers.")


@dataclass
class SumPrompts:
    """The "a + b = " prompts, their sums and first answer tokens, END activations, and which are answered right."""

    prompts: object
    sums: list[int]
    answer_ids: list[int]
    end_acts: dict
    correct: torch.Tensor


def _key(layer: int, component: str) -> str:
    return f"L{layer}.{component}"


def analyse(h: torch.Tensor, values: list[int], cfg: NumbersConfig, *, spectrum_rows: torch.Tensor | None = None) -> dict:
    """Spectrum (over ``spectrum_rows``, consecutive values), helix vs PCA and mod-T probes of one representation."""
    from circuits.analyze.number_geometry import fit_helix, fourier_spectrum, mod_probe

    spectrum = fourier_spectrum(h if spectrum_rows is None else spectrum_rows, n_shuffles=cfg.n_shuffles,
                                alpha=cfg.alpha, seed=cfg.seed)
    row = {"spectrum": spectrum.to_dict(), "helix": fit_helix(h, values, seed=cfg.seed).to_dict(), "probes": {}}
    for t in MODULI:
        real = mod_probe(h, values, t, seed=cfg.seed)
        control = mod_probe(h, values, t, seed=cfg.seed, shuffle_labels=True)
        row["probes"][t] = {"kappa": real.kappa.to_dict(), "accuracy": real.accuracy,
                            "shuffled_kappa": control.kappa.to_dict()}
    return row


def numbers_alone(model, cfg: NumbersConfig, keys: list, stage) -> dict:
    """Stage 1: every number's representation at its last token, and the embedding / unembedding rows."""
    from circuits.analyze.number_geometry import fourier_spectrum
    from circuits.analyze.number_tokens import number_activations, number_token_vectors

    numbers = list(range(cfg.n_numbers))
    with stage("number activations"):
        acts = number_activations(model, numbers, keys, template=cfg.template, batch_size=cfg.batch_size)
    with stage("number analyses"):
        section = {_key(*k): analyse(acts[k], numbers, cfg) for k in keys}
        tokens = {}
        for which in ("embed", "unembed"):
            token_numbers, vectors = number_token_vectors(model, cfg.n_numbers - 1, which)
            spectrum = fourier_spectrum(vectors, n_shuffles=cfg.n_shuffles, alpha=cfg.alpha, seed=cfg.seed)
            tokens[which] = {"numbers": [token_numbers[0], token_numbers[-1]], "spectrum": spectrum.to_dict()}
    return {"numbers": section, "token_vectors": tokens}


def sums_at_end(model, cfg: NumbersConfig, keys: list, stage) -> tuple[SumPrompts, dict]:
    """Stage 2: the sum prompts' END representations, analysed per (layer, component), and the base accuracy."""
    from circuits.analyze.number_tokens import arithmetic_activations, arithmetic_prompts, group_mean, pairs_by_result
    from circuits.stats import proportion
    from patching.node_level.number_interventions import evaluate_end

    pairs = pairs_by_result(cfg.operand_max, cfg.per_result, seed=cfg.seed)
    prompts = arithmetic_prompts(model, pairs, prefix=cfg.prefix)
    sums, answer_ids = prompts.results, [r["answer_token_ids"][0] for r in prompts.rows]
    with stage("sum activations"):
        end_acts = arithmetic_activations(model, prompts, keys, batch_size=cfg.batch_size)
    with stage("sum analyses"):
        section = {}
        for k in keys:
            _, means = group_mean(end_acts[k], sums)
            section[_key(*k)] = analyse(end_acts[k], sums, cfg, spectrum_rows=means)
    with stage("sum accuracy"):
        correct = evaluate_end(model, prompts.tokens(), answer_ids, batch_size=cfg.batch_size)["correct"]
    print(f"sum prompts: {len(pairs)}, first-token accuracy {proportion(correct)}")
    info = {"n": len(pairs), "operand_max": cfg.operand_max, "per_result": cfg.per_result,
            "example": prompts.rows[0]["prompt"], "accuracy": proportion(correct).to_dict()}
    return SumPrompts(prompts, sums, answer_ids, end_acts, correct), {"sums": section, "sum_prompts": info}


def frequency_bands(n_values: int, cfg: NumbersConfig) -> dict[str, list[int]]:
    """Low, mid and high Fourier bands over ``n_values`` consecutive sums (the empty ones left out).

    The mid band (periods strictly between the two) is the control: removing about as many
    frequencies as the low band, but ones neither paper assigns to MLPs or attention.
    """
    from patching.node_level.number_interventions import frequency_band

    bands = {"low": frequency_band(n_values, min_period=cfg.low_min_period),
             "mid": [k for k in frequency_band(n_values, min_period=cfg.high_max_period, max_period=cfg.low_min_period)
                     if cfg.high_max_period < n_values / k < cfg.low_min_period],
             "high": frequency_band(n_values, max_period=cfg.high_max_period)}
    return {band: ks for band, ks in bands.items() if ks}  # an empty band is listed in empty_bands by the stage


def frequency_filter(model, cfg: NumbersConfig, data: SumPrompts, stage) -> dict:
    """Stage 3: remove one band of every MLP's (or attention layer's) output over the sum; first-token accuracy."""
    from circuits.stats import paired_difference, proportion
    from patching.node_level.number_interventions import evaluate_end, frequency_filter_edit

    n_values = max(data.sums) - min(data.sums) + 1
    bands, rows = frequency_bands(n_values, cfg), []
    with stage("frequency filter"):
        for component in ("mlp_out", "attn_out"):
            if component not in cfg.components:
                continue
            for band, ks in bands.items():
                edits = [frequency_filter_edit(f"blocks.{layer}.hook_{component}", data.end_acts[(layer, component)],
                                               data.sums, ks, "remove")[0] for layer in range(model.cfg.n_layers)]
                correct = evaluate_end(model, data.prompts.tokens(), data.answer_ids, batch_size=cfg.batch_size,
                                       edit=lambda chunk, edits=edits: [h for e in edits for h in e(chunk)])["correct"]
                rows.append({"component": component, "removed_band": band, "n_frequencies": len(ks),
                             "periods": [round(n_values / k, 2) for k in (ks[0], ks[-1])],
                             "accuracy": proportion(correct).to_dict(),
                             "change": paired_difference(correct.float(), data.correct.float()).to_dict()})
                print(f"remove {band:4s} frequencies of every {component}: accuracy {proportion(correct)}")
    empty = [band for band in ("low", "mid", "high") if band not in bands]
    if empty:
        print(f"no frequency of {n_values} sums falls in the {', '.join(empty)} band(s); not filtered")
    return {"n_values": n_values, "bands": {b: len(k) for b, k in bands.items()}, "empty_bands": empty, "rows": rows}


def patch_pairs(data: SumPrompts, cfg: NumbersConfig) -> list[tuple[int, int]]:
    """Up to ``n_pairs`` (clean, counterfactual) pairs of correctly answered prompts with different first answer tokens."""
    rng = random.Random(cfg.seed)
    correct_idx = [i for i in range(len(data.sums)) if data.correct[i]]
    pairs = []
    for i in rng.sample(correct_idx, len(correct_idx)):
        options = [j for j in correct_idx if data.answer_ids[j] != data.answer_ids[i]]
        if options:
            pairs.append((i, rng.choice(options)))
        if len(pairs) == cfg.n_pairs:
            break
    return pairs


def subspace_patching(model, cfg: NumbersConfig, data: SumPrompts, stage) -> dict:
    """Stage 4: patch the helix / PCA / random subspace (or the whole layer) of resid_post at END; fraction moved."""
    import numpy as np
    import torch

    from circuits.analyze.number_geometry import fit_helix, orthonormal_columns, pca_subspace
    from circuits.seeds import derived_seed
    from patching.node_level.number_interventions import evaluate_end, fraction_moved, subspace_patch_edit

    n_layers = model.cfg.n_layers
    layers = list(cfg.patch_layers or sorted(set(np.linspace(0, n_layers - 1, 4).round().astype(int).tolist())))
    pairs = patch_pairs(data, cfg)
    section = {"layers": layers, "n_pairs": len(pairs), "rows": []}
    if "resid_post" not in cfg.components:  # only with the default layers: explicit ones were refused at load
        section["skipped"] = "resid_post is not in --components, and the subspaces are fitted to it"
        return section
    if not pairs:
        return section
    clean_tokens = [data.prompts.rows[i]["tokens"] for i, _ in pairs]
    clean_ans, cf_ans = [data.answer_ids[i] for i, _ in pairs], [data.answer_ids[j] for _, j in pairs]
    with stage("subspace patching"):
        ld_clean = evaluate_end(model, clean_tokens, clean_ans, alt_ids=cf_ans)["logit_diff"]
        ld_cf = evaluate_end(model, [data.prompts.rows[j]["tokens"] for _, j in pairs], clean_ans,
                             alt_ids=cf_ans)["logit_diff"]
        for layer in layers:
            h = data.end_acts[(layer, "resid_post")]  # layers and components were checked at load
            fit = fit_helix(h, data.sums, test_fraction=0.0)
            rank = fit.subspace.shape[1]
            generator = torch.Generator().manual_seed(derived_seed(cfg.seed, "random subspace", layer))
            arms = {"helix": fit.subspace, "pca": pca_subspace(h, rank),
                    "random": orthonormal_columns(torch.randn(h.shape[1], rank, generator=generator, dtype=torch.float64)),
                    "whole": None}
            cf_rows = h[[j for _, j in pairs]]
            row = {"layer": layer, "rank": rank, "helix_r2": fit.r2_train}
            for arm, basis in arms.items():
                patched = evaluate_end(model, clean_tokens, clean_ans, alt_ids=cf_ans,
                                       edit=subspace_patch_edit(f"blocks.{layer}.hook_resid_post", cf_rows, basis))
                row[arm] = fraction_moved(ld_clean, ld_cf, patched["logit_diff"], seed=cfg.seed).to_dict()
            section["rows"].append(row)
            print(f"layer {layer:2d} (rank {rank}): " + ", ".join(f"{a} {row[a]['value']:.2f}" for a in arms))
    return section


def neuron_knockouts(model, cfg: NumbersConfig, grid, grid_answers, chosen, labels, means,
                     pool) -> tuple[list[dict], torch.Tensor]:
    """Mean-ablate each heuristic type's neurons (and as many random ones); the rows and the unablated correctness."""
    from circuits.analyze.heuristic_neurons import census
    from circuits.stats import paired_difference, proportion
    from patching.node_level.number_interventions import evaluate_end, neuron_knockout_edit

    grid_base = evaluate_end(model, grid.tokens(), grid_answers)["correct"]
    groups = {kind: [n for n, l in zip(chosen, labels) if l.type == kind] for kind in census(labels)}
    groups["all top neurons"] = list(chosen)
    knockouts = []
    for kind, neurons in groups.items():
        if not neurons:
            continue
        random_neurons = random.Random(cfg.seed).sample(pool, len(neurons))
        arms = {}
        for arm, group in (("ablated", neurons), ("random", random_neurons)):
            correct = evaluate_end(model, grid.tokens(), grid_answers, edit=neuron_knockout_edit(group, means))["correct"]
            arms[arm] = {"accuracy": proportion(correct).to_dict(),
                         "change": paired_difference(correct.float(), grid_base.float()).to_dict()}
        knockouts.append({"type": kind, "n_neurons": len(neurons), **arms})
        print(f"knock out {len(neurons):3d} {kind:18s}: accuracy {arms['ablated']['accuracy']['value']:.2f} "
              f"(random {arms['random']['accuracy']['value']:.2f}, base {float(grid_base.float().mean()):.2f})")
    return knockouts, grid_base


def heuristic_neurons(model, cfg: NumbersConfig, stage) -> tuple[dict, torch.Tensor, list]:
    """Stage 5: the top END MLP neurons by attribution on a, b in 0..9, their heuristic types, knockout per type."""
    import torch

    from circuits.analyze.heuristic_neurons import census, classify_grids
    from circuits.analyze.number_tokens import arithmetic_prompts, single_token_numbers
    from circuits.stats import proportion
    from patching.node_level.number_interventions import neuron_attribution, top_neurons

    grid_pairs = [(a, b) for a in range(10) for b in range(10)]
    grid = arithmetic_prompts(model, grid_pairs, prefix=cfg.prefix)
    grid_answers = [r["answer_token_ids"][0] for r in grid.rows]
    digits = list(single_token_numbers(model, 9).values())
    layers = list(range(model.cfg.n_layers))
    with stage("neuron attribution"):
        scores, neuron_acts = neuron_attribution(model, grid.tokens(), grid_answers, layers, candidate_ids=digits,
                                                 batch_size=cfg.batch_size)
    chosen = top_neurons(scores, layers, min(cfg.top_neurons, scores.numel()))
    grids = torch.stack([neuron_acts[:, layer, index].reshape(10, 10) for layer, index in chosen])
    labels = classify_grids(grids, threshold=cfg.heuristic_threshold)
    means = {layer: neuron_acts[:, layer].mean(0) for layer in layers}
    pool = [(layer, i) for layer in layers for i in range(model.cfg.d_mlp) if (layer, i) not in set(chosen)]
    with stage("neuron knockout"):
        knockouts, grid_base = neuron_knockouts(model, cfg, grid, grid_answers, chosen, labels, means, pool)
    section = {
        "grid": "a + b, a and b in 0..9", "n_prompts": len(grid_pairs), "base_accuracy": proportion(grid_base).to_dict(),
        "top_k": len(chosen), "threshold": cfg.heuristic_threshold, "census": census(labels),
        "neurons": [{"layer": layer, "neuron": i, "score": float(scores[layer, i]), "type": l.type,
                     "pattern": l.pattern, "correlation": l.correlation} for (layer, i), l in zip(chosen, labels)],
        "layer_histogram": {str(layer): sum(1 for lay, _ in chosen if lay == layer) for layer in layers},
        "knockout": knockouts,
    }
    return section, grids, labels


def run(cfg: NumbersConfig, *, loader: ModelLoader | None = None) -> dict:
    """Run every stage; return the results dict that is also written to results.json."""
    return run_experiment("numbers", cfg, _stages, loader=loader, plan=plan(cfg),
                          results={"model": cfg.model, "settings": dataclasses.asdict(cfg)})


def plan(cfg: NumbersConfig) -> list[str]:
    """The stages a run with these settings goes through, in order (their names as in results.json ``seconds``);
    the subspace patching needs ``resid_post`` among ``--components``."""
    return ["load model", "number activations", "number analyses", "sum activations", "sum analyses", "sum accuracy",
            "frequency filter", *(["subspace patching"] if "resid_post" in cfg.components else []),
            "neuron attribution", "neuron knockout"]


@cli.no_grad
def _stages(run: Run) -> None:
    from circuits.analyze.number_geometry import HELIX_PERIODS
    from experiments.numbers.report import write_report

    cfg, out, results = run.cfg, run.out, run.results
    model = run.load_model()
    check_settings_against_model(cfg, model)
    keys = [(layer, c) for layer in range(model.cfg.n_layers) for c in cfg.components]
    results |= {"n_layers": model.cfg.n_layers, "moduli": list(MODULI), "helix_periods": list(HELIX_PERIODS)}
    results |= numbers_alone(model, cfg, keys, run.stage)
    data, sums_section = sums_at_end(model, cfg, keys, run.stage)
    results |= sums_section
    results["frequency_filter"] = frequency_filter(model, cfg, data, run.stage)
    results["subspace_patching"] = subspace_patching(model, cfg, data, run.stage)
    del data
    results["heuristic_neurons"], grids, labels = heuristic_neurons(model, cfg, run.stage)
    results |= {"seconds": run.timer.seconds, "wall_seconds": run.wall_seconds}
    run.save()
    # The report reads what results.json holds (JSON keys are strings), not the in-memory dict.
    write_report(json.loads((out / "results.json").read_text()), out, grids=grids[:12], grid_labels=labels[:12])
    print(f"wrote {out}/results.json, figures.html, report.html in {results['wall_seconds']:.0f} s")


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Parse ``argv`` (default: ``sys.argv``) and run."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    return run(cli.parse_config(parser, NumbersConfig, argv), loader=loader)
