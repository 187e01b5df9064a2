"""ACDC's comparison arms: the plain edge-by-edge loop, and auto-circuit's ACDC when it is importable.

The plain loop is ACDC as the paper writes it: one edge at a time, each circuit a dense mask run on its
own by :func:`patching.edges.evaluate_circuit`, the KL against the model's own END distribution taken
by a metric on the full vocabulary. It shares nothing with :mod:`patching.edges.acdc` beyond the circuit
evaluation, so the benchmark times the speculative batches against it and the tests check the two agree.

auto-circuit (package ``auto_circuit``, UFO-101/auto-circuit) is not a dependency of the toolkit; the arm
runs its ``acdc_prune_scores`` at one τ on a copy of the model, over the same edges as ours and in our order,
when it is importable, and is skipped with a message otherwise. It is also skipped on models with norms after
attention (gemma-2/3): auto-circuit takes a head's output at ``attn.hook_result``, before ``ln1_post``, and adds
its patched difference to the receivers unnormalised, so its ablations are not the model's: on a tiny
gemma-style model its patch of one head's output differed from TransformerLens' own patch of that head by up to
3.41 in the logits, as much as the patch moved them (3.38); on a llama-style one the two agree to 2e-6.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Optional

import torch

from circuits.graph import GraphLayout
from patching import SweepOptions
from patching.edges import evaluate_circuit


@torch.no_grad()
def plain_acdc(model, batch, threshold: float, objective: str = "kl", n_receivers: Optional[int] = None,
               metric="logit", memory_mb: Optional[float] = None, alt_ids=None):
    """``(kept mask, {(sender, receiver): damage}, final objective)`` of ACDC run edge by edge on ``batch``
    (a :class:`circuits.tasks.TaskBatch` or a Dataset of prompts of one token length), over the incoming edges
    of the first ``n_receivers`` receivers from the output back (None: all). ``metric`` (a name or a
    :class:`patching.sweeps.metrics.PatchMetric`) and ``alt_ids`` (a pair task's distractors, with a TaskBatch):
    what the ``"metric"`` objective scores."""
    layout = GraphLayout.of(model)
    tokens = batch.tokens if hasattr(batch, "tokens") else torch.tensor(batch["tokens"], device=model.cfg.device)
    full = torch.log_softmax(model(tokens)[:, -1].double(), -1)

    def kl(logits, answer_ids, alt_ids):  # one circuit of one group of prompts per run: the rows are in order
        return (full.exp() * (full - torch.log_softmax(logits.double(), -1))).sum(-1)

    options = SweepOptions(metric=kl if objective == "kl" else metric, memory_mb=memory_mb, progress=False)

    def value(mask):
        return evaluate_circuit(model, mask, batch, alt_ids=alt_ids, options=options).mean

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


def auto_circuit_missing(model=None, objective: str = "kl") -> Optional[str]:
    """Why the auto-circuit arm cannot run here (None when ``auto_circuit`` is importable and, given ``model``,
    auto-circuit's edge ablations are the model's own; its ACDC has the KL objective only)."""
    if objective != "kl":
        return f"auto-circuit's ACDC measures the KL only, and this run's objective is {objective!r}"
    _alias_kv_cache_module()
    try:
        import auto_circuit.prune_algos.ACDC  # noqa: F401
        import auto_circuit.utils.graph_utils  # noqa: F401
    except ImportError as err:
        return (f"auto-circuit is not importable ({err}); `pip install --no-deps --target DIR auto-circuit==1.0.1 "
                f"ordered-set blobfile lxml pycryptodomex` and put DIR on PYTHONPATH to time its ACDC beside ours")
    if model is not None and model.cfg.use_normalization_before_and_after:
        # its head sources are attn.hook_result, before ln1_post: it adds pre-norm head differences to the residual
        return ("auto-circuit patches attention heads at attn.hook_result, before this model's post-attention norm "
                "(ln1_post), so its edge ablations are not the model's (gemma-2/3); run the arm on a pre-norm model "
                "such as --model smollm2-135m")
    return None


def auto_circuit_acdc(model, tokens, cf_tokens, threshold: float, n_receivers: Optional[int] = None,
                      same_order: bool = True) -> dict:
    """auto-circuit's ACDC (KL objective, counterfactual patching) on a copy of ``model`` at τ = ``threshold``, over
    the incoming edges of the first ``n_receivers`` receivers from the output back (None: every edge), as
    :func:`patching.edges.acdc.acdc` with ``max_receivers``: its number of edges tested, how many it kept, and the
    kept edges' names in :class:`circuits.graph.GraphLayout`'s spelling (an edge it did not test stays kept, so
    only the tested ones are listed).

    auto-circuit 1.0.1's ``acdc_prune_scores(model, dataloader, official_edges, ...)`` reads the first batch of the
    dataloader (its ``clean`` and ``corrupt`` tokens) and visits ``model.edges`` by destination layer, and within
    one in the order of a ``set`` (which changes with PYTHONHASHSEED); ``same_order`` hands it a list in
    :func:`patching.edges.acdc.acdc`'s order instead (receivers from the output back, senders latest first), so
    that both test the same circuits and can keep the same edges."""
    problem = auto_circuit_missing(model)
    if problem:
        raise RuntimeError(problem)
    from auto_circuit.prune_algos.ACDC import acdc_prune_scores
    from auto_circuit.utils.graph_utils import patchable_model

    model = copy.deepcopy(model)
    # auto-circuit's factorized graph asserts these (auto_circuit/model_utils/transformer_lens_utils.py)
    model.set_use_attn_result(True)
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    if model.cfg.n_key_value_heads is not None:  # its K/V receivers are one per query head
        model.set_ungroup_grouped_query_attention(True)
    patchable = patchable_model(model, factorized=True, slice_output="last_seq", separate_qkv=True,
                                device=tokens.device)
    layout = GraphLayout.of(model)
    index = {edge: layout.edge_index(f"{_our_name(edge.src.name)}->{_our_name(edge.dest.name)}")
             for edge in patchable.edges}
    first_receiver = _first_receiver(layout, n_receivers)
    tested = [edge for edge in patchable.edges if index[edge][1] >= first_receiver]
    # a list, not a set: ACDC's sort by destination layer is stable, so the order within a layer stays ours
    patchable.edges = sorted(tested, key=lambda e: (-index[e][1], -index[e][0])) if same_order else set(tested)
    loader = [SimpleNamespace(clean=tokens, corrupt=cf_tokens, key=0)]
    scores = acdc_prune_scores(patchable, loader, None, tao_exps=[0], tao_bases=[threshold],
                               faithfulness_target="kl_div")
    kept = [layout.edge_name(*index[e]) for e in tested if torch.isinf(e.prune_score(scores))]
    return {"n_edges": len(tested), "n_edges_kept": len(kept), "kept_edges": sorted(kept), "same_order": same_order}


def kept_edges(graph, n_receivers: Optional[int] = None) -> list[str]:
    """The names of the edges a circuit ``graph`` keeps into the first ``n_receivers`` receivers from the output back
    (None: all), sorted: what :func:`auto_circuit_acdc`'s ``kept_edges`` is compared with."""
    first_receiver = _first_receiver(graph.layout, n_receivers)
    return sorted(graph.layout.edge_name(f, b) for f, b in graph.in_graph.nonzero().tolist() if b >= first_receiver)


def _first_receiver(layout: GraphLayout, n_receivers: Optional[int]) -> int:
    """The backward index of the last of ``n_receivers`` receivers counted from the output back (None: 0, every one),
    as ACDC visits them."""
    return 0 if n_receivers is None else layout.n_backward - n_receivers


def _our_name(name: str) -> str:
    """auto-circuit's node name as :class:`circuits.graph.GraphLayout` writes it ('A1.0.Q' -> 'a1.h0<q>')."""
    if name in ("Resid Start", "Resid End"):
        return "input" if name == "Resid Start" else "logits"
    if name.startswith("MLP "):
        return f"m{name[4:]}"
    layer, head, *qkv = name[1:].split(".")
    return f"a{layer}.h{head}" + (f"<{qkv[0].lower()}>" if qkv else "")


def _alias_kv_cache_module() -> None:
    """auto-circuit 1.0.1 imports ``transformer_lens.past_key_value_caching.HookedTransformerKeyValueCache`` (and the
    same name from ``transformer_lens``), which TransformerLens 3 renamed to
    ``transformer_lens.cache.key_value_cache.TransformerLensKeyValueCache``: the old names are aliased, only when
    auto-circuit is installed (it uses the class in type hints and in dataloaders with KV caches, which this arm
    does not build)."""
    import importlib.util
    import sys
    import types

    if importlib.util.find_spec("auto_circuit") is None:
        return
    import transformer_lens

    if hasattr(transformer_lens, "HookedTransformerKeyValueCache"):
        return
    try:
        from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
    except ImportError:
        return
    transformer_lens.HookedTransformerKeyValueCache = TransformerLensKeyValueCache
    if "transformer_lens.past_key_value_caching" not in sys.modules:
        alias = types.ModuleType("transformer_lens.past_key_value_caching")
        alias.HookedTransformerKeyValueCache = TransformerLensKeyValueCache
        sys.modules[alias.__name__] = alias
