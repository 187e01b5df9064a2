"""ACDC's comparison arms: the plain edge-by-edge loop, and auto-circuit's ACDC when it is importable.

The plain loop is ACDC as the paper writes it: one edge at a time, each circuit a dense mask run on its
own by :func:`patching.edges.evaluate_circuit`, the KL against the model's own END distribution taken
by a metric on the full vocabulary. It shares nothing with :mod:`patching.edges.acdc` beyond the circuit
evaluation, so the benchmark times the speculative batches against it and the tests check the two agree.

auto-circuit (package ``auto_circuit``, UFO-101/auto-circuit) is not a dependency of the toolkit; the arm
runs its ``acdc_prune_scores`` at one τ on a copy of the model when it is importable and is skipped,
with a message, otherwise.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Optional

import torch

from circuits.graph import GraphLayout
from patching.edges.evaluate import evaluate_circuit
from patching.options import SweepOptions


@torch.no_grad()
def plain_acdc(model, batch, threshold: float, objective: str = "kl", n_receivers: Optional[int] = None,
               metric: str = "logit", memory_mb: Optional[float] = None):
    """``(kept mask, {(sender, receiver): damage}, final objective)`` of ACDC run edge by edge on ``batch``
    (a :class:`circuits.tasks.TaskBatch` or a Dataset of prompts of one token length), over the incoming edges
    of the first ``n_receivers`` receivers from the output back (None: all)."""
    layout = GraphLayout.of(model)
    tokens = batch.tokens if hasattr(batch, "tokens") else torch.tensor(batch["tokens"], device=model.cfg.device)
    full = torch.log_softmax(model(tokens)[:, -1].double(), -1)

    def kl(logits, answer_ids, alt_ids):  # one circuit of one group of prompts per run: the rows are in order
        return (full.exp() * (full - torch.log_softmax(logits.double(), -1))).sum(-1)

    options = SweepOptions(metric=kl if objective == "kl" else metric, memory_mb=memory_mb, progress=False)

    def value(mask):
        return evaluate_circuit(model, mask, batch, options=options).mean

    mask = layout.real_edge_mask.clone()
    current = value(mask)
    damages = {}
    for receiver in list(range(layout.n_backward - 1, -1, -1))[:n_receivers]:
        for sender in range(layout.n_forward - 1, -1, -1):
            if not mask[sender, receiver]:
                continue
            trial = mask.clone()
            trial[sender, receiver] = False
            after = value(trial)
            damages[sender, receiver] = after - current if objective == "kl" else current - after
            if damages[sender, receiver] < threshold:
                mask, current = trial, after
    return mask, damages, current


def auto_circuit_missing() -> Optional[str]:
    """Why the auto-circuit arm cannot run here (None when ``auto_circuit`` is importable)."""
    try:
        import auto_circuit.prune_algos.ACDC  # noqa: F401
        import auto_circuit.utils.graph_utils  # noqa: F401
    except ImportError as err:
        return (f"auto-circuit is not importable ({err}); `pip install auto-circuit` in a scratch environment to time "
                f"its ACDC beside ours (see experiments/bench_circuits/acdc_arm.py).")
    return None


def auto_circuit_acdc(model, tokens, cf_tokens, threshold: float) -> dict:
    """auto-circuit's ACDC (KL objective, counterfactual patching) over every edge of a copy of ``model`` at τ =
    ``threshold``: its number of edges and of edges it kept. ``acdc_prune_scores`` reads only ``task.model`` and
    the first batch of ``task.train_loader``, so the task is those two."""
    from auto_circuit.prune_algos.ACDC import acdc_prune_scores
    from auto_circuit.utils.graph_utils import patchable_model

    patchable = patchable_model(copy.deepcopy(model), factorized=True, slice_output="last_seq", separate_qkv=True,
                                device=tokens.device)
    task = SimpleNamespace(model=patchable, train_loader=[SimpleNamespace(clean=tokens, corrupt=cf_tokens)])
    scores = acdc_prune_scores(task, tao_exps=[0], tao_bases=[threshold], faithfulness_target="kl_div")
    kept = sum(int(torch.isinf(s).sum()) for s in scores.values())  # removed edges score τ, kept ones stay inf
    return {"n_edges": sum(s.numel() for s in scores.values()), "n_edges_kept": kept}
