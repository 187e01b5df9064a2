"""Apply a weight-space merge of :data:`merging.methods.REGISTRY` to whole models, streaming tensor by tensor.

``merge("ties", base, [expert_a, expert_b], TiesConfig(density=0.2))`` checks the
sources (:func:`merging.state_dicts.check_compatible`), then walks the base's
keys in order with a tqdm bar: for each parameter it reads the base tensor and
one tensor per expert, calls the method, checks the result is finite, and keeps
only the merged tensor. A tensor no expert changed (frozen embeddings) is the
base's, without calling the method (but for passthrough, whose ``scale`` changes it). Buffers (attention masks, rotary tables) are copied
from the base, so the result loads into a ``HookedTransformer`` of the same
config with ``model.load_state_dict``. Sources can be state dicts, models,
lazily opened ``.safetensors`` files or saved-model folders.

``lines=LinesConfig(alpha, beta)`` applies LiNeS layer scaling
(:mod:`merging.lines`) to the result of any method.

Random methods (DARE, DELLA) get a ``torch.Generator`` seeded from
``(config.seed, key)`` per tensor, so the result does not depend on the order
of keys or on which other tensors are merged.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from circuits.seeds import derived_seed
from circuits.errors import InputError
from merging.lines import LinesConfig, apply_lines, layer_scale, n_layers_of
from merging.methods import REGISTRY
from merging.methods.generalized import ties_thresholds
from merging.methods.config_checks import check_weights
from merging.state_dicts import NonFiniteMergeError, SourceLike, as_sources, check_compatible, is_buffer


def tensor_generator(seed: int, key: str) -> torch.Generator:
    """A CPU generator seeded from ``seed`` and the tensor name (order-independent randomness)."""
    return torch.Generator().manual_seed(derived_seed(int(seed), "merge tensor", zlib.crc32(key.encode())) % (2**63))


def merge(
    method: str,
    base: SourceLike,
    experts: Sequence[SourceLike],
    config=None,
    *,
    weights: Sequence[float] | None = None,
    lines: LinesConfig | None = None,
    device: str | torch.device = "cpu",
    progress: bool = True,
    check: bool = True,
    config_for: Callable[[str], tuple[object, Sequence[float] | None]] | None = None,
) -> dict[str, Tensor]:
    """Merge ``experts`` into ``base`` with ``REGISTRY[method]``; return the merged state dict (on ``device``).

    ``config`` defaults to the method's config class with its defaults;
    ``weights`` (one per expert, default 1) are the mergekit-style per-model
    weights ``w_i``; ``lines`` adds LiNeS layer scaling. ``config_for(key)``: a tensor's own
    ``(config, weights)`` where they vary by tensor (a mergekit YAML's gradients and filters), else None.
    """
    if method not in REGISTRY:
        raise InputError(f"Unknown merge method {method!r}; choose one of {sorted(REGISTRY)}.")
    record = REGISTRY[method]
    if record.needs_data:
        raise InputError(f"{method} needs task data and runs the model: call merging.merge_submodules instead.")
    config = record.config() if config is None else config
    if not isinstance(config, record.config):
        raise InputError(f"{method} expects a {record.config.__name__}, got {type(config).__name__}.")
    b, es = as_sources(base, experts)
    if weights is not None:
        weights = check_weights(weights, len(es))
    keys = check_compatible(b, es, progress=progress) if check else b.param_keys()
    thresholds = ties_thresholds(b, es, keys, config.density) if getattr(config, "scope", "tensor") == "model" else None
    n_layers = n_layers_of(keys)
    seed = getattr(config, "seed", 0)
    merged: dict[str, Tensor] = {}
    for key in tqdm(b.keys(), desc=f"merging ({method})", disable=not progress):
        base_t = b.get(key).to(device)
        if is_buffer(key):
            merged[key] = base_t
            continue
        expert_ts = [e.get(key).to(device) for e in es]
        if record.unchanged_is_base and all(torch.equal(t, base_t) for t in expert_ts):
            # no expert changed it (e.g. frozen embeddings): every method returns θ0; skip the work and memory
            merged[key] = base_t.clone()
            continue
        own = None if config_for is None else config_for(key)
        tensor_config, tensor_weights = (config, weights) if own is None else own
        out = record.function(
            base_t,
            expert_ts,
            tensor_config,
            weights=tensor_weights,
            generator=tensor_generator(seed, key),
            thresholds=thresholds,
            key=key,
        )
        if lines is not None:
            out = apply_lines(base_t, out, layer_scale(key, n_layers, lines))
        if not bool(torch.isfinite(out).all()):
            n_bad = int((~torch.isfinite(out)).sum())
            raise NonFiniteMergeError(
                f"{method} produced {n_bad} NaN/Inf values in {key} (dtype {out.dtype}): the scale or weights "
                "overflow this dtype; use smaller lam/weights or merge in float32."
            )
        merged[key] = out
    return merged
