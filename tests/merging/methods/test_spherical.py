"""merging.methods.spherical: slerp, nuslerp, multislerp and nearswap equal mergekit 0.1.5's own functions per tensor.

mergekit is called through its public method objects (``registry.get(name)([TensorGroup], parameters=...)``),
on random tensors of several shapes and on the edge cases each method guards: nearly colinear and opposite
vectors (the straight-line fallbacks), zero tensors, equal inputs.
"""

import pytest
import torch

from circuits.errors import InputError
from merging import merge
from merging.methods import MultiSlerpConfig, NearswapConfig, NuSlerpConfig, SlerpConfig
from merging.methods.spherical import multislerp, nearswap, nuslerp, slerp
from tests.merging.methods.mergekit_reference import SHAPES, close, mergekit, randn


def pairs(shape):
    """(name, θ0, θ1): random, nearly colinear, either side of the straight-line threshold, exactly colinear, opposite, nearly opposite, zeros, a zero side."""
    a, b = randn(shape, 0), randn(shape, 1)
    yield "random", a, b
    yield "near-colinear", a, 2 * a + 1e-4 * b
    orth = b - (b * a).sum() / (a * a).sum() * a
    tilted = a + 0.0245 * a.norm() / orth.norm() * orth  # cos = 0.9997: just past SLERP's 0.9995 line
    yield "past-the-threshold", a, tilted
    yield "opposite-past-the-threshold", a, -tilted
    yield "short-of-the-threshold", a, a + 0.04 * a.norm() / orth.norm() * orth  # cos = 0.9992
    yield "colinear", a, 3 * a
    yield "opposite", a, -a
    yield "near-opposite", a, -a + 1e-4 * b
    yield "zeros", torch.zeros(shape), torch.zeros(shape)
    yield "zero-base", torch.zeros(shape), b


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("t", [0.0, 0.3, 0.5, 1.0, 1.4])
def test_slerp_and_nearswap_equal_mergekit(shape, t):
    for case, v0, v1 in pairs(shape):
        close(slerp(v0, [v1], SlerpConfig(t=t)), mergekit("slerp", [v0, v1], {"t": t}))
        close(nearswap(v0, [v1], NearswapConfig(t=t)), mergekit("nearswap", [v0, v1], {"t": t}))


def test_slerp_keeps_the_norm_a_straight_line_loses():
    v0, v1 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    out = slerp(v0, [v1], SlerpConfig(t=0.5))
    close(out, torch.tensor([2**-0.5, 2**-0.5]))  # on the unit circle, where the average has norm 0.71


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("weights", [[1.0, 1.0], [0.3, 0.9], [1.0, -1.0]])
@pytest.mark.parametrize("row_wise, flatten", [(False, True), (True, False), (False, False)])
def test_nuslerp_equals_mergekit(shape, weights, row_wise, flatten):
    config = dict(nuslerp_row_wise=row_wise, nuslerp_flatten=flatten)
    params = {"weight": weights, **config}
    base = randn(shape, 2)
    for case, v0, v1 in pairs(shape):
        e0, e1 = base + v0, base + v1
        close(nuslerp(base, [e0, e1], NuSlerpConfig(**config), weights=weights),
              mergekit("nuslerp", [base, e0, e1], params))
        close(nuslerp(base, [v0, v1], NuSlerpConfig(**config, use_base=False), weights=weights),
              mergekit("nuslerp", [v0, v1], params, with_base=False))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("weights", [[1.0], [1.0, 1.0], [0.3, 0.9], [0.5, 1.0, 2.0], [1.0, -0.4, 0.7, 0.2]])
@pytest.mark.parametrize("normalize_weights, eps", [(True, 1e-8), (False, 1e-8), (True, 1e-3)])
def test_multislerp_equals_mergekit(shape, weights, normalize_weights, eps):
    config = dict(normalize_weights=normalize_weights, eps=eps)
    params = {"weight": weights, **config}
    base = randn(shape, 3)
    experts = [randn(shape, 10 + i) for i in range(len(weights))]
    close(multislerp(base, experts, MultiSlerpConfig(**config), weights=weights),
          mergekit("multislerp", [base, *experts], params))
    close(multislerp(base, experts, MultiSlerpConfig(**config, use_base=False), weights=weights),
          mergekit("multislerp", experts, params, with_base=False))


@pytest.mark.parametrize("shape", SHAPES)
def test_multislerp_edge_cases_equal_mergekit(shape):
    a = randn(shape, 4)
    base = randn(shape, 5)
    for experts in ([a, -a], [a, 2 * a], [a, 2 * a + 1e-4 * randn(shape, 6)]):
        close(multislerp(base, experts, MultiSlerpConfig(use_base=False), weights=[1.0, 1.0]),
              mergekit("multislerp", experts, {"weight": [1.0, 1.0]}, with_base=False))
    close(multislerp(base, [base, base], MultiSlerpConfig(), weights=[1.0, 2.0]),  # zero task vectors
          mergekit("multislerp", [base, base, base], {"weight": [1.0, 2.0]}))


