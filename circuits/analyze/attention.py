"""Attention reads: what the END token looks at, grouped by token role (Zhang et al. 2024, §4.2, Fig. 5, 7).

The answer is predicted at END, the last prompt token, so a head can only move
information into the answer through the row of its attention pattern whose
query is END. For each chosen head and each prompt we take that row,
``pattern[prompt, head, END, :]`` (TransformerLens' ``hook_pattern``, after the
softmax), and sum it over the key positions of each *role* recorded by
:mod:`circuits.tasks`:

* ``a``: the first operand's tokens, ``b``: the second operand's tokens (of the
  queried problem, after any few-shot prefix);
* ``op``: the operator's tokens ("+", "plus", "added to", ...);
* ``bos``: position 0 (many heads park unused attention on BOS, a "sink");
* ``shots``: the few-shot prefix (the solved examples before the queried problem);
* ``end``: END itself;
* ``query``: the rest of the queried problem ("=", spaces, words of the template).

The seven scores of a prompt sum to one. ``reads.role("other")`` is
``shots + query + end``, everything that is neither an operand, the operator
nor BOS. Averaged over prompts they describe the head; their per-prompt
distribution is the paper's Figure 5.

**Classification rule** (:func:`classify_heads`). ``operand = a + b`` and
``operator = op`` (mean attention over prompts). A head is

* an *operand head* if ``operand >= operand_threshold`` and ``operand > operator``;
* an *operator head* if ``operator >= operator_threshold`` and ``operator >= operand``;
* ``other`` otherwise.

The default thresholds (0.3 for operands, 0.2 for the operator) are several
times what uniform attention would give those roles in a few-shot prompt
(~25 tokens: two operand tokens get ~0.08, one operator token ~0.04), and high
enough that the role is a large share of the head's budget next to the BOS sink.
The operator threshold is lower because an operator is usually one token
against two operand tokens. Both are parameters; the scores are returned with
the labels so a reader can check every decision.

Under grouped- or multi-query attention (gemma-3: one KV head for four query
heads) ``hook_pattern`` is still per *query* head, so heads sharing keys still
get separate patterns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from datasets import Dataset
from jaxtyping import Float
from plotly.subplots import make_subplots
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer
from transformer_lens import utils as tl_utils

from circuits.errors import InputError
from circuits.nodes import Head, all_heads, validate_nodes
from circuits.tasks import iter_batches

ROLES = ("a", "b", "op", "bos", "shots", "query", "end")
ROLE_LABELS = {"a": "operand A", "b": "operand B", "op": "operator", "bos": "BOS", "shots": "few-shot lines",
               "query": "rest of the query", "end": "END", "other": "other"}
OTHER_ROLES = ("shots", "query", "end")
CLASS_COLORS = {"operand": "#d62728", "operator": "#2ca02c", "other": "#7f7f7f"}


@dataclass(frozen=True)
class HeadClassConfig:
    """Thresholds of the operand/operator rule (see the module docstring)."""

    operand_threshold: float = 0.3
    operator_threshold: float = 0.2


@dataclass
class AttentionReads:
    """END-query attention per prompt, head and role. ``scores[p, i, r]`` is head ``heads[i]``'s mass on role ``ROLES[r]``."""

    heads: list[Head]
    scores: Float[Tensor, "prompt head role"]
    roles: tuple[str, ...] = ROLES
    indices: list[int] = field(default_factory=list)

    def mean(self) -> Float[Tensor, "head role"]:
        """Mean over prompts."""
        return self.scores.mean(0)

    def role(self, role: str) -> Float[Tensor, "prompt head"]:
        """Per-prompt scores of one role (``"operand"`` gives ``a + b``, ``"other"`` ``shots + query + end``)."""
        if role == "operand":
            return self.role("a") + self.role("b")
        if role == "other" and "other" not in self.roles:
            return sum(self.role(r) for r in OTHER_ROLES)
        if role not in self.roles:
            raise KeyError(f"Unknown role {role!r}; roles are {self.roles}, 'operand' and 'other'.")
        return self.scores[:, :, self.roles.index(role)]

    def grid(self, role: str, n_layers: int, n_heads: int) -> Float[Tensor, "layer head"]:
        """Mean score of ``role`` as a ``[n_layers, n_heads]`` map (NaN for heads not read)."""
        out = torch.full((n_layers, n_heads), float("nan"))
        means = self.role(role).mean(0)
        for head, value in zip(self.heads, means.tolist()):
            out[head.layer, head.head] = value
        return out

    def table(self) -> list[dict]:
        """One row per head: its mean attention to each role."""
        means = self.mean()
        return [
            {"head": str(h), **{ROLE_LABELS[r]: round(float(means[i, j]), 4) for j, r in enumerate(self.roles)}}
            for i, h in enumerate(self.heads)
        ]


