"""patching.edges.evaluate: circuits run with every edge outside them ablated, against a plain replacement
(tests/patching/edge_reference.py), for every ablation; mean pools checked; no hook or flag survives an
error. On gpt2/llama-GQA/gemma-MQA tiny models, and gemma-3-270m in the integration tier."""

from __future__ import annotations

import pytest
import torch

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_io import GraphFileError
from circuits.tasks import make_dataset, single_batch
from tests.tiny_models import tiny_model
from patching.edges.evaluate import MeanPoolError, evaluate_circuit, evaluate_circuits
from patching.edges.patch import edge_patch
from patching import SweepOptions
from tests.patching import edge_reference as plain


STYLES = {"gpt2": dict(style="gpt2"), "llama_gqa": dict(style="llama", n_key_value_heads=2), "gemma_mqa": dict(style="gemma")}
EDGES = ["input->a0.h1<q>", "input->a1.h2<k>", "a0.h2->a1.h0<k>", "m0->a1.h3<v>", "a1.h1->m1", "a0.h0->m0",
         "m1->logits", "input->logits", "a1.h3->logits"]


@pytest.fixture(scope="module", params=list(STYLES))
def setup(request):
    model = tiny_model(n_layers=2, seed=3, **STYLES[request.param])
    if request.param == "gpt2":
        with torch.no_grad():
            for block in model.blocks:
                block.attn.b_O.normal_(0, 0.3)
    data = make_dataset(model, n_prompts=5, n_shots=1, template_ids=["add-equation-0"], seed=1)
    return model, data


def _full(model):
    return GraphLayout.of(model).real_edge_mask.clone()


