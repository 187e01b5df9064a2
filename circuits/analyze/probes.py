"""MLP probes and the logit lens: where in depth do the operands and the answer appear? (Zhang et al. 2024, §4.2, Fig. 6)

For every layer we read the residual stream at END (the position that predicts
the answer) at three places and compare it with *unembedding directions*:

* ``mlp_in``: ``hook_resid_mid``, the residual the MLP reads (before its own
  input norm);
* ``mlp_out``: ``hook_mlp_out``, what the MLP adds to the residual (after its
  output norm on gemma-3, which has norms before and after each block);
* ``out_minus_in``: ``mlp_out - mlp_in``, the paper's "output minus input".
  (If the paper's "output" is read as the residual after the MLP,
  ``resid_post - resid_mid`` equals ``mlp_out``: both readings are plotted.)

The cosine similarity of each with the unembedding vector of token A (first
operand), B (second operand) and C (the answer) is averaged over prompts (Fig.
6a/b); ``others`` is the mean over the remaining single-digit number tokens,
the paper's "other candidate numbers". **Tokens used:** A and B are the first
token of each operand in the queried problem (``tokens[a_pos[0]]``: a digit on
tokenizers that split numbers into digits, like gemma and Llama); C is the
first answer token (``answer_token_ids[0]``), the one the metrics score.

**Unembedding directions** (``ProbeConfig.direction``). ``"raw"`` (default, as the
paper) uses the column ``W_U[:, t]``. ``"centered"`` subtracts the mean column of
the single-digit number tokens first: on gemma-3 every number direction shares a
large common component, so raw cosines with A, B, C and the other numbers move
together, and centring leaves only *which* number the stream points to
(then ``others`` is close to ``-C/9`` by construction). ``"effective"`` folds the final
norm's weight in (the logit of t is ``norm(x) @ W_U[:, t]`` and RMSNorm scales
dimension ``i`` by ``w_i``, so ``w * W_U[:, t]`` is the residual direction that
raises t; for LayerNorm it is also centred). On gemma-3 the final norm weights
span ~1 to ~300, so a few outlier dimensions dominate that direction and the
cosines shrink to ~0.01: it is offered for comparison, not as a default.
We always read ``model.W_U``, the matrix that makes the logits, so tied
(W_U = W_Eᵀ, gemma in HF) and untied models are handled alike; the unembedding
bias only shifts logits and is ignored by the cosine.

**Logit lens.** The residual after each block at END goes through the final
norm and the unembedding (:func:`circuits.end_logits.unembed_end`); we record the
answer token's rank and probability per layer. :meth:`ProbeResults.first_top1_layer`
is the first layer from which the answer is top-1 for at least half the
prompts in every later layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import plotly.graph_objects as go
import torch
from datasets import Dataset
from jaxtyping import Float, Int
from plotly.subplots import make_subplots
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer
from transformer_lens import utils as tl_utils

from circuits.prefix_cache import run_after_shared_prefix
from circuits.arguments import check_positive_int
from circuits.errors import InputError
from circuits.arguments import check_option
from circuits.end_logits import unembed_end
from circuits.tasks import iter_batches

Stream = Literal["mlp_in", "mlp_out", "out_minus_in"]
STREAMS: tuple[str, ...] = get_args(Stream)
TARGETS = ("A", "B", "C", "others")


@dataclass(frozen=True)
class ProbeConfig:
    """``direction``: ``"raw"`` (W_U columns), ``"centered"`` (minus the mean number column) or ``"effective"``."""

    direction: str = "raw"
    batch_size: int = 16
    logit_lens: bool = True

    def __post_init__(self) -> None:
        check_positive_int(self.batch_size, "ProbeConfig.batch_size")


@dataclass
class ProbeResults:
    """Per-prompt probe values at END.

    ``cos[stream]``: cosine with each target, ``[prompt, layer, target]`` (targets ``TARGETS``).
    ``rank``/``prob``: the answer token's logit-lens rank (0 = top-1) and probability after each block.
    """

    cos: dict[str, Float[Tensor, "prompt layer target"]]
    rank: Int[Tensor, "prompt layer"] | None = None
    prob: Float[Tensor, "prompt layer"] | None = None
    config: ProbeConfig = field(default_factory=ProbeConfig)

    @property
    def n_layers(self) -> int:
        return next(iter(self.cos.values())).shape[1]

    def mean_cos(self, stream: str) -> Float[Tensor, "layer target"]:
        """Mean over prompts of one stream's cosines."""
        if stream not in self.cos:
            raise KeyError(f"Unknown stream {stream!r}; streams are {tuple(self.cos)}.")
        return self.cos[stream].mean(0)

    def top1_rate(self) -> Float[Tensor, "layer"]:
        """Fraction of prompts whose answer is the logit-lens top-1 after each block."""
        self._need_lens()
        return (self.rank == 0).float().mean(0)

    def first_top1_layer(self, min_fraction: float = 0.5, stable: bool = True) -> int | None:
        """First layer where the answer is top-1 for at least ``min_fraction`` of prompts (None if never).

        With ``stable`` (default) the rate must stay at or above ``min_fraction`` in every later
        layer too: early layers can "hit" by predicting a frequent first digit (e.g. "1" for
        sums >= 10), which is not the answer being formed.
        """
        ok = (self.top1_rate() >= min_fraction).tolist()
        for layer in range(len(ok)):
            if ok[layer] and (not stable or all(ok[layer:])):
                return layer
        return None

    def rise_range(self, stream: str = "mlp_out", target: str = "C", fraction: float = 0.1,
                   versus: str | None = "others") -> tuple[int, int]:
        """``(start, peak)``: the layers over which ``stream``'s mean cosine with ``target`` climbs to its maximum.

        With ``versus="others"`` (default) the curve is ``target - others``: on real models all
        number directions share a common component, so the raw cosine with C rises wherever any
        number is written; the contrast keeps what is specific to C. ``versus=None`` uses the raw curve.
        ``peak`` is the layer of the maximum; ``start`` is the last layer before it whose value is
        still within ``fraction`` of the rise above the minimum before the peak (where the climb begins).
        """
        mean = self.mean_cos(stream)
        curve = mean[:, TARGETS.index(target)]
        if versus is not None:
            curve = curve - mean[:, TARGETS.index(versus)]
        peak = int(curve.argmax())
        low = float(curve[: peak + 1].min())
        level = low + fraction * (float(curve[peak]) - low)
        start = int((curve[: peak + 1] <= level).nonzero()[-1])
        return start, peak

    def _need_lens(self) -> None:
        if self.rank is None:
            raise InputError("No logit lens in these results: run probe_mlps(..., ProbeConfig(logit_lens=True)).")

    def lens_table(self) -> list[dict]:
        """Per layer: top-1 rate, median rank and mean probability of the answer."""
        self._need_lens()
        return [
            {"layer": l, "answer top-1 rate": round(float((self.rank[:, l] == 0).float().mean()), 3),
             "median rank": int(self.rank[:, l].median()), "mean prob": round(float(self.prob[:, l].mean()), 4)}
            for l in range(self.rank.shape[1])
        ]


