"""mergekit parameters that vary by tensor: gradients over the layers and filters on the module's name.

Most merged models' cards give slerp's ``t`` as ``- filter: self_attn`` / ``value: [0, 0.5, 0.3, 0.7, 1]``, a
second entry for ``mlp`` and an unfiltered fallback ``- value: 0.5`` (mergekit's ``examples/gradient-slerp.yml``).

mergekit 0.1.5 resolves a parameter for each tensor (``mergekit.config.evaluate_setting``):

* a **gradient** (a list of numbers) is interpolated piecewise linearly at ``t``: the list's points spread evenly
  over ``[0, 1]``, and a layer ``i`` of ``n`` takes ``t = i / (n − 1)`` (``t = 1`` for a single layer); the
  tensors outside the layers (embeddings, the final norm, the unembedding) take ``t = 0``. A list of booleans or
  strings takes the entry at ``int(t · (len − 1))``;
* a **filter** list (entries ``{filter, value}``) takes the first entry whose ``filter`` is a substring of the
  tensor's name (no filter, or ``*``, matches any); when none matches, the parameter falls back to the next place
  it is given (a model's own, then the global ``parameters:``), then to its default.

mergekit's names are the Hugging Face checkpoint's; a TransformerLens state dict has its own. Each TransformerLens
name is matched as the Llama / Gemma checkpoint spells it (:data:`HF_NAMES`, :func:`hf_name`): ``blocks.3.attn.W_Q``
as ``model.layers.3.self_attn.q_proj.weight``, so ``filter: self_attn`` and ``filter: mlp`` select what they select
on the checkpoint. A GPT-2 checkpoint's own names differ (``h.3.attn.c_attn``); its ``attn`` filter still matches
``self_attn``.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any, Optional

from circuits.errors import InputError

#: TransformerLens name (after ``blocks.{i}.``, or the whole name outside the blocks) -> the Hugging Face name of
#: the Llama / Gemma checkpoint the filters are matched against (``{i}``: the layer)
HF_NAMES = {
    "attn.W_Q": "model.layers.{i}.self_attn.q_proj.weight", "attn.b_Q": "model.layers.{i}.self_attn.q_proj.bias",
    "attn.W_K": "model.layers.{i}.self_attn.k_proj.weight", "attn.b_K": "model.layers.{i}.self_attn.k_proj.bias",
    "attn.W_V": "model.layers.{i}.self_attn.v_proj.weight", "attn.b_V": "model.layers.{i}.self_attn.v_proj.bias",
    "attn.W_O": "model.layers.{i}.self_attn.o_proj.weight", "attn.b_O": "model.layers.{i}.self_attn.o_proj.bias",
    "attn._W_K": "model.layers.{i}.self_attn.k_proj.weight", "attn._b_K": "model.layers.{i}.self_attn.k_proj.bias",
    "attn._W_V": "model.layers.{i}.self_attn.v_proj.weight", "attn._b_V": "model.layers.{i}.self_attn.v_proj.bias",
    "attn.q_norm.w": "model.layers.{i}.self_attn.q_norm.weight",
    "attn.k_norm.w": "model.layers.{i}.self_attn.k_norm.weight",
    "mlp.W_gate": "model.layers.{i}.mlp.gate_proj.weight", "mlp.W_in": "model.layers.{i}.mlp.up_proj.weight",
    "mlp.W_out": "model.layers.{i}.mlp.down_proj.weight", "mlp.b_in": "model.layers.{i}.mlp.up_proj.bias",
    "mlp.b_out": "model.layers.{i}.mlp.down_proj.bias",
    "ln1.w": "model.layers.{i}.input_layernorm.weight", "ln1.b": "model.layers.{i}.input_layernorm.bias",
    "ln1_post.w": "model.layers.{i}.post_attention_layernorm.weight",
    "ln2.w": "model.layers.{i}.pre_feedforward_layernorm.weight", "ln2.b": "model.layers.{i}.pre_feedforward_layernorm.bias",
    "ln2_post.w": "model.layers.{i}.post_feedforward_layernorm.weight",
    "embed.W_E": "model.embed_tokens.weight", "pos_embed.W_pos": "model.embed_positions.weight",
    "ln_final.w": "model.norm.weight", "ln_final.b": "model.norm.bias",
    "unembed.W_U": "lm_head.weight", "unembed.b_U": "lm_head.bias",
}

_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")


def hf_name(key: str) -> str:
    """The Hugging Face name a mergekit filter is matched against for the TransformerLens tensor ``key``
    (:data:`HF_NAMES`; a name the table lacks is matched as it is)."""
    block = _BLOCK.match(key)
    if block:
        template = HF_NAMES.get(block.group(2))
        return key if template is None else template.format(i=block.group(1))
    return HF_NAMES.get(key, key)


def layer_position(key: str, n_layers: int) -> float:
    """mergekit's ``t`` of the tensor ``key``: ``i / (n_layers − 1)`` in layer ``i`` (1 for a single layer), 0 outside
    the layers."""
    block = _BLOCK.match(key)
    if block is None:
        return 0.0
    return int(block.group(1)) / (n_layers - 1) if n_layers > 1 else 1.0


class IgnoredPatternWarning(UserWarning):
    """A filtered entry names its modules under ``pattern:``, a key mergekit 0.1.5 ignores (the entry then applies to
    every tensor, there and here)."""


@dataclass(frozen=True)
class TensorSetting:
    """A parameter that varies by tensor: a gradient (``points``), or filtered entries (``(filter, setting)``)."""

    points: Optional[tuple] = None
    entries: Optional[tuple] = None  # ((filter or None, TensorSetting or scalar), ...)

    def resolve(self, name: str, t: float) -> Any:
        """The value for the tensor named ``name`` (Hugging Face) at ``t``; None where no filter matches."""
        if self.points is not None:
            points = self.points
            if not all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in points):
                return points[int(t * (len(points) - 1))]
            scaled = t * (len(points) - 1)
            low = int(scaled)
            high = min(len(points) - 1, low + 1)
            return (1 - (scaled - low)) * points[low] + (scaled - low) * points[high]
        for where, value in self.entries:
            if where is None or where == "*" or where in name:
                return value.resolve(name, t) if isinstance(value, TensorSetting) else value
        return None


def read_setting(value, read_scalar, where: str):
    """A YAML parameter value: a scalar (``read_scalar(value, where)``), or a :class:`TensorSetting` for a gradient
    list or a filter list (or one ``{filter, value}`` mapping), each scalar in it read the same way."""
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        return read_scalar(value, where)
    if not value:
        raise InputError(f"{where}: an empty list; give a value, a gradient (a list of values) or filtered entries.")
    if all(not isinstance(v, (list, dict)) for v in value):
        return TensorSetting(points=tuple(read_scalar(v, f"{where}[{i}]") for i, v in enumerate(value)))
    entries = []
    for i, entry in enumerate(value):
        label = f"{where}[{i}]"
        if not isinstance(entry, dict) or "value" not in entry or set(entry) - {"filter", "value", "pattern"}:
            raise InputError(f"{label}: a filtered entry is {{filter: <module name part>, value: <value or "
                             f"gradient>}} (the filter may be left out), got {entry!r}.")
        if "pattern" in entry and "filter" not in entry:
            warnings.warn(f"{label}: mergekit 0.1.5 reads no 'pattern' key (its key is 'filter'), so this entry "
                          f"applies to every tensor, as mergekit applies it; write filter: {entry['pattern']!r} to "
                          "select modules.", IgnoredPatternWarning, stacklevel=2)
        where_filter = entry.get("filter")
        if where_filter is not None and not isinstance(where_filter, str):
            raise InputError(f"{label}: filter must be a string (a part of a module's name, e.g. self_attn or mlp), "
                             f"got {where_filter!r}.")
        inner = entry["value"]
        if isinstance(inner, dict) or (isinstance(inner, list) and any(isinstance(v, (list, dict)) for v in inner)):
            raise InputError(f"{label}: a filtered entry's value is a value or a gradient, not another filter.")
        entries.append((where_filter, read_setting(inner, read_scalar, f"{label}.value")))
    return TensorSetting(entries=tuple(entries))


def resolved(settings, name: str, t: float):
    """The first of ``settings`` (most specific first; scalars or :class:`TensorSetting`) that gives a value for
    the tensor ``name`` at ``t``, or None."""
    for setting in settings:
        value = setting.resolve(name, t) if isinstance(setting, TensorSetting) else setting
        if value is not None:
            return value
    return None
