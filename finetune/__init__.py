"""Precise SFT of key heads, full SFT and LoRA on a `HookedTransformer`, with an evaluation harness.

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
:mod:`finetune.lora` (peft LoRA on TL parameters), :mod:`finetune.evaluate`
(accuracy and drift), :mod:`finetune.expert_tasks` (the merge experts' task data).
"""

from finetune.checkpoints import latest_checkpoint, load_tuned, save_tuned
from finetune.data import ArithmeticMix, arithmetic_train_set, encode_pair, encode_pairs, split_templates
from finetune.evaluate import MathSuiteConfig, drift, evaluate_suite, general_texts, math_suite
from finetune.lora import LoraSettings, attach_lora, merge_lora
from finetune.masks import Selection, TunableSlice, apply_selection, full_selection, precise_selection
from finetune.optim import SliceAdamW, lr_at
from finetune.configs import FullSFTConfig, LoraSFTConfig, PreciseSFTConfig, SFTConfig, method_config
from finetune.trainer import METHODS, TrainConfig, TrainResult, train

__all__ = [
    "ArithmeticMix", "LoraSettings", "METHODS", "MathSuiteConfig", "Selection", "SliceAdamW", "TrainConfig",
    "TrainResult", "TunableSlice", "apply_selection", "arithmetic_train_set", "attach_lora", "drift",
    "encode_pair", "encode_pairs", "evaluate_suite", "full_selection", "general_texts", "latest_checkpoint",
    "load_tuned", "lr_at", "math_suite", "merge_lora", "precise_selection", "save_tuned", "split_templates",
    "train",
]
__all__ += ["FullSFTConfig", "LoraSFTConfig", "PreciseSFTConfig", "SFTConfig", "method_config"]
