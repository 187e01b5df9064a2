"""Streaming driver for the weight-space merges in :data:`merging.METHODS`.

``merge("ties", base, [expert_a, expert_b], TiesConfig(density=0.2))`` checks the
sources (:func:`merging.state_dicts.check_compatible`), then walks the base's
keys in order with a tqdm bar: for each parameter it reads the base tensor and
one tensor per expert, calls the method, and keeps only the merged tensor.
Buffers (attention masks, rotary tables) are copied from the base, so the
result loads into a ``HookedTransformer`` of the same config with
``model.load_state_dict``. Sources can be state dicts, models or lazily opened
``.safetensors`` files.

Random methods (DARE) get a ``torch.Generator`` seeded from ``(config.seed, key)``
per tensor, so the result does not depend on the order of keys or on which
other tensors are merged.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from merging.methods import CONFIGS, METHODS, ties_thresholds
from merging.state_dicts import SourceLike, as_sources, check_compatible, is_buffer


def tensor_generator(seed: int, key: str) -> torch.Generator:
    """A CPU generator seeded from ``seed`` and the tensor name (order-independent randomness)."""
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + zlib.crc32(key.encode())) % (2**63))


def merge(
    method: str,
    base: SourceLike,
    experts: Sequence[SourceLike],
    config=None,
    *,
    weights: Sequence[float] | None = None,
    device: str | torch.device = "cpu",
    progress: bool = True,
    check: bool = True,
) -> dict[str, Tensor]:
    """Merge ``experts`` into ``base`` with ``METHODS[method]``; return the merged state dict (on ``device``).

    ``config`` defaults to ``CONFIGS[method]()``; ``weights`` (one per expert,
    default 1) are the mergekit-style per-model weights ``w_i``.
    """
    if method not in METHODS:
        raise ValueError(f"Unknown merge method {method!r}; choose one of {sorted(METHODS)}.")
    config = CONFIGS[method]() if config is None else config
    if not isinstance(config, CONFIGS[method]):
        raise TypeError(f"{method} expects a {CONFIGS[method].__name__}, got {type(config).__name__}.")
    fn = METHODS[method]
    b, es = as_sources(base, experts)
    if weights is not None and len(weights) != len(es):
        raise ValueError(f"{len(weights)} weights for {len(es)} experts: give one weight per expert.")
    keys = check_compatible(b, es, progress=progress) if check else b.param_keys()
    thresholds = None
    if getattr(config, "scope", "tensor") == "model":
        thresholds = ties_thresholds(b, es, keys, config.density)
    seed = getattr(config, "seed", 0)
    merged: dict[str, Tensor] = {}
    for key in tqdm(b.keys(), desc=f"merging ({method})", disable=not progress):
        base_t = b.get(key).to(device)
        if is_buffer(key):
            merged[key] = base_t
            continue
        merged[key] = fn(
            base_t,
            [e.get(key).to(device) for e in es],
            config,
            weights=weights,
            generator=tensor_generator(seed, key),
            thresholds=thresholds,
        )
    return merged
