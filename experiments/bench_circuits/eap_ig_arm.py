"""hannamw/EAP-IG as a comparison arm: the same scores and circuit evaluations, run through its own code.

EAP-IG (package ``eap``) is not a dependency of the toolkit; the benchmark and the
agreement tests use it when it is importable and skip it, with a message, otherwise.
To install it: ``git archive`` its repository into a scratch folder, replace its
hard-coded ``device='cuda'`` with ``device=model.cfg.device`` (a dozen places in
``src/eap/*.py``), and put ``src/`` (plus matplotlib, which it imports) on ``PYTHONPATH``.

Its metric signature is ``metric(logits, clean_logits, input_lengths, labels)``; the
one used here is the run's own END metric (:func:`eap_ig_metric`: the answer token's logit, or a pair task's
logit difference, probability difference, ...) at each prompt's last position, *summed* over the batch, so
that its scores (summed over batches, divided by the number of prompts) are the toolkit's (mean over
prompts) with no extra batch factor. ``labels`` are the answer ids, or answer and distractor ids side by side.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor
from transformer_lens import HookedTransformer

from patching.edges.engine import edge_mode
from patching.sweeps.metrics import get_metric


def eap_ig_missing() -> Optional[str]:
    """Why the EAP-IG arm cannot run here (None when ``eap`` is importable)."""
    try:
        import eap.attribute  # noqa: F401
        import eap.evaluate  # noqa: F401
        import eap.graph  # noqa: F401
    except ImportError as err:
        return (f"hannamw/EAP-IG is not importable ({err}); install it in a scratch folder and add it to "
                f"PYTHONPATH to time and compare against it (see experiments/bench_circuits/eap_ig_arm.py).")
    return None


def answer_logit_sum(logits: Tensor, clean_logits, input_lengths: Tensor, labels: Tensor) -> Tensor:
    """EAP-IG-style metric: the answer's logit at each prompt's last position, summed over the batch."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    return logits[rows, input_lengths.to(logits.device) - 1, labels.to(logits.device)].sum()


def answer_logit_each(logits: Tensor, clean_logits, input_lengths: Tensor, labels: Tensor) -> Tensor:
    """The same, per prompt (EAP-IG's ``evaluate_graph`` concatenates per-prompt values)."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    return logits[rows, input_lengths.to(logits.device) - 1, labels.to(logits.device)]


def eap_ig_metric(metric="logit", *, summed: bool = True):
    """A toolkit END metric (a name or :class:`patching.sweeps.metrics.PatchMetric`) in EAP-IG's signature: the same
    function, applied to the logits at each prompt's last position, so that both tools score the same thing.

    ``summed``: over the batch (what ``attribute`` takes, module docstring); else per prompt (``evaluate_graph``).
    ``labels``: the answer ids ``[batch]``, or ``[batch, 2]`` answer and distractor ids (a pair task's ``alt_ids``).
    """
    fn = get_metric(metric).fn

    def run_metric(logits: Tensor, clean_logits, input_lengths: Tensor, labels: Tensor) -> Tensor:
        rows = torch.arange(logits.shape[0], device=logits.device)
        labels = labels.to(logits.device)
        answers, alts = (labels, None) if labels.ndim == 1 else (labels[:, 0], labels[:, 1])
        values = fn(logits[rows, input_lengths.to(logits.device) - 1], answers, alts)
        return values.sum() if summed else values

    return run_metric


def dataloader(prompts: Sequence[str], cf_prompts: Sequence[str], answer_ids: Tensor, batch_size: int) -> list:
    """EAP-IG's batches: (clean strings, corrupted strings, labels); ``answer_ids``: ``[n]``, or ``[n, 2]`` with each
    prompt's distractor beside its answer (read by :func:`eap_ig_metric`)."""
    return [(list(prompts[i:i + batch_size]), list(cf_prompts[i:i + batch_size]), answer_ids[i:i + batch_size])
            for i in range(0, len(prompts), batch_size)]


def eap_ig_scores(model: HookedTransformer, batches: list, method: str = "EAP-IG-inputs", ig_steps: int = 5,
                  metric=answer_logit_sum) -> Tensor:
    """EAP-IG's own edge scores ``[n_forward, n_backward]`` (same index layout as :mod:`circuits.graph`), of
    ``metric`` in EAP-IG's signature, summed over each batch (default: the answer's logit; :func:`eap_ig_metric`)."""
    from eap.attribute import attribute
    from eap.graph import Graph as EapGraph

    with edge_mode(model, attn_result=True):
        graph = EapGraph.from_model(model)
        attribute(model, graph, batches, metric, method=method,
                  ig_steps=ig_steps if method.startswith("EAP-IG") else None, quiet=True)
    return graph.scores.detach().float().cpu()


def eap_ig_evaluate(model: HookedTransformer, batches: list, scores: Tensor, n_edges: Sequence[int],
                    metric=answer_logit_each) -> dict:
    """EAP-IG's faithfulness evaluation: per-prompt ``metric`` (EAP-IG's signature, one value per prompt; default: the
    answer's logit) of the full model, of the empty circuit, and of the top-n circuits (``apply_topn``, pruned) for
    each n, with counterfactual ("patching") ablation."""
    from eap.evaluate import evaluate_baseline, evaluate_graph
    from eap.graph import Graph as EapGraph

    with edge_mode(model, attn_result=True):
        graph = EapGraph.from_model(model)
        graph.scores[:] = torch.nan_to_num(scores)
        out = {"full": evaluate_baseline(model, batches, metric, quiet=True)}
        graph.apply_topn(0, True)
        out["empty"] = evaluate_graph(model, graph, batches, metric, quiet=True)
        for n in n_edges:
            graph.apply_topn(int(n), True)
            out[int(n)] = evaluate_graph(model, graph, batches, metric, quiet=True)
    return out
