"""patching.edges.mixing: the two norm conventions on post-norm models, against each other, against exact
patching, and (where hannamw/EAP-IG is importable) ``norm="recompute"`` against EAP-IG's ``evaluate_graph``."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import prune
from circuits.tasks import make_dataset
from patching.edges.evaluate import evaluate_circuits
from patching.edges.patch import edge_patch
from patching import SweepOptions
from tests.tiny_models import tiny_model


def _setup(style="gemma", n_kv=1, n_prompts=6, seed=3):
    model = tiny_model(style=style, n_layers=3, n_heads=4, n_key_value_heads=n_kv, seed=seed)
    data = make_dataset(model, n_prompts=120, n_shots=0, seed=1)
    n = len(data[0]["tokens"])
    return model, data.filter(lambda r: len(r["tokens"]) == n).select(range(n_prompts))


def _random_circuits(layout: GraphLayout, n: int, density: float, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    real = layout.real_edge_mask
    return [prune(Graph(layout, in_graph=real & (torch.rand(real.shape, generator=g) < density))).in_graph
            for _ in range(n)]


@pytest.mark.parametrize("norm", ["frozen", "recompute"])
def test_full_and_empty_circuits_do_not_depend_on_the_convention(norm):
    model, data = _setup()
    real = GraphLayout.of(model).real_edge_mask
    full, empty = evaluate_circuits(model, [real, torch.zeros_like(real)], data, norm=norm)
    reference = evaluate_circuits(model, [real, torch.zeros_like(real)], data, norm="frozen")
    torch.testing.assert_close(full.per_prompt, reference[0].per_prompt, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(empty.per_prompt, reference[1].per_prompt, rtol=1e-5, atol=1e-5)


def test_the_conventions_differ_on_post_norm_models_and_agree_without_post_norms():
    for style, n_kv, differ in [("gemma", 1, True), ("llama", 2, False)]:
        model, data = _setup(style, n_kv)
        circuits = _random_circuits(GraphLayout.of(model), 3, 0.4)
        frozen = torch.stack([e.per_prompt for e in evaluate_circuits(model, circuits, data, norm="frozen")])
        recompute = torch.stack([e.per_prompt for e in evaluate_circuits(model, circuits, data, norm="recompute")])
        gap = float((frozen - recompute).abs().max())
        assert (gap > 1e-3) if differ else (gap < 1e-5), (style, gap)


@pytest.mark.parametrize("norm", ["frozen", "recompute"])
def test_patching_one_edge_is_the_full_circuit_minus_that_edge(norm):
    model, data = _setup()
    layout = GraphLayout.of(model)
    real = layout.real_edge_mask
    heads = [layout.head_forward(l, h) for l in range(layout.n_layers - 1) for h in range(layout.n_heads)]
    # every kind of receiver, q, k and v alone in their layer (the three inputs share one product per layer)
    edges = [(f, layout.head_backward(2, 1, "v")) for f in heads[:4]] + [(heads[5], layout.logits_backward),
                                                                          (0, layout.mlp_backward(1)),
                                                                          (heads[1], layout.head_backward(2, 0, "q")),
                                                                          (0, layout.head_backward(1, 3, "k")),
                                                                          (heads[6], layout.head_backward(2, 2, "k"))]
    effects = edge_patch(model, edges, data, norm=norm, options=SweepOptions(progress=False))
    circuits = []
    for f, b in edges:
        c = real.clone()
        c[f, b] = False
        circuits.append(c)
    values = evaluate_circuits(model, circuits + [real], data, norm=norm)
    expected = torch.stack([v.per_prompt - values[-1].per_prompt for v in values[:-1]])
    torch.testing.assert_close(effects.per_prompt, expected.to(effects.per_prompt.dtype), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("eap") is None,
                    reason="hannamw/EAP-IG (package 'eap') is not installed; install it in a scratch dir (see "
                           "experiments/bench_circuits/eap_ig_arm.py) and add it to PYTHONPATH to compare against it")
@pytest.mark.parametrize("style, n_kv", [("gemma", 1), ("gemma", 2), ("llama", 2)])
def test_recompute_equals_eap_ig_evaluate_graph(style, n_kv):
    from eap.evaluate import evaluate_graph
    from eap.graph import Graph as EapGraph

    from experiments.bench_circuits.eap_ig_arm import answer_logit_each, dataloader
    from patching.edges.engine import edge_mode

    model, data = _setup(style, n_kv)
    layout = GraphLayout.of(model)
    answers = torch.tensor([ids[0] for ids in data["answer_token_ids"]])
    batches = dataloader(data["prompt"], data["counterfactual"], answers, 3)
    circuits = _random_circuits(layout, 4, 0.35, seed=5)
    ours = evaluate_circuits(model, circuits, data, norm="recompute")
    for circuit, mine in zip(circuits, ours):
        with edge_mode(model, attn_result=True):
            graph = EapGraph.from_model(model)
            graph.in_graph[:] = circuit
            graph.nodes_in_graph[:] = True
            theirs = evaluate_graph(model, graph, batches, answer_logit_each, quiet=True)
        torch.testing.assert_close(mine.per_prompt.float(), theirs.float(), rtol=1e-4, atol=1e-4)