def number_token_ids(tokenizer, max_value: int = 9) -> dict[int, int]:
    """``{value: token id}`` for the integers 0..max_value that are a single token on their own."""
    out = {}
    for value in range(max_value + 1):
        ids = tokenizer.encode(str(value), add_special_tokens=False)
        if len(ids) == 1:
            out[value] = ids[0]
    return out


def unembedding_directions(model: HookedTransformer, token_ids: Tensor, direction: str = "raw") -> Float[Tensor, "d_model n"]:
    """Residual-space directions of each token's unembedding (see the module docstring)."""
    W = model.W_U[:, token_ids].float()
    if direction == "raw":
        return W
    if direction == "centered":
        numbers = torch.tensor(list(number_token_ids(model.tokenizer, 9).values()), device=W.device)
        if len(numbers) == 0:
            raise InputError("direction='centered' needs single-token digits in the vocabulary; use 'raw'.")
        return W - model.W_U[:, numbers].float().mean(1, keepdim=True)
    if direction != "effective":
        raise InputError(f"direction must be 'raw', 'centered' or 'effective', got {direction!r}.")
    norm = model.cfg.normalization_type
    if norm is None:
        return W
    w = getattr(model.ln_final, "w", None)
    if w is not None:  # LN*Pre / RMSPre (processed weights) have no weight: the direction is W_U itself
        W = W * w.float()[:, None]
    if norm.startswith("LN"):
        W = W - W.mean(0, keepdim=True)
    return W


