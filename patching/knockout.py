"""Mean-ablation knockout (Wang et al. 2023; Zhang et al. 2024 §4.1, Figures 3 and 4).

To knock a node out, replace its output (a head's ``hook_z`` slice, an MLP's
``hook_mlp_out``) with its *mean over the counterfactual data* at the same
position: the task information is removed, the "typical" activation is kept.
Means are position-wise, so they are taken per prompt layout: per template
and token length (rows of one template and length have their operands, operator
and END at the same positions).

:func:`knockout_curve` validates a ranking: knock out the top-k heads by
path-patching effect ("effect-rank") for growing k, against k random heads
averaged over several seeds ("random-rank"). :func:`knockout_transfer` knocks
the key heads out on other data formats (:func:`circuits.tasks.transfer_datasets`)
to see whether they matter there too.
"""

from __future__ import annotations

import random
from typing import Optional, Sequence, Union

import torch
from datasets import Dataset
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from circuits.metrics import top1_correct
from circuits.nodes import Head, Node, all_heads, validate_nodes
from circuits.tasks import TaskBatch, iter_batches
from patching import _runs
from patching.results import KnockoutCurve, NodeScores

Means = dict[tuple[str, int], dict[str, torch.Tensor]]


def _layout(row_template: str, n_pos: int) -> tuple[str, int]:
    return (row_template, n_pos)


def _templates(dataset: Dataset) -> list[str]:
    return dataset["template_id"] if "template_id" in dataset.column_names else [""] * len(dataset)


@torch.no_grad()
def mean_activations(
    model: HookedTransformer,
    dataset: Dataset,
    nodes: Sequence[Node],
    *,
    source: str = "counterfactual",
    batch_size: int = 32,
) -> Means:
    """Position-wise mean of each node's hook activation, per (template, token length) layout.

    ``source="counterfactual"`` averages over the counterfactual twins (the paper's choice);
    ``"reference"`` over the reference prompts. Returns ``{(template_id, n_pos): {hook_name: mean}}``
    with means shaped like one row of the activation (``[pos, head, d_head]`` or ``[pos, d_model]``).
    """
    if source not in ("counterfactual", "reference"):
        raise ValueError(f"source must be 'counterfactual' or 'reference', got {source!r}.")
    nodes = validate_nodes(model, nodes)
    names = sorted({n.hook_name for n in nodes})
    templates = _templates(dataset)
    sums: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
    counts: dict[tuple[str, int], int] = {}
    if not names:
        return sums
    for batch in iter_batches(dataset, batch_size, device=model.cfg.device):
        tokens = batch.cf_tokens if source == "counterfactual" else batch.tokens
        acts, _ = _runs.full_cache(model, tokens, names)
        for row, index in enumerate(batch.indices):
            key = _layout(templates[index], tokens.shape[1])
            slot = sums.setdefault(key, {n: 0.0 for n in names})
            for n in names:
                slot[n] = slot[n] + acts[n][row].double()
            counts[key] = counts.get(key, 0) + 1
    return {key: {n: (v / counts[key]).to(model.cfg.dtype) for n, v in slot.items()} for key, slot in sums.items()}


def knockout_hooks(model: HookedTransformer, batch: TaskBatch, templates: Sequence[str], nodes: Sequence[Node], means: Means):
    """Forward hooks that replace each node's output with its layout's mean, row by row."""
    n_pos = batch.tokens.shape[1]
    keys = [_layout(templates[i], n_pos) for i in batch.indices]
    missing = sorted({k for k in keys if k not in means})
    if missing:
        raise ValueError(f"No mean activations for layouts {missing} (template, n_pos); compute the means on "
                         f"data with the same templates and lengths.")
    by_name: dict[str, list] = {}
    for node in nodes:
        by_name.setdefault(node.hook_name, []).append(node)
    hooks = []
    for name, group in by_name.items():
        stacked = torch.stack([means[k][name] for k in keys]).to(batch.tokens.device)
        heads = [n.head for n in group if isinstance(n, Head)]

        def ablate(act, *, hook, stacked=stacked, heads=heads):
            if not heads:  # an MLP: its whole output
                return stacked.to(act.dtype)
            act = act.clone()
            act[:, :, heads] = stacked[:, :, heads].to(act.dtype)
            return act

        hooks.append((name, ablate))
    return hooks