@dataclass(frozen=True)
class HeadClass:
    """A head's label (``"operand"``, ``"operator"`` or ``"other"``) with the mean scores behind it."""

    head: Head
    label: str
    operand: float
    operator: float
    bos: float
    other: float


def _check_dataset(dataset: Dataset) -> None:
    missing = [c for c in ("tokens", "a_pos", "b_pos", "op_pos", "end_pos") if c not in dataset.column_names]
    if missing:
        raise InputError(f"The dataset lacks columns {missing}; build it with circuits.tasks.make_dataset().")
    if len(dataset) == 0:
        raise InputError("The dataset is empty: no prompts to read attention from.")


@torch.no_grad()
def attention_reads(
    model: HookedTransformer,
    dataset: Dataset,
    heads: Iterable[Head] | None = None,
    *,
    batch_size: int = 32,
    progress: bool = True,
) -> AttentionReads:
    """END-query attention of ``heads`` (default: all heads) on each role, for every prompt of ``dataset``.

    Only the END row of each needed layer's pattern is kept, and the forward stops
    after the last needed layer (no unembedding), so memory and time stay small.
    """
    _check_dataset(dataset)
    heads = validate_nodes(model, all_heads(model) if heads is None else list(heads))
    if not heads or not all(isinstance(h, Head) for h in heads):
        raise InputError("attention_reads needs a non-empty list of Head nodes.")
    layers = sorted({h.layer for h in heads})
    scores = torch.zeros(len(dataset), len(heads), len(ROLES))
    store: dict[int, Tensor] = {}

    def keep_end_row(pattern: Float[Tensor, "batch head query_pos key_pos"], *, hook) -> None:
        store[hook.layer()] = pattern[:, :, -1, :].float().cpu()

    hooks = [(tl_utils.get_act_name("pattern", layer), keep_end_row) for layer in layers]
    batches = list(iter_batches(dataset, batch_size, device=model.cfg.device))
    for batch in tqdm(batches, desc="attention reads", disable=not progress, leave=False):
        store.clear()
        with model.hooks(fwd_hooks=hooks):
            model(batch.tokens, stop_at_layer=layers[-1] + 1)
        masks = {k: v.float().cpu() for k, v in batch.role_masks.items()}
        for i, head in enumerate(heads):
            row = store[head.layer][:, head.head, :]  # [batch, key_pos]
            named = {role: (row * masks[role]).sum(-1) for role in ("a", "b", "op", "bos", "shots")}
            # END is never an operand or operator position in the templates, but stay exact if one is
            end_only = masks["end"] * (1 - masks["a"] - masks["b"] - masks["op"]).clamp(min=0)
            named["end"] = (row * end_only).sum(-1)
            named["query"] = row.sum(-1) - sum(named.values())
            scores[batch.indices, i, :] = torch.stack([named[r] for r in ROLES], -1)
    return AttentionReads(heads=heads, scores=scores, indices=list(range(len(dataset))))