def _end_streams(model: HookedTransformer, tokens: Tensor) -> dict[str, Float[Tensor, "batch layer d_model"]]:
    """``resid_mid``, ``mlp_out`` and ``resid_post`` at END for every layer, from one forward pass."""
    names = {"resid_mid": [], "mlp_out": [], "resid_post": []}
    store: dict[str, Tensor] = {}

    def keep_end(act: Float[Tensor, "batch pos d_model"], *, hook) -> None:
        store[hook.name] = act[:, -1, :].float()

    hooks = [(tl_utils.get_act_name(kind, l), keep_end) for kind in names for l in range(model.cfg.n_layers)]
    missing = [n for n, _ in hooks if n not in model.hook_dict]
    if missing:
        raise InputError(f"The model lacks hook points {missing[:3]}...; probes need a model with MLPs (not attn-only).")
    run_after_shared_prefix(model, tokens, hooks)  # few-shot lines once; stops before the 262k-vocab unembedding
    return {kind: torch.stack([store[tl_utils.get_act_name(kind, l)] for l in range(model.cfg.n_layers)], 1)
            for kind in names}


def _cosine(x: Float[Tensor, "batch layer d_model"], d: Float[Tensor, "batch d_model"]) -> Float[Tensor, "batch layer"]:
    return torch.nn.functional.cosine_similarity(x, d[:, None, :], dim=-1)


@torch.no_grad()
def probe_mlps(
    model: HookedTransformer, dataset: Dataset, config: ProbeConfig = ProbeConfig(), progress: bool = True
) -> ProbeResults:
    """Cosines of MLP input/output with the A, B, C unembedding directions per layer, plus the logit lens."""
    if len(dataset) == 0:
        raise InputError("The dataset is empty: nothing to probe.")
    if model.cfg.attn_only:
        raise InputError("The model is attention-only: it has no MLPs to probe.")
    numbers = torch.tensor(list(number_token_ids(model.tokenizer, 9).values()), device=model.cfg.device)
    n, L = len(dataset), model.cfg.n_layers
    cos = {s: torch.zeros(n, L, len(TARGETS)) for s in STREAMS}
    rank = torch.zeros(n, L, dtype=torch.long) if config.logit_lens else None
    prob = torch.zeros(n, L) if config.logit_lens else None
    rows = dataset.select_columns(["tokens", "a_pos", "b_pos", "answer_token_ids"]).to_list()
    batches = list(iter_batches(dataset, config.batch_size, device=model.cfg.device))
    for batch in tqdm(batches, desc="MLP probes", disable=not progress, leave=False):
        acts = _end_streams(model, batch.tokens)
        streams = {"mlp_in": acts["resid_mid"], "mlp_out": acts["mlp_out"],
                   "out_minus_in": acts["mlp_out"] - acts["resid_mid"]}
        picked = [rows[i] for i in batch.indices]
        ids = {
            "A": torch.tensor([r["tokens"][r["a_pos"][0]] for r in picked], device=model.cfg.device),
            "B": torch.tensor([r["tokens"][r["b_pos"][0]] for r in picked], device=model.cfg.device),
            "C": batch.answer_ids,
        }
        dirs = {k: unembedding_directions(model, v, config.direction).T for k, v in ids.items()}
        num_dirs = unembedding_directions(model, numbers, config.direction).T  # [n_numbers, d_model]
        for s, x in streams.items():
            for t, target in enumerate(TARGETS[:3]):
                cos[s][batch.indices, :, t] = _cosine(x, dirs[target]).cpu()
            # "others": the digits that are not the answer, averaged
            all_num = torch.nn.functional.cosine_similarity(x[:, :, None, :], num_dirs[None, None], dim=-1)
            not_answer = (numbers[None, :] != batch.answer_ids[:, None]).float()[:, None, :]
            cos[s][batch.indices, :, 3] = ((all_num * not_answer).sum(-1) / not_answer.sum(-1).clamp(min=1)).cpu()
        if config.logit_lens:  # all layers in one unembedding call: [batch * layer, d_model]
            b = len(batch)
            logits = unembed_end(model, acts["resid_post"].reshape(b * L, -1).to(model.cfg.dtype)).float()
            answer = batch.answer_ids.repeat_interleave(L)[:, None]
            target = logits.gather(-1, answer)
            rank[batch.indices] = (logits > target).sum(-1).view(b, L).cpu()
            prob[batch.indices] = (target[:, 0] - logits.logsumexp(-1)).exp().view(b, L).cpu()
            del logits
    return ProbeResults(cos=cos, rank=rank, prob=prob, config=config)


