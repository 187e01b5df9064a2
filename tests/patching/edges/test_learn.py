"""patching.edges.learn: the differentiable mask is circuit evaluation made continuous, its gradient is the
derivative of the model, the samplers have their papers' distributions, learned rankings are nested."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import select_top_n
from circuits.tasks import make_dataset
from patching.sweeps import inputs
from patching.edges.engine import edge_mode
from patching.edges.evaluate import evaluate_circuits
from patching.edges.learn import LearnConfig, _circuits_end, _loss, _prepare, learn_circuit
from patching.edges.mask_samplers import BETA, LEFT, RIGHT, UGS, EdgePruning, Matryoshka, TopN, soft_threshold
from patching.sweeps.metrics import get_metric, score_end
from tests.tiny_models import tiny_model

STYLES = [("gpt2", None), ("llama", 2), ("gemma", 1)]


def _setup(style, n_kv, dtype=torch.float32, n_prompts=6):
    model = tiny_model(style=style, n_layers=2, n_heads=4, n_key_value_heads=n_kv, seed=3)
    if dtype != torch.float32:
        model = model.to(dtype)
        model.cfg.dtype = dtype
    data = make_dataset(model, n_prompts=80, n_shots=1, seed=2)
    n = len(data[0]["tokens"])
    data = data.filter(lambda r: len(r["tokens"]) == n).select(range(n_prompts))
    return model, data


def _circuit_metric(model, data, keep: torch.Tensor, norm="frozen") -> torch.Tensor:
    """The answer logit of each circuit ``keep [C, F, R]`` on ``data`` ([C, B]) through the learning engine."""
    layout = GraphLayout.of(model)
    metric = get_metric("logit")
    with edge_mode(model):
        groups = inputs.prompt_groups(model, data)
        (batch,) = _prepare(model, groups, layout, norm, metric)
        end = _circuits_end(model, [batch], [len(keep)], keep, norm)
        C = keep.shape[0]
        return score_end(model, end, batch.group.answer_ids.repeat(C), None, metric).view(C, -1)


@pytest.mark.parametrize("style, n_kv", STYLES)
def test_ones_are_the_model_zeros_the_empty_circuit_and_binary_masks_evaluate_circuit(style, n_kv):
    model, data = _setup(style, n_kv)
    layout = GraphLayout.of(model)
    real = layout.real_edge_mask
    g = torch.Generator().manual_seed(0)
    random_circuit = real & (torch.rand(real.shape, generator=g) < 0.3)
    masks = torch.stack([real, torch.zeros_like(real), random_circuit])
    ours = _circuit_metric(model, data, masks.float())
    expected = torch.stack([e.per_prompt for e in evaluate_circuits(model, list(masks), data)]).to(ours.dtype)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)
    answers = torch.tensor([ids[0] for ids in data["answer_token_ids"]])[:, None]
    with torch.no_grad():
        full = model(torch.tensor(data["tokens"]))[:, -1].gather(-1, answers)[:, 0]
        empty = model(torch.tensor(data["cf_tokens"]))[:, -1].gather(-1, answers)[:, 0]
    torch.testing.assert_close(ours[0], full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours[1], empty, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("style, n_kv", STYLES)
@pytest.mark.parametrize("norm", ["frozen", "recompute"])
def test_mask_gradient_equals_finite_differences(style, n_kv, norm):
    model, data = _setup(style, n_kv, dtype=torch.float64, n_prompts=3)
    layout = GraphLayout.of(model)
    real = layout.real_edge_mask
    g = torch.Generator().manual_seed(1)
    base = torch.where(real, torch.rand(real.shape, generator=g, dtype=torch.float64), 0.0)
    keep = base[None].clone().requires_grad_(True)
    for p in model.parameters():
        p.requires_grad_(False)
    with torch.enable_grad():
        _circuit_metric(model, data, keep, norm).sum().backward()
    edges = real.nonzero()[torch.randperm(int(real.sum()), generator=g)[:6]]
    eps = 1e-5
    for f, b in edges.tolist():
        step = torch.zeros_like(base)
        step[f, b] = eps
        with torch.no_grad():
            up = _circuit_metric(model, data, (base + step)[None], norm).sum()
            down = _circuit_metric(model, data, (base - step)[None], norm).sum()
        numeric = float((up - down) / (2 * eps))
        assert keep.grad[0, f, b].item() == pytest.approx(numeric, rel=1e-5, abs=1e-7), (f, b)


def test_hard_concrete_gates_have_the_paper_distribution():
    layout = GraphLayout(n_layers=1, n_heads=1)
    cfg = LearnConfig(method="edge-pruning")
    method = EdgePruning(layout, cfg, None, "cpu", torch.Generator().manual_seed(0))
    log_alpha = 0.7
    method.param.data.fill_(log_alpha)
    z = method.masks(0, 40_000).flatten()
    p_zero = 1 / (1 + math.exp(-(BETA * math.log(-LEFT / RIGHT) - log_alpha)))
    p_one = 1 / (1 + math.exp(-(log_alpha - BETA * math.log((1 - LEFT) / (RIGHT - 1)))))
    assert float((z == 0).double().mean()) == pytest.approx(p_zero, abs=0.01)
    assert float((z == 1).double().mean()) == pytest.approx(p_one, abs=0.01)
    u = (torch.arange(1, 200_001, dtype=torch.float64) - 0.5) / 200_000  # the mean by quadrature over u
    s = torch.sigmoid((u.log() - (1 - u).log() + log_alpha) / BETA)
    assert float(z.detach().double().mean()) == pytest.approx(float((s * (RIGHT - LEFT) + LEFT).clamp(0, 1).mean()), abs=0.01)
    assert float(method.expected_fraction()) == pytest.approx(1 - p_zero, rel=1e-6)


def test_ugs_masks_are_bernoulli_outside_their_window_and_uniform_inside():
    layout = GraphLayout(n_layers=1, n_heads=1)
    method = UGS(layout, LearnConfig(method="ugs"), None, "cpu", torch.Generator().manual_seed(0))
    method.param.data.fill_(0.4)
    p = torch.sigmoid(torch.tensor(0.4)).item()
    m = method.masks(0, 50_000).detach().flatten()
    w = p * (1 - p)
    assert float((m == 1).double().mean()) == pytest.approx(p - w / 2, abs=0.01)
    assert float((m == 0).double().mean()) == pytest.approx(1 - p - w / 2, abs=0.01)
    inside = m[(m > 0) & (m < 1)]
    assert float(inside.mean()) == pytest.approx(0.5, abs=0.01) and len(inside) / len(m) == pytest.approx(w, abs=0.01)


def test_matryoshka_masks_are_soft_top_k_and_learned_rankings_are_nested():
    model, data = _setup("gpt2", None)
    layout = GraphLayout.of(model)
    cfg = LearnConfig(method="matryoshka", steps=10)
    method = Matryoshka(layout, cfg, None, "cpu", torch.Generator().manual_seed(0))
    method.param.data = torch.randn(method.n_edges, generator=torch.Generator().manual_seed(1))
    generator_state = method.generator.get_state()
    budgets = method.budgets(5)
    method.generator.set_state(generator_state)
    order = torch.argsort(method.param.detach(), descending=True)
    for step in (0, 9):
        method.generator.set_state(generator_state)
        masks = method.masks(step, 5).detach()
        for k, row in zip(budgets, masks):
            assert float(row.sum()) == pytest.approx(k, abs=1e-3)  # a soft top-k keeps k edges in total
            assert torch.equal(torch.argsort(row, descending=True, stable=True)[:k], order[:k])  # and ranks as s
    assert float(method.width(9)) == pytest.approx(cfg.final_temperature / cfg.temperature * float(method.width(0)))
    learned = learn_circuit(model, data, method="matryoshka", steps=4, batch_size=4, progress=False)
    sizes = [1, 5, 20, 60, layout.n_edges]
    for prune in (False, True):
        circuits = [select_top_n(learned.graph, n, prune=prune).in_graph for n in sizes]
        for small, large in zip(circuits, circuits[1:]):
            assert bool((small <= large).all())


def test_top_n_masks_are_the_hard_top_k_with_the_soft_top_k_gradient():
    model, _ = _setup("gpt2", None)
    layout = GraphLayout.of(model)
    cfg = LearnConfig(method="top-n", fractions=(0.05, 0.2, 0.5), samples=3)
    method = TopN(layout, cfg, None, "cpu", torch.Generator().manual_seed(0))
    method.param.data = torch.randn(method.n_edges, generator=torch.Generator().manual_seed(1))
    ks = [int(x * method.n_edges) for x in cfg.fractions]
    assert method.budgets(3) == ks and len(method.budgets(2)) == 2 and set(method.budgets(2)) <= set(ks)
    masks = method.masks(0, 3)
    order = torch.argsort(method.param.detach(), descending=True)
    for k, row in zip(ks, masks):
        values = row.detach()
        assert set(values.unique().tolist()) == {0.0, 1.0} and int(values.sum()) == k  # exactly the top-k circuit
        assert torch.equal(values.nonzero().flatten().sort().values, order[:k].sort().values)
    # the gradient is the soft top-k's: written here as its own sigmoid, not through the method
    weights = torch.randn(masks.shape, generator=torch.Generator().manual_seed(2))
    (masks * weights).sum().backward()
    s = method.param.detach().clone().requires_grad_(True)
    width = method.width(0)
    soft = torch.stack([torch.sigmoid((s - soft_threshold(s.detach(), k, width)) / width) for k in ks])
    (soft * weights).sum().backward()
    assert torch.allclose(method.param.grad, s.grad)


def test_the_faithfulness_penalty_is_zero_at_the_model_and_counts_over_and_undershoot_alike():
    model, data = _setup("gemma", 1)
    layout = GraphLayout.of(model)
    metric = get_metric("logit")
    with edge_mode(model):
        (batch,) = _prepare(model, inputs.prompt_groups(model, data), layout, "frozen", metric)
        full_end = _circuits_end(model, [batch], [1], layout.real_edge_mask[None].float(), "frozen")
        base, _ = _loss(model, batch, full_end, 1, "metric", metric, 1.0)
        penalised, _ = _loss(model, batch, full_end, 1, "metric", metric, 1.0, penalty=3.0)
        assert float(base) == pytest.approx(0.0, abs=1e-8) and float(penalised) == pytest.approx(0.0, abs=1e-5)
        empty_end = _circuits_end(model, [batch], [1], torch.zeros_like(layout.real_edge_mask)[None].float(), "frozen")
        base, _ = _loss(model, batch, empty_end, 1, "metric", metric, 1.0)
        penalised, _ = _loss(model, batch, empty_end, 1, "metric", metric, 1.0, penalty=2.0)
    gap = (batch.full_metric - batch.empty_metric).mean().abs()
    # |1 − f(∅)| = 1, times the gap. The tiny model's gap is ~4e-4 logits and the circuit's end and the batch's
    # empty metric come by different float32 paths, so the tolerance is absolute, far below the gap itself.
    assert float(penalised - base) == pytest.approx(2.0 * float(gap), rel=1e-3, abs=1e-6)


@pytest.mark.parametrize("method", ["edge-pruning", "ugs", "matryoshka", "top-n"])
def test_a_learned_circuit_is_closer_to_the_model_than_random_rankings_of_its_size(method):
    model, data = _setup("gemma", 1)
    layout = GraphLayout.of(model)
    real = layout.real_edge_mask
    learned = learn_circuit(model, data, method=method, steps=40, batch_size=6, lr=0.1, target_fraction=0.3,
                            min_fraction=0.1, fractions=(0.1, 0.3, 0.6), progress=False, seed=0)
    assert len(learned.losses) == 40 and learned.seconds_per_step > 0
    scores = learned.graph.scores
    assert torch.isfinite(scores[real]).all() and torch.isnan(scores[~real]).all()
    assert learned.graph.meta["method"] == f"learned:{method}"
    n = int(0.3 * layout.n_edges)
    g = torch.Generator().manual_seed(5)
    rankings = [scores] + [torch.where(real, torch.rand(real.shape, generator=g), torch.nan) for _ in range(4)]
    circuits = [select_top_n(Graph(layout, s), n, prune=False).in_graph for s in rankings]
    # the per-prompt distance to the model, in units of the model's distance to the empty circuit (a random tiny
    # model's mean metric barely moves between prompt and twin, so MIB's ratio of means is ill-conditioned here)
    full, empty, *values = [e.per_prompt for e in evaluate_circuits(model, [real, torch.zeros_like(real)] + circuits, data)]
    unit = (full - empty).pow(2).mean()
    errors = [float((v - full).pow(2).mean() / unit) for v in values]
    assert errors[0] < sum(errors[1:]) / len(errors[1:]), errors


def test_a_warm_start_gives_the_warm_ranking_at_step_zero():
    model, data = _setup("llama", 2)
    layout = GraphLayout.of(model)
    warm = torch.where(layout.real_edge_mask, torch.randn(layout.real_edge_mask.shape), torch.nan)
    method = Matryoshka(layout, LearnConfig(), warm, "cpu", torch.Generator().manual_seed(0))
    dense = torch.full(warm.shape, float("nan"))
    dense[layout.real_edge_mask] = method.scores()
    top = select_top_n(Graph(layout, dense), 30, prune=False).in_graph
    assert torch.equal(top, select_top_n(Graph(layout, warm), 30, prune=False).in_graph)


def test_restarts_average_the_standardised_scores_of_runs_with_their_own_seeds():
    model, data = _setup("gemma", 1)
    real = GraphLayout.of(model).real_edge_mask
    settings = dict(method="top-n", steps=3, batch_size=4, fractions=(0.1, 0.3), progress=False)
    averaged = learn_circuit(model, data, restarts=3, seed=2, **settings)
    singles = [learn_circuit(model, data, seed=2 * 1_000_003 + k, **settings).scores[real].double() for k in range(3)]
    # by hand: z-score each run over the real edges (numpy's sample std, as torch.std), average, shift to 0
    z = [((x - x.mean()) / x.std()).numpy() for x in singles]
    expected = sum(z) / 3
    got = averaged.scores[real].double().numpy()
    assert abs((got - (expected - expected.min()))).max() < 1e-5
    assert len(averaged.losses) == 9 and averaged.graph.meta["restarts"] == 3
    assert not torch.equal(singles[0], singles[1])  # the restarts did draw differently
    with pytest.raises(ValueError, match="restarts"):
        LearnConfig(restarts=0)


def test_twins_that_change_nothing_are_refused():
    model, data = _setup("gpt2", None)
    tokens = torch.tensor(data["tokens"])
    answers = torch.tensor([ids[0] for ids in data["answer_token_ids"]])
    with pytest.raises(ValueError, match="score the same"):
        learn_circuit(model, tokens, tokens.clone(), answer_ids=answers, steps=1, progress=False)


def test_bad_settings_are_refused_before_any_work():
    with pytest.raises(ValueError, match="Unknown learned-circuit method"):
        LearnConfig(method="magic")
    with pytest.raises(ValueError, match="target_fraction"):
        LearnConfig(target_fraction=0)
    with pytest.raises(ValueError, match="fractions"):
        LearnConfig(fractions=(0.1, 1.5))
    with pytest.raises(ValueError, match="faithfulness_penalty"):
        LearnConfig(faithfulness_penalty=-1.0)
    model, data = _setup("gpt2", None)
    with pytest.raises(ValueError, match="unexpected keyword"):
        learn_circuit(model, data, stepz=3)


@pytest.mark.parametrize("bad", ["all_nan", "one_inf"])
def test_a_warm_start_without_finite_scores_is_refused(bad):
    from circuits.errors import InputError
    from patching.edges.learn import learn_circuit

    model = tiny_model(n_layers=1)
    data = make_dataset(model, n_prompts=3, n_shots=0, template_ids=("add-equation-0",), seed=2)
    layout = GraphLayout.of(model)
    init = torch.full((layout.n_forward, layout.n_backward), torch.nan)
    if bad == "one_inf":
        init = torch.where(layout.real_edge_mask, torch.rand(init.shape), torch.nan)
        init[tuple(layout.real_edge_mask.nonzero()[0].tolist())] = torch.inf
    with pytest.raises(InputError, match="a warm start needs finite scores"):
        learn_circuit(model, data, init=init, steps=2)


def _embed_counter(model):
    """A permanent hook that counts the model's forwards (each runs the embedding once)."""
    calls = []
    model.add_hook("hook_embed", lambda act, hook: calls.append(1), is_permanent=True)
    return calls