@torch.no_grad()
def knockout(
    model: HookedTransformer,
    dataset: Dataset,
    nodes: Sequence[Node],
    *,
    means: Optional[Means] = None,
    batch_size: int = 32,
) -> float:
    """Top-1 accuracy (first answer token) with ``nodes`` mean-ablated; no nodes gives the plain accuracy.

    ``means`` defaults to :func:`mean_activations` over ``dataset``'s counterfactual twins.
    """
    if len(dataset) == 0:
        raise ValueError("knockout got an empty dataset.")
    nodes = validate_nodes(model, nodes)
    if means is None:
        means = mean_activations(model, dataset, nodes, batch_size=batch_size)
    templates = _templates(dataset)
    hits = 0
    for batch in iter_batches(dataset, batch_size, device=model.cfg.device):
        hooks = knockout_hooks(model, batch, templates, nodes, means) if nodes else []
        hits += int(top1_correct(model, batch.tokens, batch.answer_ids, fwd_hooks=hooks).sum())
    return hits / len(dataset)


def _ranking(model, ranking: Union[NodeScores, Sequence[Head]], by: str) -> list[Head]:
    if isinstance(ranking, NodeScores):
        return [n for n, _ in ranking.ranked("heads", by=by)]
    return validate_nodes(model, ranking)


def knockout_curve(
    model: HookedTransformer,
    dataset: Dataset,
    ranking: Union[NodeScores, Sequence[Head]],
    *,
    ks: Sequence[int] = (1, 2, 4, 8),
    n_seeds: int = 5,
    seed: int = 0,
    by: str = "neg",
    batch_size: int = 32,
    progress: bool = True,
) -> KnockoutCurve:
    """Accuracy after knocking out the top-k heads of ``ranking`` vs k random heads (mean/std over seeds).

    ``ranking`` is a path-patching :class:`NodeScores` (heads ordered by ``by``; ``"neg"``: the
    largest drop of the answer logit first) or an explicit list of heads, most important first.
    """
    heads = _ranking(model, ranking, by)
    ks = sorted(set(int(k) for k in ks))
    if not ks or ks[0] < 1 or ks[-1] > len(heads):
        raise ValueError(f"ks must lie in 1..{len(heads)} (the number of ranked heads), got {ks}.")
    every_head = all_heads(model)
    means = mean_activations(model, dataset, every_head, batch_size=batch_size)
    base = knockout(model, dataset, [], means=means, batch_size=batch_size)
    bar = tqdm(total=len(ks) * (1 + n_seeds), desc="knockout curve", disable=not progress, leave=False)
    effect, rand_mean, rand_std = [], [], []
    for k in ks:
        effect.append(knockout(model, dataset, heads[:k], means=means, batch_size=batch_size))
        bar.update(1)
        accs = []
        for s in range(n_seeds):
            picked = random.Random(seed + s).sample(every_head, k)
            accs.append(knockout(model, dataset, picked, means=means, batch_size=batch_size))
            bar.update(1)
        t = torch.tensor(accs, dtype=torch.float64)
        rand_mean.append(float(t.mean()))
        rand_std.append(float(t.std()) if len(accs) > 1 else 0.0)
    bar.close()
    return KnockoutCurve(ks, effect, rand_mean, rand_std, base, [str(h) for h in heads[: ks[-1]]], n_seeds)


def knockout_transfer(
    model: HookedTransformer,
    datasets: dict[str, Dataset],
    heads: Sequence[Head],
    *,
    batch_size: int = 32,
    progress: bool = True,
) -> dict[str, dict]:
    """Per data format: accuracy of the full model and with ``heads`` mean-ablated (means from that format).

    Pass :func:`circuits.tasks.transfer_datasets` output (Zhang et al. Figure 4). Assign the
    returned dict to ``KnockoutCurve.transfer`` to draw it with ``transfer_figure()``.
    """
    out = {}
    for name, ds in tqdm(datasets.items(), desc="knockout transfer", disable=not progress, leave=False):
        means = mean_activations(model, ds, heads, batch_size=batch_size)
        out[name] = {
            "n_prompts": len(ds),
            "base": knockout(model, ds, [], means=means, batch_size=batch_size),
            "knockout": knockout(model, ds, heads, means=means, batch_size=batch_size),
        }
    return out