@torch.no_grad()
def top_number_tokens(
    model: HookedTransformer, prompt: str, stream: Stream = "mlp_out", k: int = 5, max_value: int = 9,
    direction: str = "raw",
) -> list[list[tuple[str, float]]]:
    """For one prompt, per layer, the ``k`` number tokens most similar to ``stream`` at END (paper Fig. 6c, "4 + 3 = ")."""
    check_option("stream", stream, Stream)
    numbers = number_token_ids(model.tokenizer, max_value)
    if not numbers:
        raise InputError("The tokenizer has no single-token numbers to rank.")
    ids = torch.tensor(list(numbers.values()), device=model.cfg.device)
    acts = _end_streams(model, model.to_tokens(prompt))
    x = {"mlp_in": acts["resid_mid"], "mlp_out": acts["mlp_out"], "out_minus_in": acts["mlp_out"] - acts["resid_mid"]}[stream][0]
    sims = torch.nn.functional.cosine_similarity(x[:, None, :], unembedding_directions(model, ids, direction).T[None], dim=-1)
    values = list(numbers)
    out = []
    for l in range(sims.shape[0]):
        top = sims[l].topk(min(k, len(values)))
        out.append([(str(values[i]), float(v)) for v, i in zip(top.values.tolist(), top.indices.tolist())])
    return out


# ---------------------------------------------------------------------------- figures

_TARGET_COLORS = {"A": "#1f77b4", "B": "#ff7f0e", "C": "#2ca02c", "others": "#7f7f7f"}


def plot_probe_cosines(results: ProbeResults, title: str = "MLP input/output vs unembedding of A, B, C") -> go.Figure:
    """Mean cosine per layer, one panel per stream (paper Fig. 6a/b)."""
    fig = make_subplots(rows=1, cols=len(STREAMS), subplot_titles=[
        "MLP input (resid_mid)", "MLP output (mlp_out)", "output - input"], shared_yaxes=True)
    layers = list(range(results.n_layers))
    for col, s in enumerate(STREAMS, start=1):
        mean = results.mean_cos(s)
        for t, target in enumerate(TARGETS):
            fig.add_trace(go.Scatter(x=layers, y=mean[:, t].tolist(), mode="lines+markers", name=target,
                                     line=dict(color=_TARGET_COLORS[target], dash="dot" if target == "others" else None),
                                     legendgroup=target, showlegend=col == 1), row=1, col=col)
        fig.update_xaxes(title_text="layer", row=1, col=col)
    fig.update_yaxes(title_text="cosine similarity", row=1, col=1)
    fig.update_layout(title=title, height=400, legend=dict(orientation="h", yanchor="top", y=-0.2, x=0))
    return fig


def plot_top_tokens(top: list[list[tuple[str, float]]], prompt: str = "", answer: str | None = None) -> go.Figure:
    """Layer x rank grid of the top number tokens for one prompt (paper Fig. 6c); the answer is outlined in bold."""
    n_layers, k = len(top), len(top[0]) if top else 0
    z = [[v for _, v in row] for row in top]
    text = [[f"<b>{t}</b>" if answer is not None and t == answer else t for t, _ in row] for row in top]
    fig = go.Figure(go.Heatmap(z=z, x=[f"#{i + 1}" for i in range(k)], y=[f"L{l}" for l in range(n_layers)],
                               text=text, texttemplate="%{text}", colorscale="Viridis",
                               colorbar=dict(title="cosine with<br>MLP output"),
                               hovertemplate="%{y} %{x}: %{text} (cos %{z:.3f})<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=f"Top number tokens by cosine with MLP output at END: {prompt!r}",
                      height=max(300, 22 * n_layers + 120), xaxis_title="rank")
    return fig


def plot_logit_lens(results: ProbeResults, title: str = "Logit lens at END: the answer token after each block") -> go.Figure:
    """Top-1 rate, mean probability and median rank (log axis) of the answer per layer."""
    results._need_lens()
    layers = list(range(results.n_layers))
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=layers, y=results.top1_rate().tolist(), name="answer top-1 rate", mode="lines+markers"))
    fig.add_trace(go.Scatter(x=layers, y=results.prob.mean(0).tolist(), name="mean answer probability", mode="lines+markers"))
    fig.add_trace(go.Scatter(x=layers, y=(results.rank.float().median(0).values + 1).tolist(),
                             name="median rank of the answer (1 = it is the top token)",
                             mode="lines+markers", line=dict(dash="dot")), secondary_y=True)
    fig.update_yaxes(title_text="rate / probability", range=[0, 1.05], secondary_y=False)
    # Whole-number ticks on the log axis: plotly's default minor labels ("2, 3, 7") read as clipped numbers.
    fig.update_yaxes(title_text="median rank of the answer (log)", type="log", secondary_y=True,
                     tickvals=[1, 10, 100, 1000, 10000, 100000], ticktext=["1", "10", "100", "1k", "10k", "100k"],
                     automargin=True)
    fig.update_layout(title=title, xaxis_title="layer (residual after block)", height=420,
                      margin=dict(r=90), legend=dict(orientation="h", yanchor="top", y=-0.18, x=0))
    return fig
