"""Number activations: what a model writes at a number's token, or at END of an arithmetic prompt.

The representation analyses of :mod:`circuits.analyze.number_geometry` (Fourier spectrum,
helix fit, mod-T probes) all start from a matrix ``h[n, d_model]``: one row per number
n, read at one layer, one component and one position. This module collects those rows.

* :func:`number_activations`: each number n alone in a short context ("{n}" by
  default), read at the number's **last token**. Models that split digits (gemma,
  Llama) give the units digit's position; the tens and hundreds digits sit at earlier
  positions and reach the last one only through attention.
* :func:`arithmetic_activations`: prompts "a + b = " (a fixed few-shot prefix first),
  read at END (the token before the answer), or at an operand's last token. The rows
  are per prompt; index them by a, b or a + b (:func:`group_mean` averages prompts that
  share a value).
* :func:`number_token_vectors`: the embedding rows / unembedding columns of the tokens
  that spell a whole number ("0", "1", ...). A digit-splitting tokenizer has only 0..9.

Components are TransformerLens hook points (a registry, checked against
``model.hook_dict``): ``resid_pre``, ``resid_mid``, ``resid_post``, ``attn_out``,
``mlp_out``. One forward pass fills every requested (layer, component) at once; it
stops after the last requested layer, so the 262k-column unembedding never runs.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Literal, Sequence

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer
from transformer_lens.utilities import get_act_name

from circuits.analyze.number_catalogue import COMPONENTS  # component name -> TransformerLens activation name
from circuits.errors import InputError
from circuits.tasks import make_row
from circuits.templates import template_by_id

Key = tuple[int, str]  # (layer, component)


def hook_name(model: HookedTransformer, layer: int, component: str) -> str:
    """The hook point of ``component`` at ``layer``, checked against the model's hooks."""
    if component not in COMPONENTS:
        raise InputError(f"Unknown component {component!r}: use one of {sorted(COMPONENTS)}.")
    if not 0 <= layer < model.cfg.n_layers:
        raise InputError(f"Layer {layer} is outside 0..{model.cfg.n_layers - 1} for this model.")
    name = get_act_name(COMPONENTS[component], layer)
    if name not in model.hook_dict:
        raise InputError(f"This model has no hook {name!r} (component {component!r}); pick another component.")
    return name


def _offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    encoded = tokenizer(text, return_offsets_mapping=True)
    return list(encoded["input_ids"]), [tuple(o) for o in encoded["offset_mapping"]]


def _last_token_in_span(offsets: Sequence[tuple[int, int]], start: int, end: int) -> int:
    inside = [i for i, (s, e) in enumerate(offsets) if e > s and s < end and e > start]
    if not inside:
        raise InputError(f"No token covers characters {start}..{end}; is the tokenizer's offset mapping empty?")
    return inside[-1]


