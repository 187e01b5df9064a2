"""The settings of the arithmetic pipeline: one flag per field of :class:`PipelineConfig`.

Imports nothing heavy, so ``--help`` and flag errors answer before torch or TransformerLens load.
"""

from __future__ import annotations

from dataclasses import dataclass

from circuits.counterfactuals import CORRUPTIONS
from experiments.runtime import RunSettings, cli, option
from experiments.runtime.settings import BatchSettings, LearnSettings, PromptSettings
from patching.edges.catalogue import SEARCH_METHODS

MIN_READABLE = 20  # fewer prompts than this and a stage's numbers are noise: the report says so instead

#: ``--quick``: every stage on few prompts, a preview in about a minute (flags given beside it still win)
QUICK = {"n_prompts": 48, "knockout_prompts": 16, "knockout_ks": "1,4", "knockout_seeds": 3, "knockout_pool": 128,
         "transfer_prompts": 8, "af1_prompts": 20, "af1_stride": 6, "circuit_prompts": 16, "learn_steps": 20,
         "circuit_stability_sets": 0}


@dataclass(frozen=True)
class PipelineConfig(LearnSettings, BatchSettings, PromptSettings, RunSettings):
    """Every flag of the experiment beyond the shared settings records, with its default (``op`` is fixed by the command)."""

    op: str = "+"
    top_k: int = option(8, "number of key heads (by path-patching effect)", type=cli.positive_int)
    knockout_prompts: int = option(64, "prompts for the knockout curves", type=cli.positive_int)
    knockout_ks: str = option("1,2,4,8", "comma-separated numbers of heads to knock out", type=cli.int_list)
    knockout_seeds: int = option(10, "random-rank repeats per k", type=cli.positive_int)
    knockout_pool: int = option(512, "prompts (none of them evaluated) the ablation means are averaged over, per format",
                                type=cli.positive_int)
    corrupt: str = option("query", "counterfactual twins of the key-head ranking: 'query' (the queried operator) or "
                                   "'all' (every operator, shots too); both are reported", choices=CORRUPTIONS)
    transfer_prompts: int = option(32, "prompts per transfer format", type=cli.positive_int)
    af1_stride: int = option(3, "L_wait step of the coarse AF1 grid on zero-shot one-token prompts (0: skip AF1)",
                             type=cli.nonnegative_int)
    af1_prompts: int = option(55, "prompts for the AF1 grid (55 = every one-digit sum below 10)", type=cli.positive_int)
    circuit_prompts: int = option(64, "correct prompts for the edge circuit, half to learn (or score) it and choose "
                                      "its size, half to report it (0: skip)", type=cli.nonnegative_int)
    circuit_method: str = option("top-n", "the edge circuit's method: top-n (the learned straight-through top-n, "
                                          "warm-started from --warm-start), another learned method, or an "
                                          "attribution method, e.g. EAP-IG-inputs (attribution alone, faster)",
                                 choices=SEARCH_METHODS)
    circuit_stability_sets: int = option(2, "disjoint prompt sets of circuit_prompts // 2 the circuit method runs on "
                                            "to say whether it finds the same circuit (the first is the circuit's own; "
                                            "0: skip)", type=cli.nonnegative_int)
    quick: bool = option(False, "a preview in about a minute: every stage on few prompts (" + ", ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items()) + "); the report says its numbers are a preview")
    finetune: bool = option(False, "also tune the key heads with precise SFT and report accuracy before/after")
    finetune_steps: int = option(30, "optimizer steps of that precise SFT run", type=cli.positive_int)
    figures: str = option("", "also write each figure as static files next to its JSON, sized for a two-column paper: a "
                              "comma-separated subset of svg,pdf,png; needs kaleido and Chrome/Chromium (default: none)",
                          type=cli.figure_formats)