def classify_heads(reads: AttentionReads, config: HeadClassConfig = HeadClassConfig()) -> list[HeadClass]:
    """Label each head operand / operator / other by the rule in the module docstring."""
    if not 0 < config.operand_threshold <= 1 or not 0 < config.operator_threshold <= 1:
        raise InputError(f"Thresholds must lie in (0, 1], got {config}.")
    operand, operator = reads.role("operand").mean(0), reads.role("op").mean(0)
    bos, other = reads.role("bos").mean(0), reads.role("other").mean(0)
    out = []
    for i, head in enumerate(reads.heads):
        o, p = float(operand[i]), float(operator[i])
        if o >= config.operand_threshold and o > p:
            label = "operand"
        elif p >= config.operator_threshold and p >= o:
            label = "operator"
        else:
            label = "other"
        out.append(HeadClass(head, label, o, p, float(bos[i]), float(other[i])))
    return out


def classes_table(classes: Sequence[HeadClass], only_labelled: bool = False) -> list[dict]:
    """Rows for a report table, operand and operator heads first, by their score."""
    rows = [c for c in classes if c.label != "other" or not only_labelled]
    rows.sort(key=lambda c: ({"operand": 0, "operator": 1, "other": 2}[c.label], -max(c.operand, c.operator)))
    return [
        {"head": str(c.head), "class": c.label, "operand (A+B)": round(c.operand, 3),
         "operator": round(c.operator, 3), "BOS": round(c.bos, 3), "other": round(c.other, 3)}
        for c in rows
    ]


# ---------------------------------------------------------------------------- figures


def plot_role_distribution(
    reads: AttentionReads | Mapping[str, AttentionReads],
    heads: Sequence[Head] | None = None,
    classes: Sequence[HeadClass] | None = None,
    title: str = "END-query attention by token role",
) -> go.Figure:
    """Box plots of per-prompt attention on each role for key heads (paper Fig. 5); one row per operation.

    ``reads`` is one :class:`AttentionReads` or a dict ``{operation: reads}``. Boxes are
    coloured by the head's class when ``classes`` is given (operand red, operator green).
    """
    by_op = {"": reads} if isinstance(reads, AttentionReads) else dict(reads)
    if not by_op:
        raise InputError("plot_role_distribution got no attention reads.")
    label_of = {c.head: c.label for c in classes or ()}
    fig = make_subplots(rows=len(by_op), cols=1, subplot_titles=[f"operation {k}" if k else "" for k in by_op],
                        shared_xaxes=True, vertical_spacing=0.08)
    for row, (op, r) in enumerate(by_op.items(), start=1):
        chosen = list(heads) if heads is not None else r.heads
        for head in chosen:
            if head not in r.heads:
                raise InputError(f"{head} was not read; pass it to attention_reads() first.")
            i = r.heads.index(head)
            label = label_of.get(head, "other")
            y = r.scores[:, i, :].numpy()
            fig.add_trace(go.Box(
                x=[ROLE_LABELS[x] for x in r.roles for _ in range(y.shape[0])],
                y=y.T.reshape(-1).tolist(), name=f"{head} ({label})" if classes else str(head),
                marker_color=CLASS_COLORS[label] if classes else None, boxpoints=False,
                legendgroup=str(head), showlegend=row == 1,
            ), row=row, col=1)
        fig.update_yaxes(title_text="attention from END", range=[0, 1], row=row, col=1)
    # Legend below the plot, in rows: on the right it cut off the eighth head.
    fig.update_layout(title=title, boxmode="group", height=320 * len(by_op) + 140,
                      legend=dict(orientation="h", yanchor="top", y=-0.15, x=0), margin=dict(b=120))
    return fig


