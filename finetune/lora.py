"""LoRA on a `HookedTransformer` through peft's ``target_parameters``, merged back for evaluation.

peft's usual LoRA layers wrap ``nn.Linear`` modules, which a
`HookedTransformer` does not use: its weights are raw ``nn.Parameter``\\ s,
e.g. ``blocks.3.attn.W_Q`` of shape ``[n_heads, d_model, d_head]``. peft
(>= 0.17) can target parameters directly (``LoraConfig(target_parameters=...)``):
its ``ParamWrapper`` wraps the module that owns the parameter and, during the
forward, registers a ``torch.nn.utils.parametrize`` parametrization that adds
``scaling * B @ A`` to it. A 3-D parameter is treated as a stack of matrices
("experts"), so every head gets its own rank-r factors; a 2-D MLP weight
gets one pair.

One adaptation is needed: ``ParamWrapper.forward(x, *args, **kwargs)`` requires a
positional first argument, while TransformerLens calls its attention module
with keywords only (``attn(query_input=..., key_input=..., ...)``). After
injection each wrapper's ``forward`` is replaced (on the instance) by one
that accepts any arguments and does the same thing: activate the LoRA
parametrization, call the wrapped module.

After training, :func:`merge_lora` folds ``B @ A`` into the weights (peft's own
merge) and puts the original TransformerLens modules back, so the evaluation
harness sees a plain `HookedTransformer` with the same parameter names as
the base model, like the precise and full SFT runs.
"""

from __future__ import annotations

import types
import warnings
from dataclasses import dataclass

import torch
from torch import nn

DEFAULT_TARGETS = ("attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O", "mlp.W_in", "mlp.W_gate", "mlp.W_out")


@dataclass(frozen=True)
class LoraSettings:
    """Rank, scaling (``alpha / r``) and targets (suffixes of parameter names, TransformerLens spelling).

    ``attn.W_K``/``attn.W_V`` mean the stored K/V tensors: ``_W_K``/``_W_V`` on
    grouped/multi-query models. ``layers=None`` adapts every layer.
    """

    r: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = DEFAULT_TARGETS
    layers: tuple[int, ...] | None = None


def lora_targets(model: nn.Module, settings: LoraSettings) -> list[str]:
    """Full parameter names to adapt, with K/V mapped to their stored names under GQA."""
    params = dict(model.named_parameters())
    n_layers = model.cfg.n_layers
    layers = range(n_layers) if settings.layers is None else settings.layers
    names = []
    for layer in layers:
        if not 0 <= layer < n_layers:
            raise ValueError(f"LoRA layer {layer} out of range 0..{n_layers - 1}.")
        for target in settings.targets:
            module, _, param = target.rpartition(".")
            candidates = [f"blocks.{layer}.{target}", f"blocks.{layer}.{module}._{param}"]
            found = [c for c in candidates if c in params]
            if found:
                names.append(found[0])
    if not names:
        raise ValueError(f"No parameter matches the LoRA targets {settings.targets}.")
    for name in names:
        if params[name].ndim not in (2, 3):
            raise ValueError(f"LoRA target {name} has {params[name].ndim} dims; only 2-D and 3-D weights work.")
    return names


def _keyword_forward(wrapper):
    def forward(self, *args, **kwargs):
        if self.disable_adapters or self.merged:
            return self.base_layer(*args, **kwargs)
        with self._activate_lora(self.active_adapters):
            return self.base_layer(*args, **kwargs)

    return types.MethodType(forward, wrapper)


def attach_lora(model: nn.Module, settings: LoraSettings = LoraSettings(), *, seed: int = 0) -> list[str]:
    """Inject LoRA factors into ``model`` in place; freeze everything else; return the factors' parameter names.

    ``B`` starts at zero (peft's default), so the model's outputs are
    unchanged until training moves it; ``A``'s random init is seeded.
    """
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.lora.layer import ParamWrapper

    if any(isinstance(m, ParamWrapper) for m in model.modules()):
        raise ValueError("The model already carries LoRA wrappers; merge_lora() it first.")
    names = lora_targets(model, settings)
    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, target_modules=[], target_parameters=names,
                        lora_dropout=0.0, bias="none")
    for p in model.parameters():
        p.requires_grad_(False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(config, model)
    for module in model.modules():
        if isinstance(module, ParamWrapper):
            module.forward = _keyword_forward(module)
    lora_names = [n for n, p in model.named_parameters() if "lora_" in n]
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
    if not lora_names:
        raise RuntimeError("peft injected no LoRA factors; check the targets.")
    return lora_names


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every LoRA delta into its weight and restore the original modules (in place; returns ``model``)."""
    from peft.tuners.lora.layer import ParamWrapper

    replaced = 0
    for name, module in list(model.named_modules()):
        if not isinstance(module, ParamWrapper):
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if isinstance(parent, ParamWrapper):
            continue  # nested wrapper: merged by its outermost one
        with warnings.catch_warnings():  # nested wrappers report "already merged" once merged from outside
            warnings.simplefilter("ignore", UserWarning)
            base = module.unload_and_optionally_merge_module(merge=True, safe_merge=True, adapter_names=None)
        setattr(parent, child, base)
        replaced += 1
    if replaced == 0:
        raise ValueError("The model carries no LoRA wrappers to merge.")
    for module in model.modules():
        # Unwrapping nested ParamWrappers leaves the innermost module registered as its own
        # ``base_layer`` child (a cycle that breaks state_dict()); peft's BaseTuner unload
        # cleans this up, the bare inject_adapter_in_model route must do it here.
        if module._modules.get("base_layer") is module:
            del module._modules["base_layer"]
    for p in model.parameters():
        p.requires_grad_(True)
    return model