def test_multislerp_refuses_balanced_opposite_vectors():
    a = randn((4, 5), 7)
    with pytest.raises(ValueError):
        mergekit("multislerp", [a, -a, a, -a], {"weight": [1.0] * 4}, with_base=False)
    with pytest.raises(InputError, match="multislerp: the weighted mean direction of the 4 models is zero"):
        multislerp(a, [a, -a, a, -a], MultiSlerpConfig(use_base=False), weights=[1.0] * 4)


def test_merge_runs_the_registry_records():
    base = {"w": randn((3, 4), 8)}
    expert = {"w": randn((3, 4), 9)}
    other = {"w": randn((3, 4), 10)}
    close(merge("slerp", base, [expert], SlerpConfig(t=0.3), progress=False)["w"],
          mergekit("slerp", [base["w"], expert["w"]], {"t": 0.3}))
    close(merge("nearswap", base, [expert], NearswapConfig(t=0.1), progress=False)["w"],
          mergekit("nearswap", [base["w"], expert["w"]], {"t": 0.1}))
    close(merge("nuslerp", base, [expert, other], NuSlerpConfig(), weights=[1.0, 3.0], progress=False)["w"],
          mergekit("nuslerp", [base["w"], expert["w"], other["w"]], {"weight": [1.0, 3.0]}))
    close(merge("multislerp", base, [expert, other], MultiSlerpConfig(), progress=False)["w"],
          mergekit("multislerp", [base["w"], expert["w"], other["w"]], {"weight": [1.0, 1.0]}))


@pytest.mark.parametrize("method, config", [("slerp", SlerpConfig()), ("nearswap", NearswapConfig())])
def test_two_model_methods_refuse_more_experts(method, config):
    base = {"w": torch.zeros(2, 2)}
    with pytest.raises(InputError, match=f"{method} merges the base with exactly one other model, got 2 experts"):
        merge(method, base, [{"w": torch.ones(2, 2)}, {"w": -torch.ones(2, 2)}], config, progress=False)


def test_nuslerp_refuses_other_than_two_experts():
    with pytest.raises(InputError, match="nuslerp merges exactly two models .*got 3 experts"):
        nuslerp(torch.zeros(3), [torch.ones(3)] * 3, NuSlerpConfig())


def test_values_mergekit_acts_on_though_rarely_meant_are_kept_and_said():
    """slerp t outside [0, 1] extrapolates, nearswap t < 0 returns the base, multislerp eps < 0 and ramplus_tl
    alpha < 0 were accepted without a word: mergekit's behaviour is kept, with a warning."""
    from merging.methods.arcee import RamPlusConfig
    from merging.methods.config_checks import SurprisingValueWarning
    from merging.methods.spherical import MultiSlerpConfig, NearswapConfig, SlerpConfig

    for make, match in ((lambda: SlerpConfig(t=1.5), "slerp extrapolates"),
                        (lambda: NearswapConfig(t=-1.0), "the result is the base"),
                        (lambda: MultiSlerpConfig(eps=-1.0), "divisor"),
                        (lambda: RamPlusConfig(alpha=-1.0), "whatever their ratio")):
        with pytest.warns(SurprisingValueWarning, match=match):
            make()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SlerpConfig(t=0.3), NearswapConfig(t=0.1), MultiSlerpConfig(), RamPlusConfig()


def test_nuslerp_per_row_acts_on_transformerlens_layout_and_flattened_on_either():
    """W_Q is [n_heads, d_model, d_head] here and [n_heads * d_head, d_model] in the checkpoint mergekit reads: the
    flattened default is the same merge on either layout; the per-row and per-column modes are not (docs/methods.md
    gives the size)."""
    from tests.merging.methods.mergekit_reference import mergekit, randn

    from merging.methods.spherical import NuSlerpConfig, nuslerp

    H, d, dh = 4, 32, 8
    to_hf = lambda t: t.permute(0, 2, 1).reshape(H * dh, d)  # noqa: E731
    from_hf = lambda h: h.reshape(H, dh, d).permute(0, 2, 1)  # noqa: E731
    base = randn((H, d, dh), 0)
    a, b = base + 0.5 * randn((H, d, dh), 1), base + 0.5 * randn((H, d, dh), 2)
    gaps = {}
    for row_wise, flat in ((False, True), (True, False), (False, False)):
        ours = nuslerp(base, [a, b], NuSlerpConfig(nuslerp_row_wise=row_wise, nuslerp_flatten=flat), weights=[1.0, 1.0])
        theirs = from_hf(mergekit("nuslerp", [to_hf(base), to_hf(a), to_hf(b)],
                                  {"weight": [1.0, 1.0], "nuslerp_row_wise": row_wise, "nuslerp_flatten": flat}))
        gaps[(row_wise, flat)] = float((ours - theirs).abs().max() / (ours - base).abs().max())
    assert gaps[(False, True)] < 1e-5 and gaps[(True, False)] > 0.1 and gaps[(False, False)] > 0.1