def length_chunks(token_lists: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    """Prompt indices in batches of equal token length (no padding), at most ``batch_size`` each."""
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, tokens in enumerate(token_lists):
        by_length[len(tokens)].append(i)
    return [idx[s:s + batch_size] for idx in by_length.values() for s in range(0, len(idx), batch_size)]


@torch.no_grad()
def collect(
    model: HookedTransformer,
    token_lists: Sequence[Sequence[int]],
    positions: Sequence[int],
    keys: Iterable[Key],
    *,
    batch_size: int = 64,
    desc: str = "activations",
) -> dict[Key, Float[Tensor, "n d_model"]]:
    """Activations at ``positions[i]`` of prompt ``i`` for each (layer, component), rows in prompt order.

    Prompts are grouped by token length so no padding enters the computation.
    """
    keys = list(dict.fromkeys(keys))
    if not keys:
        raise InputError("Ask for at least one (layer, component).")
    if len(token_lists) != len(positions):
        raise InputError(f"Got {len(token_lists)} prompts but {len(positions)} positions.")
    names = {key: hook_name(model, *key) for key in keys}
    stop = max(layer for layer, _ in keys) + 1
    out = {key: torch.empty(len(token_lists), model.cfg.d_model) for key in keys}
    chunks = length_chunks(token_lists, batch_size)
    for chunk in tqdm(chunks, desc=desc, leave=False, disable=len(chunks) < 4):
        tokens = torch.tensor([token_lists[i] for i in chunk], device=model.cfg.device)
        pos = torch.tensor([positions[i] for i in chunk], device=model.cfg.device)
        rows = torch.arange(len(chunk), device=model.cfg.device)
        stored: dict[str, Tensor] = {}

        def store(tensor, *, hook):
            stored[hook.name] = tensor[rows, pos].detach().float().cpu()

        model.run_with_hooks(tokens, fwd_hooks=[(name, store) for name in set(names.values())],
                             stop_at_layer=min(stop, model.cfg.n_layers))
        for key, name in names.items():
            out[key][chunk] = stored[name]
    return out


def number_prompts(model: HookedTransformer, numbers: Sequence[int], template: str = "{n}") -> tuple[list[list[int]], list[int]]:
    """Token ids of ``template`` filled with each n, and the position of n's last token."""
    if "{n}" not in template:
        raise InputError(f"The template must contain '{{n}}' where the number goes, got {template!r}.")
    token_lists, positions = [], []
    for n in numbers:
        text = template.replace("{n}", str(n))
        ids, offsets = _offsets(model.tokenizer, text)
        start = template.index("{n}")
        token_lists.append(ids)
        positions.append(_last_token_in_span(offsets, start, start + len(str(n))))
    return token_lists, positions


def number_activations(
    model: HookedTransformer,
    numbers: Sequence[int],
    keys: Iterable[Key],
    *,
    template: str = "{n}",
    batch_size: int = 64,
) -> dict[Key, Float[Tensor, "n d_model"]]:
    """``h[n]`` at the last token of each number, for every (layer, component) in ``keys``."""
    token_lists, positions = number_prompts(model, numbers, template)
    return collect(model, token_lists, positions, keys, batch_size=batch_size, desc="number activations")


@dataclass(frozen=True)
class ArithmeticPrompts:
    """Prompts "a op b = " with a shared prefix; ``rows`` are :func:`circuits.tasks.make_row` rows."""

    a: list[int]
    b: list[int]
    rows: list[dict]

    @property
    def results(self) -> list[int]:
        return [int(Fraction(r["answer"])) for r in self.rows]

    def tokens(self) -> list[list[int]]:
        return [r["tokens"] for r in self.rows]

    def positions(self, where: Literal["end", "a", "b"]) -> list[int]:
        """Token positions: ``"end"``, or ``"a"`` / ``"b"`` (the operand's last token)."""
        if where == "end":
            return [r["end_pos"] for r in self.rows]
        if where in ("a", "b"):
            return [r[f"{where}_pos"][-1] for r in self.rows]
        raise InputError(f"Unknown position {where!r}: use 'end', 'a' or 'b'.")


def pairs_by_result(operand_max: int, per_result: int = 1, *, seed: int = 0) -> list[tuple[int, int]]:
    """Operand pairs (a, b) in 0..operand_max with every sum 0..2·operand_max present ``per_result`` times
    (fewer where fewer pairs exist: 0 = 0 + 0 only), so a spectrum over the sum has no gaps."""
    if operand_max < 1 or per_result < 1:
        raise InputError(f"Need operand_max >= 1 and per_result >= 1, got {operand_max}, {per_result}.")
    rng = random.Random(seed)
    pairs = []
    for s in range(2 * operand_max + 1):
        candidates = [(a, s - a) for a in range(max(0, s - operand_max), min(s, operand_max) + 1)]
        pairs += rng.sample(candidates, min(per_result, len(candidates)))
    return pairs


def arithmetic_prompts(
    model: HookedTransformer,
    pairs: Sequence[tuple[int, int]],
    *,
    template_id: str = "add-equation-0",
    prefix: str = "",
) -> ArithmeticPrompts:
    """One prompt per operand pair, each starting with ``prefix`` (e.g. two solved examples)."""
    if not pairs:
        raise InputError("Pass at least one operand pair.")
    template = template_by_id(template_id)
    rows = [make_row(model.tokenizer, template, Fraction(a), Fraction(b), prefix=prefix) for a, b in pairs]
    return ArithmeticPrompts([a for a, _ in pairs], [b for _, b in pairs], rows)


def arithmetic_activations(
    model: HookedTransformer,
    prompts: ArithmeticPrompts,
    keys: Iterable[Key],
    *,
    where: str = "end",
    batch_size: int = 64,
) -> dict[Key, Float[Tensor, "n d_model"]]:
    """Per-prompt activations at END (or an operand's last token) for every (layer, component)."""
    return collect(model, prompts.tokens(), prompts.positions(where), keys, batch_size=batch_size,
                   desc="arithmetic activations")


def group_mean(h: Float[Tensor, "n d"], values: Sequence[int]) -> tuple[list[int], Float[Tensor, "v d"]]:
    """The mean row for each distinct value (sorted), e.g. the END activation per sum a + b."""
    values_t = torch.as_tensor(list(values))
    if values_t.numel() != h.shape[0]:
        raise InputError(f"Got {h.shape[0]} rows but {values_t.numel()} values.")
    distinct = sorted(set(values_t.tolist()))
    return distinct, torch.stack([h[values_t == v].mean(0) for v in distinct])


def single_token_numbers(model: HookedTransformer, n_max: int) -> dict[int, int]:
    """n -> token id for every n in 0..n_max whose decimal spelling is one token (stops at the first that is not)."""
    ids: dict[int, int] = {}
    for n in range(n_max + 1):
        token = model.tokenizer.encode(str(n), add_special_tokens=False)
        if len(token) != 1:
            break
        ids[n] = token[0]
    return ids


def number_token_vectors(model: HookedTransformer, n_max: int, which: Literal["embed", "unembed"] = "embed") -> tuple[list[int], Float[Tensor, "n d_model"]]:
    """Embedding rows (``"embed"``) or unembedding columns (``"unembed"``) of the single-token numbers 0..k."""
    ids = single_token_numbers(model, n_max)
    if not ids:
        raise InputError("No number is a single token for this tokenizer; there is no token vector to analyse.")
    index = torch.tensor(list(ids.values()), device=model.cfg.device)
    matrices = {"embed": lambda: model.W_E[index], "unembed": lambda: model.W_U[:, index].T}
    if which not in matrices:
        raise InputError(f"Unknown token matrix {which!r}: use 'embed' or 'unembed'.")
    return list(ids), matrices[which]().detach().float().cpu()