def test_full_graph_is_the_model_and_empty_graph_the_counterfactual(setup):
    model, data = setup
    batch = single_batch(data)
    empty = torch.zeros_like(_full(model))
    full_eval, empty_eval = evaluate_circuits(model, [_full(model), empty], data)
    ref = plain.logit(model, model(batch.tokens), batch.answer_ids)
    cf = plain.logit(model, model(batch.cf_tokens), batch.answer_ids)
    torch.testing.assert_close(full_eval.per_prompt.float(), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(empty_eval.per_prompt.float(), cf, atol=1e-4, rtol=1e-4)
    assert (full_eval.n_edges, empty_eval.n_edges) == (GraphLayout.of(model).n_edges, 0)


def test_full_graph_minus_one_edge_equals_edge_patch(setup):
    model, data = setup
    layout = GraphLayout.of(model)
    effects = edge_patch(model, EDGES, data, options=SweepOptions(progress=False))
    circuits = []
    for f, b in effects.edges:
        mask = _full(model)
        mask[f, b] = False
        circuits.append(mask)
    full = evaluate_circuit(model, Graph(layout), data)
    for evaluation, effect in zip(evaluate_circuits(model, circuits, data), effects.per_prompt):
        torch.testing.assert_close(evaluation.per_prompt - full.per_prompt, effect, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("ablation", ["counterfactual", "zero", "mean", "positional-mean"])
def test_random_circuits_equal_the_plain_replacement(setup, ablation):
    """Receivers read Σ in-circuit current outputs + Σ out-of-circuit ablated outputs; several circuits per forward."""
    model, data = setup
    batch = single_batch(data)
    layout = GraphLayout.of(model)
    pool = make_dataset(model, n_prompts=4, n_shots=1, template_ids=["add-equation-0"], seed=7)
    pool_tokens = single_batch(pool).tokens
    g = torch.Generator().manual_seed(0)
    masks = [torch.rand(layout.n_forward, layout.n_backward, generator=g) < p for p in (0.3, 0.7, 0.9)]
    masks.append(torch.zeros(layout.n_forward, layout.n_backward, dtype=torch.bool))
    means_from = pool if ablation.endswith("mean") else None
    got = evaluate_circuits(model, masks, data, ablation=ablation, means_from=means_from,
                            options=SweepOptions(memory_mb=0.05))
    if ablation == "counterfactual":
        ablated = plain.outputs(model, batch.cf_tokens)
    elif ablation == "zero":
        ablated = {f: torch.zeros(model.cfg.d_model) for f in range(layout.n_forward)}
    else:
        pool_out = plain.outputs(model, pool_tokens)
        dims = (0, 1) if ablation == "mean" else (0,)
        ablated = {f: v.mean(dims) for f, v in pool_out.items()}
    for mask, evaluation in zip(masks, got):
        expected = plain.plain_circuit(model, mask & layout.real_edge_mask, batch.tokens, ablated, batch.answer_ids)
        torch.testing.assert_close(evaluation.per_prompt.float(), expected, atol=2e-4, rtol=1e-4)
        assert evaluation.ablation == ablation and evaluation.n_prompts == len(data)


def test_counterfactual_evaluation_with_and_without_prefix_reuse_agree(setup):
    model, data = setup
    layout = GraphLayout.of(model)
    mask = torch.rand(layout.n_forward, layout.n_backward, generator=torch.Generator().manual_seed(1)) < 0.5
    fast = evaluate_circuit(model, mask, data)
    slow = evaluate_circuit(model, mask, data, options=SweepOptions(reuse_prefix=False))
    torch.testing.assert_close(fast.per_prompt, slow.per_prompt, atol=2e-5, rtol=1e-4)


def test_mean_ablation_pools_must_be_given_disjoint_and_of_the_right_lengths():
    model = tiny_model(style="gemma", n_layers=1, seed=0)
    data = make_dataset(model, n_prompts=4, n_shots=1, template_ids=["add-equation-0"], seed=1)
    full = _full(model)
    with pytest.raises(MeanPoolError, match="needs means_from"):
        evaluate_circuit(model, full, data, ablation="mean")
    overlapping = make_dataset(model, n_prompts=6, n_shots=1, template_ids=["add-equation-0"], seed=1)
    with pytest.raises(MeanPoolError, match=r"shares \d+ prompt\(s\) with the evaluated prompts"):
        evaluate_circuit(model, full, data, ablation="mean", means_from=overlapping)
    with pytest.raises(MeanPoolError, match="shares"):
        evaluate_circuit(model, full, data, ablation="positional-mean", means_from=single_batch(data).tokens)
    other_length = make_dataset(model, n_prompts=4, n_shots=0, template_ids=["add-equation-0"], seed=9)
    with pytest.raises(MeanPoolError, match="positional-mean needs pool prompts of every evaluated length"):
        evaluate_circuit(model, full, data, ablation="positional-mean", means_from=other_length)
    evaluate_circuit(model, full, data, ablation="mean", means_from=other_length)  # any lengths will do for "mean"
    with pytest.raises(InputError, match="means_from is only used by mean ablations"):
        evaluate_circuit(model, full, data, means_from=other_length)
    with pytest.raises(InputError, match="Unknown ablation"):
        evaluate_circuit(model, full, data, ablation="resample")
    with pytest.raises(InputError, match="shape"):
        evaluate_circuit(model, full[:, :-1], data)
    with pytest.raises(InputError, match="not an edge"):
        edge_patch(model, ["m0->a0.h0<q>"], data, options=SweepOptions(progress=False))
    with pytest.raises(InputError, match="not an edge"):
        edge_patch(model, [(0, GraphLayout.of(model).n_backward)], data, options=SweepOptions(progress=False))


def _no_hooks(model) -> bool:
    return all(not hp.fwd_hooks and not hp.bwd_hooks for hp in model.hook_dict.values())


@pytest.mark.parametrize("call", ["edge_patch", "evaluate", "evaluate_mean"])
def test_no_hook_or_flag_survives_an_exception(call):
    model = tiny_model(style="gemma", n_layers=2, seed=0)
    data = make_dataset(model, n_prompts=3, n_shots=1, template_ids=["add-equation-0"], seed=1)
    pool = make_dataset(model, n_prompts=3, n_shots=1, template_ids=["add-equation-0"], seed=8)
    flags = {f: getattr(model.cfg, f) for f in ("use_split_qkv_input", "ungroup_grouped_query_attention", "use_hook_mlp_in")}
    calls = []

    def raising(logits, answers, alt):
        calls.append(1)
        if len(calls) > 1:  # fail inside the sweep, after the reference run
            raise RuntimeError("metric failed")
        return logits.gather(-1, answers[:, None])[:, 0]

    runs = {
        "edge_patch": lambda: edge_patch(model, None, data, options=SweepOptions(metric=raising, progress=False)),
        "evaluate": lambda: evaluate_circuits(model, [_full(model)] * 2, data,
                                              options=SweepOptions(metric=raising, memory_mb=1e-4)),
        "evaluate_mean": lambda: evaluate_circuits(model, [_full(model)] * 2, data, ablation="mean", means_from=pool,
                                                   options=SweepOptions(metric=raising, memory_mb=1e-4)),
    }
    with pytest.raises(RuntimeError, match="metric failed"):
        runs[call]()
    assert _no_hooks(model)
    assert {f: getattr(model.cfg, f) for f in flags} == flags


@pytest.mark.integration
def test_gemma_full_graph_reproduces_the_model_and_empty_graph_the_counterfactual(gemma):
    data = make_dataset(gemma, n_prompts=3, n_shots=2, template_ids=["add-equation-0"], seed=0)
    batch = single_batch(data)
    full, empty = evaluate_circuits(gemma, [_full(gemma), torch.zeros_like(_full(gemma))], data,
                                    options=SweepOptions(metric="logit"))
    ref = gemma(batch.tokens)[:, -1].gather(-1, batch.answer_ids[:, None])[:, 0]
    cf = gemma(batch.cf_tokens)[:, -1].gather(-1, batch.answer_ids[:, None])[:, 0]
    torch.testing.assert_close(full.per_prompt.float(), ref, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(empty.per_prompt.float(), cf, atol=1e-3, rtol=1e-4)
    assert full.n_edges == 10342
    logprob = evaluate_circuit(gemma, Graph.from_model(gemma), data,
                               options=SweepOptions(metric="logprob"))  # reads the whole vocabulary
    expected = gemma(batch.tokens)[:, -1].log_softmax(-1).gather(-1, batch.answer_ids[:, None])[:, 0]
    torch.testing.assert_close(logprob.per_prompt.float(), expected, atol=1e-3, rtol=1e-4)


def test_a_graph_recorded_for_another_d_model_is_refused():
    """Same layers and heads, another d_model (recorded in the graph's meta): it was evaluated without a word."""
    from circuits.graph_io import GraphFileError

    model = tiny_model(style="gpt2", n_layers=2)
    data = make_dataset(model, n_prompts=2, n_shots=0, template_ids=("add-equation-0",))
    graph = Graph.from_model(model)
    graph.in_graph[:] = True
    graph.meta["d_model"] = model.cfg.d_model * 2
    with pytest.raises(GraphFileError, match=rf"circuit 0 is for another model: it records d_model "
                                             rf"{2 * model.cfg.d_model} \(the model has {model.cfg.d_model}\)"):
        evaluate_circuits(model, [graph], data)


def test_an_empty_mean_pool_is_named_not_the_evaluated_prompts():
    """It used to say 'The dataset is empty: nothing to batch.', although the evaluated prompts were not empty."""
    model = tiny_model(style="gemma", n_layers=1, seed=0)
    data = make_dataset(model, n_prompts=4, n_shots=1, template_ids=["add-equation-0"], seed=1)
    pool = make_dataset(model, n_prompts=4, n_shots=0, template_ids=["add-equation-0"], seed=9)
    for empty, what in ((pool.select([]), r"a Dataset of 0 rows"),
                        (single_batch(pool).tokens[:0], r"token ids of shape \(0, \d+\)")):
        with pytest.raises(MeanPoolError, match=rf"means_from is empty \({what}\): a mean ablation averages .* "
                                                r"Pass a non-empty pool"):
            evaluate_circuit(model, _full(model), data, ablation="mean", means_from=empty)
    foreign = single_batch(pool).tokens.clone()
    foreign[0, -1] = model.cfg.d_vocab + 7
    with pytest.raises(InputError, match=r"means_from's tokens contain ids \[\d+\] outside this model's vocabulary"):
        evaluate_circuit(model, _full(model), data, ablation="mean", means_from=foreign)


def test_edge_patch_refuses_another_models_graph_naming_what_differs():
    """It used to fail with 'RuntimeError: The size of tensor a (40) must match the size of tensor b (27)'."""
    model = tiny_model(style="gpt2", n_layers=2)
    data = make_dataset(model, n_prompts=2, n_shots=0, template_ids=("add-equation-0",))
    other = Graph.from_model(tiny_model(style="gpt2", n_layers=3))
    other.in_graph[:] = True
    with pytest.raises(GraphFileError, match=r"edges \(a Graph\) is for another model: it records n_layers 3 "
                                             r"\(the model has 2\)"):
        edge_patch(model, other, data, options=SweepOptions(progress=False))
