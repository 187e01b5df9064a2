"""Precise SFT of key heads, full SFT, LoRA and circuit LoRA on a `HookedTransformer`, with an evaluation harness.

Quick start::

    from circuits.loading import load_model
    from circuits.nodes import parse_node
    from finetune import TrainConfig, ArithmeticMix, arithmetic_train_set, train

    model = load_model("gemma-3-270m")
    data = arithmetic_train_set(model, ArithmeticMix(n_examples=512))
    heads = [parse_node(h) for h in "L5H0,L7H2,L9H1,L11H3".split(",")]
    result = train(model, data, TrainConfig(lr=1e-4, batch_size=16, max_steps=40),
                   method="precise", heads=heads, out_dir="runs/precise")
    tuned = result.model            # same object, trained in place

Modules: :mod:`finetune.masks` (which entries train), :mod:`finetune.optim`
(AdamW over slices), :mod:`finetune.data` (pairs -> tokens), :mod:`finetune.trainer`
(the loop), :mod:`finetune.configs` (one config per method), :mod:`finetune.checkpoints` (small checkpoints, exact resume),
:mod:`finetune.lora` (peft LoRA on TL parameters), :mod:`finetune.circuit_lora` (LoRA on a circuit's heads
and MLPs only), :mod:`finetune.evaluate`
(accuracy and drift), :mod:`finetune.expert_tasks` (the merge experts' task data).

This face offers the entry points (``__all__``): :func:`train` with :class:`TrainConfig` and the
method configs :class:`PreciseSFTConfig`, :class:`FullSFTConfig`, :class:`LoraSFTConfig`,
:class:`CircuitLoraSFTConfig`; the data
(:class:`ArithmeticMix`, :func:`arithmetic_train_set`); the evaluation (:func:`evaluate_suite`,
:func:`math_suite`, :class:`MathSuiteConfig`); saved models (:func:`save_tuned`, :func:`load_tuned`).
Everything else is imported from its module above (e.g. :func:`finetune.masks.precise_selection`).

The names are imported on first use, so ``import finetune.expert_task_names`` (the merge
experts' task names, for a command line) loads no torch.
"""

from __future__ import annotations

from circuits.lazy_faces import lazy_face

_EXPORTS = {
    "train": "finetune.trainer",
    "TrainConfig": "finetune.configs",
    "PreciseSFTConfig": "finetune.configs",
    "FullSFTConfig": "finetune.configs",
    "LoraSFTConfig": "finetune.configs",
    "CircuitLoraSFTConfig": "finetune.configs",
    "ArithmeticMix": "finetune.data",
    "arithmetic_train_set": "finetune.data",
    "evaluate_suite": "finetune.evaluate",
    "math_suite": "finetune.evaluate",
    "MathSuiteConfig": "finetune.evaluate",
    "save_tuned": "finetune.checkpoints",
    "load_tuned": "finetune.checkpoints",
}

__all__ = ["train", "TrainConfig", "PreciseSFTConfig", "FullSFTConfig", "LoraSFTConfig", "CircuitLoraSFTConfig",
           "ArithmeticMix",
           "arithmetic_train_set", "evaluate_suite", "math_suite", "MathSuiteConfig", "save_tuned", "load_tuned"]


# names load on first use: the package's torch-free modules (catalogues) import without torch
__getattr__, __dir__ = lazy_face(__name__, globals(), _EXPORTS)