def plot_role_heatmap(reads: AttentionReads, n_layers: int, n_heads: int, title: str | None = None) -> go.Figure:
    """Mean END attention on operands (A+B), operator and BOS for every head read, as layer x head maps."""
    roles = ("operand", "op", "bos")
    fig = make_subplots(rows=1, cols=3, subplot_titles=["operands (A+B)", "operator", "BOS"], horizontal_spacing=0.06)
    for col, role in enumerate(roles, start=1):
        grid = reads.grid(role, n_layers, n_heads).numpy()
        fig.add_trace(go.Heatmap(
            z=grid, x=[f"H{h}" for h in range(n_heads)], y=[f"L{l}" for l in range(n_layers)],
            zmin=0, zmax=1, colorscale="Blues", showscale=col == 3, colorbar=dict(title="mean<br>attention"),
            hovertemplate="%{y}%{x}: %{z:.3f}<extra></extra>",
        ), row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=title or "Mean attention from END, per head", height=max(300, 22 * n_layers + 120))
    return fig


# ---------------------------------------------------------------------------- per-prompt views


@dataclass
class AttentionView:
    """Full attention patterns of some heads on one prompt, ready for circuitsvis (paper Fig. 7)."""

    tokens: list[str]
    attention: Float[np.ndarray, "head query_pos key_pos"]
    head_names: list[str]
    title: str = ""
    prompt: str = ""  # the decoded prompt, line breaks kept (the report shows it under the view)

    def props(self) -> dict:
        """Keyword arguments of circuitsvis' ``attention_heads`` / ``attention_patterns``."""
        return {"attention": self.attention, "tokens": self.tokens, "attention_head_names": self.head_names}

    def to_circuitsvis(self, kind: str = "heads"):
        """A circuitsvis ``RenderedHTML`` (displays inline in Jupyter; offline it uses the local bundle)."""
        import circuitsvis as cv

        if kind == "heads":
            return cv.attention.attention_heads(**self.props())
        if kind == "patterns":
            return cv.attention.attention_patterns(tokens=self.tokens, attention=self.attention)
        raise InputError(f"kind must be 'heads' or 'patterns', got {kind!r}.")

    def _repr_html_(self) -> str:
        return self.to_circuitsvis()._repr_html_()


def token_strings(model: HookedTransformer, tokens: Sequence[int]) -> list[str]:
    """Readable token strings (spaces shown as in the tokenizer's vocabulary, newlines as '\\n')."""
    return [t.replace("\n", "\\n") for t in model.tokenizer.convert_ids_to_tokens(list(tokens))]


@torch.no_grad()
def attention_views(
    model: HookedTransformer,
    prompts: Sequence[str] | Dataset,
    heads: Sequence[Head],
    *,
    max_prompts: int = 4,
    last_tokens: int | None = None,
) -> list[AttentionView]:
    """Attention patterns of ``heads`` on a few prompts (strings, or dataset rows), one view per prompt.

    ``last_tokens`` crops each view to the final positions (the queried problem after a
    few-shot prefix), which keeps the circuitsvis grid readable.
    """
    heads = validate_nodes(model, list(heads))
    if not heads:
        raise InputError("attention_views needs at least one head.")
    token_lists = (
        [list(t) for t in prompts["tokens"]] if isinstance(prompts, Dataset)
        else [model.to_tokens(p)[0].tolist() for p in prompts]
    )[:max_prompts]
    layers = sorted({h.layer for h in heads})
    names = [tl_utils.get_act_name("pattern", l) for l in layers]
    views = []
    for toks in token_lists:
        tokens = torch.tensor([toks], device=model.cfg.device)
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names, stop_at_layer=layers[-1] + 1)
        att = torch.stack([cache[tl_utils.get_act_name("pattern", h.layer)][0, h.head] for h in heads]).float().cpu()
        strs = token_strings(model, toks)
        if last_tokens is not None and last_tokens < len(strs):
            att, strs = att[:, -last_tokens:, -last_tokens:], strs[-last_tokens:]
        text = model.tokenizer.decode(toks, skip_special_tokens=True)
        views.append(AttentionView(strs, att.numpy(), [str(h) for h in heads], title=text, prompt=text))
    return views
