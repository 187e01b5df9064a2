"""The settings of ``python -m experiments.bench_circuits``: one flag per field of :class:`BenchCircuitsConfig`.

Imports nothing heavy, so ``--help`` and flag errors answer before torch or TransformerLens load.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from circuits.errors import InputError
from experiments.runtime import cli
from experiments.runtime.cli import option, override
from experiments.runtime.settings import PromptSettings, RunSettings, TaskSettings

#: the solved examples before each arithmetic prompt: a pair task's prompts bring their own, so --n-shots set to
#: anything else beside one is refused (the default cannot be told apart from a flag given with its value)
N_SHOTS = 2


def edge_count(text: str) -> str:
    """``all`` or an integer >= 0 (returned as given)."""
    if text != "all" and not (text.isdigit() and int(text) >= 0):
        raise argparse.ArgumentTypeError(f"expected 'all' or an integer >= 0, got {text!r}")
    return text


@dataclass(frozen=True)
class BenchCircuitsConfig(TaskSettings, PromptSettings, RunSettings):
    """Every flag of ``python -m experiments.bench_circuits`` beyond :class:`RunSettings`, with its default."""

    n_prompts: int = override(PromptSettings, "n_prompts", 32, "prompts (one template, one token length; a pair "
                                                               "--task: at most this many of its pairs of one token "
                                                               "length)")
    n_shots: int = override(PromptSettings, "n_shots", N_SHOTS, "solved examples before each arithmetic prompt")
    op: str = option("+", "arithmetic operation (or --task)")
    ig_steps: int = option(5, "EAP-IG integration steps", type=cli.positive_int)
    eap_ig_batch_size: int = option(8, "batch size of the EAP-IG arm", type=cli.positive_int)
    exact_edges: str = option("300", "edges patched exactly: a count (seeded random sample), 'all', or 0 for none",
                              type=edge_count)
    time_prefix_rotary: bool = option(False, "also patch the exact edges with the fast path's old rotary (prefix "
                                             "keys rotated at every call) first, timed side by side")
    compare_per_stratum: int = option(2, "edges per (receiver layer, q/k/v/mlp/logits) stratum timed on edge_patch's "
                                         "fast and hook paths side by side (0: skip)", type=cli.nonnegative_int)
    no_eap_ig: bool = option(False, "skip the hannamw/EAP-IG arm even if importable")
    no_curve: bool = option(False, "skip the faithfulness curves")
    no_attribution: bool = option(False, "skip edge attribution (and with it the EAP-IG arm, the curves and the "
                                         "Spearman against exact effects): time exact patching only")
    memory_mb: float = option(2048.0, "activation budget per batched forward", type=cli.positive_float)
    head_edges: int = option(0, "which head-edge scores are right on post-norm models: this many edges out of heads "
                                "(a seeded sample) patched exactly under both norm conventions, against the EAP-IG "
                                "scores with each head change (0: skip)", type=cli.nonnegative_int)
    acdc_receivers: int = option(0, "time ACDC over the incoming edges of this many receivers (from the output "
                                    "back) beside the plain edge-by-edge loop over the same edges, and auto-circuit's "
                                    "ACDC over the same edges where it is importable (0: skip)",
                                 type=cli.nonnegative_int)
    acdc_threshold: float = option(0.01, "ACDC's threshold τ, in the objective's units", type=float)
    acdc_objective: str = option("kl", "what a removal's damage is measured by: kl (the END distribution's KL from "
                                       "the full model, a full-vocabulary unembedding per circuit) or metric (the task "
                                       "metric's drop)", choices=("kl", "metric"))
    no_auto_circuit: bool = option(False, "skip the auto-circuit ACDC arm even if importable")
    no_plain_acdc: bool = option(False, "skip ACDC's plain edge-by-edge loop (one full forward per edge: on "
                                        "smollm2-135m's last 2 receivers it took over 20 minutes) and time ours "
                                        "beside auto-circuit's alone")
    learn_steps: int = option(0, "also time this many steps of a learned mask (matryoshka, warm-started from EAP-IG) "
                                 "beside one EAP-IG pass, with the memory peak (0: skip)", type=cli.nonnegative_int)

    def __post_init__(self) -> None:
        super().__post_init__()  # --task: an operation sets --op; a pair file is read and checked here
        if self.arithmetic:
            return
        if self.op != "+":
            raise InputError(f"--op {self.op} picks arithmetic prompts, and --task {self.task} brings its own prompt "
                             "pairs: drop --op (or --task).")
        if self.n_shots != N_SHOTS:
            raise InputError(f"--n-shots {self.n_shots} sets the solved examples before arithmetic prompts, and --task "
                             f"{self.task} brings its own prompt pairs: drop --n-shots (or --task).")