@pytest.mark.parametrize("lengths, norm", [("one", "frozen"), ("one", "recompute"), ("mixed", "frozen")])
def test_runs_trained_together_equal_runs_trained_one_by_one(lengths, norm):
    from patching.edges.consensus import resample_rows
    from patching.edges.learn import learn_circuits

    model = tiny_model(style="gemma", n_layers=2, n_heads=4, seed=3)
    data = make_dataset(model, n_prompts=120, n_shots=1, seed=2)
    config = LearnConfig(method="top-n", steps=4, batch_size=4, samples=2, fractions=(0.05, 0.3), norm=norm,
                         faithfulness_penalty=1.0, progress=False)
    if lengths == "one":
        counts = [len(t) for t in data["tokens"]]
        data = data.filter(lambda r: len(r["tokens"]) == max(set(counts), key=counts.count))
        # each set holds twins that differ early and late (the twins of even rows change the first operand), so
        # every run splits its prompts at the same shared prefix, as a lone run does (the next test: another split)
        prompt_sets = [data.select(range(0, 12)), data.select(range(6, 18)),
                       data.select([2, 3, 5, 8, 11, 12, 15, 17])]
    else:  # prompts of several lengths: half-samples stratified by length, one stream of lengths for every run
        data = data.select(range(40))
        prompt_sets = [data.select(resample_rows([len(t) for t in data["tokens"]], "half", seed)) for seed in (1, 2, 3)]
        config = dataclasses.replace(config, length_seed=11)
    seeds = [5, 6, 7]
    calls = _embed_counter(model)
    together = learn_circuits(model, prompt_sets, seeds=seeds, config=config, together=True)
    n_together, calls[:] = len(calls), []
    alone = [learn_circuit(model, prompts, config=config, seed=seed) for prompts, seed in zip(prompt_sets, seeds)]
    n_alone = len(calls)
    model.reset_hooks(including_permanent=True)
    real = GraphLayout.of(model).real_edge_mask
    for a, b in zip(together, alone):
        assert (a.scores[real] - b.scores[real]).abs().max() < 1e-4  # Adam's step is lr x g / sqrt(v): rounding shows
        assert a.losses == pytest.approx(b.losses, rel=1e-4, abs=1e-6)
    assert not torch.equal(together[0].scores[real], together[1].scores[real])
    assert n_alone - n_together == 2 * config.steps  # every step one forward of the three runs' circuits, not three
    with pytest.raises(InputError, match="one seed per prompt set"):
        learn_circuits(model, prompt_sets, seeds=[1], config=config)


@pytest.mark.parametrize("norm", ["frozen", "recompute"])
def test_a_shorter_cached_prefix_runs_the_same_circuits(norm, one_length_prompts):
    """Runs trained together cut their prompts at the shortest shared prefix of any run: the circuits they run from
    there are the ones a lone run runs from its own, longer prefix."""
    model, data = one_length_prompts
    layout, metric = GraphLayout.of(model), get_metric("logit")
    groups = inputs.prompt_groups(model, data.select([1, 3, 5, 7]))  # twins that differ only late
    keep = (torch.rand((3, *layout.real_edge_mask.shape), generator=torch.Generator().manual_seed(0)) > 0.5).float()
    with edge_mode(model):
        (own,) = _prepare(model, groups, layout, norm, metric)
        (earlier,) = _prepare(model, groups, layout, norm, metric, starts={groups[0].tokens.shape[1]: own.start - 6})
        assert earlier.start == own.start - 6
        ends = [_circuits_end(model, [b], [3], keep, norm) for b in (own, earlier)]
    assert torch.allclose(ends[0], ends[1], atol=1e-4)
