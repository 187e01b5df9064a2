"""Interchange interventions equal a plain reference: the residual swapped by hand, block by block."""

from __future__ import annotations

import pytest
import torch

from patching.variables.causal_models import causal_model, interchange_pairs, task_config
from circuits.end_logits import unembed_end
from circuits.errors import InputError
from circuits.graph import Graph
from circuits.nodes import MLP, Head
from circuits.tasks import make_dataset
from patching.variables.featurizers import RotatedSubspace, fit_and_select, random_subspace
from patching.variables.interchange import (
    Location, PairBatch, circuit_nodes, full_swap, iia_by_answer_length, iia_sweep, interchange_accuracy,
    intervened_answer_residuals, intervened_hits, location, node_locations, node_table, pair_batches, prepare,
    rank_locations,
)
from tests.tiny_models import tiny_model

STYLES = ["gpt2", "gemma"]


def digit_model(style: str):
    model = tiny_model(style=style, n_layers=2)
    digits = [model.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    with torch.no_grad():  # answers are digits, so some prompts are answered right
        model.unembed.b_U[digits] += 20.0
    return model


@pytest.fixture(scope="module", params=STYLES)
def setup(request):
    model = digit_model(request.param)
    causal = causal_model("+")
    data = make_dataset(model, task_config(causal, n_prompts=40, n_shots=1, seed=3))
    pairs = interchange_pairs(causal, data, [True] * len(data), "result", model, n_pairs=12)
    return model, data, pairs


def by_hand(model, tokens, layer: int, position: int, replacement=None, *, through_end: bool = False):
    """The final residual from calling the embedding and each block in turn; ``resid_post`` of ``layer`` at ``position``
    (and, ``through_end``, every later position) read as ``[batch, n, d]`` (returned second) and, given
    ``replacement`` of that shape, replaced."""
    x = model.embed(tokens)
    if model.cfg.positional_embedding_type == "standard":
        x = x + model.pos_embed(tokens)
    seen = None
    for index, block in enumerate(model.blocks):
        x = block(x)
        if index == layer:
            seen = x[:, position:None if through_end else position + 1].clone()
            if replacement is not None:
                x = torch.cat([x[:, :position], replacement.to(x.dtype), x[:, position + replacement.shape[1]:]], 1)
    return x, seen


@torch.no_grad()
def test_the_residual_swap_equals_the_blocks_run_by_hand(setup):
    model, data, pairs = setup
    batch = pair_batches(model, data, pairs, scoring="whole")[0]
    end = batch.prompt_length - 1
    for layer in range(model.cfg.n_layers):
        for position in (end - 3, end - 1, end):
            where = location("resid_post", layer, position)
            prepared = prepare(model, batch, [where])
            assert prepared.prefix > 0  # the cached-prefix path is what is compared
            resid, targets = intervened_answer_residuals(model, prepared, where)
            _, source_row = by_hand(model, batch.source, layer, position)
            expected, _ = by_hand(model, batch.base, layer, position, source_row)
            scored = batch.targets >= 0
            rows, offsets = scored.nonzero(as_tuple=True)
            expected_rows = expected[rows, end + offsets]
            torch.testing.assert_close(unembed_end(model, resid), unembed_end(model, expected_rows), atol=1e-4, rtol=1e-4)
            assert torch.equal(targets, batch.targets[scored])


@torch.no_grad()
def test_a_location_through_the_answer_equals_every_later_position_swapped_by_hand(setup):
    """The source is fed the base's answer tokens, and every position from the location's on takes its residual;
    at the last layer the intervened run then answers whatever that fed source run predicts."""
    model, data, pairs = setup
    batch = next(b for b in pair_batches(model, data, pairs, scoring="whole") if b.targets.shape[1] > 1)
    end = batch.prompt_length - 1
    fed_source = torch.cat([batch.source, batch.base[:, batch.prompt_length:]], 1)
    scored = batch.targets >= 0
    rows, offsets = scored.nonzero(as_tuple=True)
    for layer in range(model.cfg.n_layers):
        for position in (end - 1, end):
            where = location("resid_post", layer, position, through_answer=True)
            assert str(where).endswith("+answer")
            resid, targets = intervened_answer_residuals(model, prepare(model, batch, [where]), where)
            _, source_rows = by_hand(model, fed_source, layer, position, through_end=True)
            expected, _ = by_hand(model, batch.base, layer, position, source_rows, through_end=True)
            torch.testing.assert_close(unembed_end(model, resid), unembed_end(model, expected[rows, end + offsets]),
                                       atol=1e-4, rtol=1e-4)
    last = location("resid_post", model.cfg.n_layers - 1, end, through_answer=True)
    hits = intervened_hits(model, prepare(model, batch, [last]), last)[0]
    source_top1 = model(fed_source)[rows, end + offsets].argmax(-1)
    per_cell = torch.ones_like(scored)
    per_cell[scored] = source_top1 == batch.targets[scored]
    assert torch.equal(hits, per_cell.all(1).cpu())
    # the one-position location is not the span: it leaves the answer positions to the base run
    one = location("resid_post", model.cfg.n_layers - 1, end)
    assert one != last and str(one) + "+answer" == str(last)


@torch.no_grad()
def test_head_and_mlp_swaps_equal_a_plain_hooked_run(setup):
    """hook_z (one head) and mlp_out against one full forward of the base with the source's value put in by a hook."""
    model, data, pairs = setup
    batch = pair_batches(model, data, pairs, scoring="first")[0]
    end = batch.prompt_length - 1
    for where in node_locations([Head(0, 2), MLP(1), Head(1, 0)], end - 1):
        _, cache = model.run_with_cache(batch.source)
        source_rows = cache[where.hook][:, where.position]

        def put(act, *, hook):
            act = act.clone()
            if where.head is None:
                act[:, where.position] = source_rows
            else:
                act[:, where.position, where.head] = source_rows[:, where.head]
            return act

        expected = model.run_with_hooks(batch.base, fwd_hooks=[(where.hook, put)])[:, end]
        resid, _ = intervened_answer_residuals(model, prepare(model, batch, [where]), where)
        torch.testing.assert_close(unembed_end(model, resid), expected, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_full_swap_at_the_last_layer_and_end_scores_the_sources_own_answer(setup):
    """The last block's output at END is all the logits read, so the intervened run predicts what the source run
    predicts: IIA = the share of pairs whose source's top-1 first token is the counterfactual answer's first token."""
    model, data, pairs = setup
    batches = pair_batches(model, data, pairs, scoring="first")
    end = batches[0].prompt_length - 1
    estimate, hits = interchange_accuracy(model, batches, location("resid_post", model.cfg.n_layers - 1, end))
    source_top1 = torch.cat([model(b.source)[:, -1].argmax(-1) for b in batches]).cpu()
    expected = source_top1 == torch.tensor([p.answer_ids[0] for p in pairs])
    assert torch.equal(hits, expected)
    assert estimate.value == pytest.approx(float(expected.float().mean())) and estimate.n == len(pairs)


@torch.no_grad()
def test_iia_by_answer_length_splits_the_pairs_and_one_token_answers_follow_the_source(setup):
    """Split by the predicted answer's token count: the parts add up to the whole IIA, and at the last layer's END
    a one-token answer is right exactly when the source run's own top-1 token is that answer."""
    model, data, pairs = setup
    batches = pair_batches(model, data, pairs, scoring="whole")
    where = location("resid_post", model.cfg.n_layers - 1, batches[0].prompt_length - 1)
    split = iia_by_answer_length(model, batches, where)
    lengths = [len(p.answer_ids) for p in pairs]
    assert set(split) == set(lengths) and len(split) > 1  # the fixture has one- and two-token sums
    whole, _ = interchange_accuracy(model, batches, where)
    assert sum(e.n for e in split.values()) == whole.n == len(pairs)
    assert sum(e.value * e.n for e in split.values()) == pytest.approx(whole.value * whole.n)
    one_token = [p for p in pairs if len(p.answer_ids) == 1]
    source_top1 = [int(model(torch.tensor([data["tokens"][p.source]]))[0, -1].argmax()) for p in one_token]
    expected = [top == p.answer_ids[0] for top, p in zip(source_top1, one_token)]
    assert split[1].n == len(one_token) and split[1].value == pytest.approx(sum(expected) / len(expected))


@torch.no_grad()
def test_iia_by_answer_length_splits_given_hits_without_running_and_refuses_hits_of_other_batches(setup):
    """Hits already computed (a fitted featurizer's test_hits) are split as they are: the same split as running
    again, no forward at all (a model that raises if called), and hits of another size are refused."""
    model, data, pairs = setup
    batches = pair_batches(model, data, pairs, scoring="whole")
    where = location("resid_post", model.cfg.n_layers - 1, batches[0].prompt_length - 1)
    fitted = fit_and_select(model, "full", where, batches, batches, batches)
    assert fitted.test_hits is not None and fitted.test_hits.shape == (len(pairs),)

    class NoForward:
        def __getattr__(self, name):
            raise AssertionError(f"the model was used ({name}) although the hits were given")

    split = iia_by_answer_length(NoForward(), batches, where, hits=fitted.test_hits)
    rerun = iia_by_answer_length(model, batches, where)
    assert {n: (e.value, e.n) for n, e in split.items()} == {n: (e.value, e.n) for n, e in rerun.items()}
    with pytest.raises(InputError, match="pass the hits computed on the same batches"):
        iia_by_answer_length(model, batches, where, hits=fitted.test_hits[:-1])


@torch.no_grad()
def test_das_with_k_equal_to_the_width_is_the_full_swap(setup):
    model, data, pairs = setup
    batch = pair_batches(model, data, pairs)[0]
    where = location("resid_mid", 1, batch.prompt_length - 2)
    prepared = prepare(model, batch, [where])
    full, _ = intervened_answer_residuals(model, prepared, where, full_swap)
    rotated, _ = intervened_answer_residuals(model, prepared, where, RotatedSubspace(model.cfg.d_model, model.cfg.d_model))
    torch.testing.assert_close(rotated, full, atol=1e-4, rtol=1e-4)


def test_a_subspace_swap_changes_only_the_subspace_and_takes_the_sources_coordinates():
    width, k = 32, 5
    null = random_subspace(width, k, seed=1)
    q = null.basis()
    torch.testing.assert_close(q.T @ q, torch.eye(k), atol=1e-5, rtol=0)
    assert not torch.allclose(q, random_subspace(width, k, seed=2).basis())
    base, source = torch.randn(7, width), torch.randn(7, width)
    swapped = null(base, source)
    torch.testing.assert_close(swapped @ q, source @ q, atol=1e-5, rtol=0)  # the subspace is the source's
    outside = torch.eye(width) - q @ q.T
    torch.testing.assert_close(swapped @ outside, base @ outside, atol=1e-5, rtol=0)  # the rest is the base's
    torch.testing.assert_close(random_subspace(width, width)(base, source), source, atol=1e-5, rtol=0)


@torch.no_grad()
def test_the_sweep_scores_each_location_as_one_location_alone_and_leaves_no_hook(setup):
    model, data, pairs = setup
    batches = pair_batches(model, data, pairs, batch_size=5)
    end = batches[0].prompt_length - 1
    locations = [location("resid_pre", 0, end), location("resid_pre", 0, end - 2), location("z", 1, end - 2, head=3),
                 location("z", 1, end, head=0), location("mlp_out", 0, end)]
    swept = iia_sweep(model, batches, locations, memory_mb=0.01)  # one site per forward
    assert swept == iia_sweep(model, batches, locations)  # the sites of one hook stacked in one forward
    for where in locations:
        assert swept[where] == interchange_accuracy(model, batches, where)[0]
    assert not any(point.fwd_hooks or point.bwd_hooks for point in model.hook_dict.values())


@torch.no_grad()
def test_a_pruned_sweep_stops_only_locations_below_the_best_and_keeps_the_rest_exact():
    model = digit_model("gemma")
    causal = causal_model("+")
    data = make_dataset(model, task_config(causal, n_prompts=80, n_shots=1, seed=4))
    pairs = interchange_pairs(causal, data, [True] * len(data), "result", model, n_pairs=48)
    batches = [PairBatch(b.base, b.source, model(b.source)[:, -1].argmax(-1, keepdim=True), b.prompt_length)
               for b in pair_batches(model, data, pairs, scoring="first", batch_size=16)]  # target: the source's answer
    end = batches[0].prompt_length - 1
    last = location("resid_post", model.cfg.n_layers - 1, end)  # IIA 1 by construction: the best
    locations = [last] + [location(kind, layer, p) for kind in ("resid_pre", "mlp_out") for layer in range(2)
                          for p in (1, end - 1, end)]
    full = iia_sweep(model, batches, locations)
    pruned = iia_sweep(model, batches, locations, prune=True)
    n_pairs = sum(len(b) for b in batches)
    assert full[last].value == 1.0
    stopped = [w for w in locations if pruned[w].n < n_pairs]
    assert stopped and last not in stopped  # the sweep has locations far below the best: the test can tell
    assert all(pruned[w] == full[w] for w in locations if w not in stopped)
    for w in stopped:  # the unpruned sweep over the batches it ran: the same estimate, wholly below the best there
        ran = next(m for m in range(1, len(batches) + 1) if sum(len(b) for b in batches[:m]) == pruned[w].n)
        there = iia_sweep(model, batches[:ran], locations)
        assert there[w] == pruned[w]
        assert there[w].high < max(e.low for e in there.values())
    assert rank_locations(pruned)[0][1] == rank_locations(full)[0][1] == last


def test_bad_locations_are_refused_with_what_to_do(setup):
    model, data, pairs = setup
    batch = pair_batches(model, data, pairs)[0]
    with pytest.raises(InputError, match=r"Unknown hook 'blocks.0.hook_resid_postt': the model has no such hook point"):
        prepare(model, batch, [Location("blocks.0.hook_resid_postt", 3)])
    with pytest.raises(InputError, match=rf"Position {batch.prompt_length} of .* is out of range: the prompts have "
                                         rf"{batch.prompt_length} tokens"):
        prepare(model, batch, [location("resid_post", 0, batch.prompt_length)])
    with pytest.raises(InputError, match=r"a hook_z location needs a head in 0..3, got None"):
        prepare(model, batch, [location("z", 0, 3)])
    with pytest.raises(InputError, match=r"Unknown hook kind 'resid'"):
        location("resid", 0, 3)
    with pytest.raises(InputError, match=r"k = 33 is larger than the 32 dimensions of the location's activation"):
        RotatedSubspace(model.cfg.d_model, model.cfg.d_model + 1)
    assert not any(point.fwd_hooks for point in model.hook_dict.values())


def test_a_circuit_graph_gives_its_sending_nodes():
    model = tiny_model(n_layers=2)
    graph = Graph.from_model(model)
    graph.in_graph[:] = False
    layout = graph.layout
    graph.in_graph[layout.head_forward(0, 1), layout.logits_backward] = True
    graph.in_graph[layout.mlp_forward(1), layout.logits_backward] = True
    graph.in_graph[0, layout.mlp_backward(0)] = True  # the input sends, but is no node
    assert circuit_nodes(graph) == [Head(0, 1), MLP(1)]


@torch.no_grad()
def test_the_node_table_gives_each_node_its_share_of_the_best(setup):
    model, data, pairs = setup
    batches = pair_batches(model, data, pairs)
    end = batches[0].prompt_length - 1
    rows = node_table(model, {"result": batches}, [Head(1, 0), MLP(1)], {"end": end}, {"result": 0.5})
    assert [(r["node"], r["position"]) for r in rows] == [("L1H0", "end"), ("MLP1", "end")]
    for row, node in zip(rows, [Head(1, 0), MLP(1)]):
        alone = interchange_accuracy(model, batches, node_locations([node], end)[0])[0]
        assert row["iia"] == alone.to_dict() and row["share_of_best"] == pytest.approx(alone.value / 0.5)
    with pytest.raises(InputError, match="The circuit has no heads or MLPs to intervene on"):
        node_table(model, {"result": batches}, [], {"end": end}, {})


def test_the_chosen_location_is_the_earliest_the_data_cannot_tell_from_the_best():
    """A later layer that beats the carrying layer by validation noise (16 pairs) is not chosen: every location whose
    interval reaches the best one's lower bound ties, and the earliest of them comes first."""
    from circuits.stats import proportion
    from patching.variables.interchange import Location, rank_locations, within_best_interval

    def at(layer, hits, n=16):
        return Location(f"blocks.{layer}.hook_resid_post", 5), proportion([1] * hits + [0] * (n - hits))

    estimates = dict([at(9, 11), at(2, 10), at(0, 9), at(5, 1), at(12, 3)])  # 0.69, 0.62, 0.56, 0.06, 0.19
    ranked = rank_locations(estimates)
    assert [w.layer for _, w in ranked] == [0, 2, 9, 12, 5]
    assert [w.layer for w in within_best_interval(estimates)] == [0, 2, 9]
    # with enough pairs the intervals separate and the best is the best
    many = dict([at(9, 240, 256), at(2, 160, 256), at(0, 100, 256)])
    assert [w.layer for _, w in rank_locations(many)] == [9, 2, 0]
    with pytest.raises(InputError, match="No locations"):
        rank_locations({})
