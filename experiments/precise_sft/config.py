"""The settings of ``python -m experiments.precise_sft``: one flag per field of :class:`SFTComparisonConfig`.

Imports nothing heavy, so ``--help`` and flag errors answer before torch or TransformerLens load.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from circuits.errors import InputError
from experiments.runtime import RunSettings, cli, option
from experiments.runtime.settings import LearnSettings

# method -> (train() method, TrainConfig overrides, lr-grid flag)
METHOD_SPECS = {
    "precise": ("precise", {"tune_kv": True}, "precise_lrs"),
    "precise_nokv": ("precise", {"tune_kv": False}, "precise_lrs"),
    "full": ("full", {}, "full_lrs"),
    "lora": ("lora", {}, "lora_lrs"),
    # the same precise SFT, of the heads holding the most in-circuit edge score of the EAP-IG edge circuit
    "precise_circuit": ("precise", {"tune_kv": True}, "precise_lrs"),
    # LoRA adapters on the key heads' slices only (finetune.circuit_lora): precise SFT's heads, LoRA's low rank
    "circuit_lora": ("circuit_lora", {}, "circuit_lora_lrs"),
    # the same adapters without the K/V rows, which under multi-query attention every head of the layer reads
    "circuit_lora_nokv": ("circuit_lora", {"lora_targets": ("attn.W_Q", "attn.W_O", "mlp.W_in", "mlp.W_gate",
                                                            "mlp.W_out")}, "circuit_lora_lrs"),
}
DEFAULT_METHODS = ("precise", "precise_nokv", "full", "lora")
DEFAULT_OUT = "runs/precise_sft"  # one folder, not runs/<name>-<timestamp>: --resume without --out continues it


def lr_list(text: str) -> list[float]:
    """Comma-separated learning rates > 0, e.g. ``1e-5,3e-5``."""
    lrs = sorted({cli.positive_float(t.strip()) for t in text.split(",") if t.strip()})
    if not lrs:
        raise argparse.ArgumentTypeError(f"expected comma-separated learning rates such as 1e-5,3e-5, got {text!r}")
    return lrs


def method_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in METHOD_SPECS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown method(s) {unknown or text!r}; choose from {', '.join(METHOD_SPECS)}")
    return names


@dataclass(frozen=True)
class SFTComparisonConfig(LearnSettings, RunSettings):
    """Every flag of ``python -m experiments.precise_sft``, with its default (model, device, dtype, threads,
    seed, out and overwrite: :class:`experiments.runtime.RunSettings`; ``out`` None means ``runs/precise_sft``).

    ``methods`` and the lr grids are typed as comma-separated text on the command line and held as
    tuples here (a string given in Python is parsed the same way). Not to be confused with
    :class:`finetune.PreciseSFTConfig`, the training settings of one precise SFT run.
    """

    methods: tuple[str, ...] = option(",".join(DEFAULT_METHODS), "comma-separated methods to run: "
                                      + ", ".join(METHOD_SPECS) + " (default: the first four)", type=method_list)
    heads: str | None = option(None, "key heads, e.g. L9H1,L11H0 (default: path patching)")
    mlps: str | None = option(None, "top MLPs for the ablation, e.g. MLP15,MLP16 (default: path patching)")
    k: int = option(8, "key heads in the precise runs", type=cli.positive_int)
    ablation_k: str = option("", "head counts of the Table-2 ablation, e.g. 4,8,16,32 (default: none, no ablation)")
    ablation_mlps: int = option(0, "top MLPs added in the ablation's second arm (0: skip)", type=cli.nonnegative_int)
    n_train: int = option(256, "training examples (all four operations)", type=cli.positive_int)
    steps: int = option(16, "optimizer steps per run", type=cli.positive_int)
    batch_size: int = option(16, "examples per optimizer step", type=cli.positive_int)
    micro_batch_size: int = option(8, "examples per forward/backward pass", type=cli.positive_int)
    precise_lrs: tuple[float, ...] = option("3e-5,1e-4,3e-4", "lr grid of both precise arms", type=lr_list)
    full_lrs: tuple[float, ...] = option("3e-6,1e-5,3e-5", "lr grid of full SFT", type=lr_list)
    lora_lrs: tuple[float, ...] = option("1e-4,3e-4,1e-3", "lr grid of LoRA", type=lr_list)
    circuit_lora_lrs: tuple[float, ...] = option("3e-4,1e-3,3e-3", "lr grid of circuit LoRA", type=lr_list)
    lora_rank: int = option(8, "LoRA rank on every attention and MLP weight (circuit_lora: on the key heads' slices)",
                            type=cli.positive_int)
    n_val: int = option(24, "validation prompts per operation (choose the lr)", type=cli.positive_int)
    n_heldout: int = option(48, "held-out-template test prompts per operation", type=cli.positive_int)
    n_transfer: int = option(16, "test prompts per operation and transfer format", type=cli.positive_int)
    n_shots: int = option(2, "few-shot examples before each training/eval prompt", type=cli.nonnegative_int)
    n_pydoc: int = option(8, "pydoc passages in the drift text", type=cli.nonnegative_int)
    n_sentences: int = option(30, "project sentences in the drift text (at most 30)", type=cli.positive_int)
    drift_tokens: int = option(96, "tokens per drift passage (KL and LM loss on non-math text)", type=cli.positive_int)
    n_rank_prompts: int = option(24, "prompts per operation for ranking heads", type=cli.positive_int)
    circuit_size: float = option(0.05, "precise_circuit: the edge-circuit size (fraction of edges) whose heads are "
                                       "tuned", type=cli.fraction)
    shift_prompts: int = option(0, "also report each tuned model's circuit shift from the base (patching.edges.circuit_shift) "
                                   "on this many addition prompts (0: skip)", type=cli.nonnegative_int)
    resume: bool = option(False, "add the --methods to an unfinished or finished folder of the same settings")

    def __post_init__(self):
        for name, parse in (("methods", method_list), ("precise_lrs", lr_list), ("full_lrs", lr_list),
                            ("lora_lrs", lr_list), ("circuit_lora_lrs", lr_list)):
            value = getattr(self, name)
            try:
                parsed = parse(value) if isinstance(value, str) else value
            except argparse.ArgumentTypeError as err:
                raise InputError(f"SFTComparisonConfig.{name}: {err}") from None
            object.__setattr__(self, name, tuple(parsed))
        super().__post_init__()

    def lr_grid(self, method_key: str) -> list[float]:
        """The learning rates tried for ``method_key``."""
        return list(getattr(self, METHOD_SPECS[method_key][2]))

    def ablation_ks(self) -> list[int]:
        return [int(k) for k in self.ablation_k.split(",") if k.strip()]
