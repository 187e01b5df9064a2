"""One config per training method, on a shared base.

:class:`SFTConfig` holds what every method shares (the paper's optimization settings, §5.3, and
bookkeeping); :class:`PreciseSFTConfig`, :class:`FullSFTConfig`, :class:`LoraSFTConfig` and
:class:`CircuitLoraSFTConfig` add their method's
own fields, and their type names the method, so ``train(model, data, LoraSFTConfig(lora=...))`` needs no
``method=``. :class:`TrainConfig` holds every method's fields at once, for a script that trains several
methods from one set of flags; :func:`method_config` narrows it to one method's config, which is what a
run's identity (the resume check) is made of.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Literal, get_args

from circuits.errors import InputError
from circuits.arguments import check_option
from finetune.lora import LoraSettings
from finetune.optim import check_betas

Method = Literal["precise", "full", "lora", "circuit_lora"]
METHODS: tuple[str, ...] = get_args(Method)


@dataclass(frozen=True)
class SFTConfig:
    """The settings every method shares: optimization (the paper's, §5.3, as defaults) and bookkeeping.

    ``batch_size`` is the number of examples per optimizer step (across all
    processes); ``micro_batch_size`` how many go through one forward/backward.
    ``epochs`` may be fractional; ``max_steps`` overrides it.
    """

    lr: float = 2e-5
    batch_size: int = 128
    micro_batch_size: int = 8
    epochs: float = 2.0
    max_steps: int | None = None
    warmup_ratio: float = 0.02
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    seed: int = 0
    # bookkeeping (not part of the run's identity)
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    progress: bool = True

    def __post_init__(self):
        # Checked here, not after a run: a NaN or negative lr trains to a NaN model without complaint.
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise InputError(f"lr must be a finite number > 0, got {self.lr!r}.")
        check_betas(self.betas)
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise InputError(f"eps must be a finite number > 0, got {self.eps!r}.")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise InputError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}.")
        if not (math.isfinite(self.warmup_ratio) and 0 <= self.warmup_ratio <= 1):
            raise InputError(f"warmup_ratio must lie in [0, 1], got {self.warmup_ratio!r}.")
        if self.max_grad_norm is not None and not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise InputError(f"max_grad_norm must be a finite number > 0 or None, got {self.max_grad_norm!r}.")

    def identity(self) -> dict:
        """The fields a resumed run must share with the run it continues."""
        data = asdict(self)
        for key in ("checkpoint_every", "keep_checkpoints", "progress"):
            data.pop(key)
        return data


@dataclass(frozen=True)
class PreciseSFTConfig(SFTConfig):
    """Precise SFT: ``tune_kv`` also trains the K/V slices the key heads read; ``rescale`` (see finetune.masks)."""

    tune_kv: bool = True
    rescale: bool = True


@dataclass(frozen=True)
class FullSFTConfig(SFTConfig):
    """Full SFT: every parameter, the embeddings only with ``train_embeddings``."""

    train_embeddings: bool = False


@dataclass(frozen=True)
class LoraSFTConfig(SFTConfig):
    """LoRA: rank-r factors on the targets of ``lora``, merged into the weights at the end."""

    lora: LoraSettings = field(default_factory=LoraSettings)


@dataclass(frozen=True)
class CircuitLoraSFTConfig(SFTConfig):
    """Circuit LoRA: rank-r factors on the given heads' and MLPs' slices only (:mod:`finetune.circuit_lora`; the
    targets of ``lora`` say which weight matrices, its ``layers`` must stay None), merged in at the end."""

    lora: LoraSettings = field(default_factory=LoraSettings)


@dataclass(frozen=True)
class TrainConfig(PreciseSFTConfig, FullSFTConfig, LoraSFTConfig, CircuitLoraSFTConfig):
    """Every method's settings in one (for a script that trains several methods with one config);
    :func:`train` keeps only the fields of the method it runs (:func:`method_config`)."""


METHOD_CONFIGS: dict[str, type[SFTConfig]] = {"precise": PreciseSFTConfig, "full": FullSFTConfig, "lora": LoraSFTConfig,
                                              "circuit_lora": CircuitLoraSFTConfig}


def method_config(config: SFTConfig, method: Method) -> SFTConfig:
    """``config`` as ``method``'s own config: the shared fields and that method's, nothing of the others."""
    check_option("method", method, Method)
    kind = METHOD_CONFIGS[method]
    if type(config) is kind:
        return config
    if isinstance(config, tuple(c for m, c in METHOD_CONFIGS.items() if m != method)) and not isinstance(config, kind):
        raise InputError(f"A {type(config).__name__} configures another method than {method!r}: pass a "
                         f"{kind.__name__} (or a TrainConfig).")
    names = {f.name for f in fields(kind)}
    return kind(**{f.name: getattr(config, f.name) for f in fields(config) if f.name in names})


def method_of(config: SFTConfig, method: str | None) -> str:
    """The method a call trains: ``method``, else the one ``config``'s type names, else ``"precise"``."""
    if method is not None:
        return check_option("method", method, Method)
    for name, kind in METHOD_CONFIGS.items():
        if type(config) is kind:
            return name
    return "precise"
