"""Bad merge inputs fail early with an InputError that says what to do; saved-model folders are accepted.

Cross-cutting: the input contract of merging's entry points (merging.apply.merge, the method configs of
merging.methods, merging.state_dicts' sources and checks, merging.submodule's config)."""

import math

import pytest
import torch

from circuits.model_cache import save_model
from circuits.errors import InputError, ToolkitError
from tests.tiny_models import tiny_model
from merging.methods import ConsensusConfig, DellaConfig, TaskArithmeticConfig, TiesConfig
from merging import SubmoduleMergeConfig, merge
from merging.state_dicts import save_state_dict
from merging.state_dicts import NonFiniteMergeError


@pytest.fixture(scope="module")
def two(gpt2_model, perturb):
    return [perturb(gpt2_model, seed=1), perturb(gpt2_model, seed=2)]


def test_weights_summing_to_zero_with_normalization(gpt2_model, two):
    with pytest.raises(InputError, match=r"weights \[1.0, -1.0\] sum to ~0.*normalize=False"):
        merge("weight_average", gpt2_model, two, weights=[1, -1], progress=False)
    with pytest.raises(InputError, match="sum to ~0"):
        merge("task_arithmetic", gpt2_model, two, TaskArithmeticConfig(normalize=True), weights=[1, -1], progress=False)
    # without normalization a zero sum is a valid difference of task vectors
    merge("task_arithmetic", gpt2_model, two, weights=[1, -1], progress=False)


def test_nan_weights_and_nan_lambda(gpt2_model, two):
    with pytest.raises(InputError, match="weights must be finite"):
        merge("ties", gpt2_model, two, weights=[1.0, math.nan], progress=False)
    with pytest.raises(InputError, match="TaskArithmeticConfig.lam is nan; give a finite number"):
        TaskArithmeticConfig(lam=math.nan)
    with pytest.raises(InputError, match="ConsensusConfig.lam is inf"):
        ConsensusConfig(lam=math.inf)
    with pytest.raises(InputError, match="one weight per expert"):
        merge("ties", gpt2_model, two, weights=[1.0], progress=False)


@pytest.mark.parametrize("density", [0.0, -0.2, 1.5, math.nan, (0.5, 1.2)])
def test_density_outside_unit_interval(density):
    with pytest.raises(InputError, match=r"density"):
        TiesConfig(density=density)


def test_della_epsilon_and_per_model_length(gpt2_model, two):
    with pytest.raises(InputError, match=r"density ± epsilon inside \(0, 1\)"):
        merge("della", gpt2_model, two, DellaConfig(density=0.9, epsilon=0.15), progress=False)
    with pytest.raises(InputError, match="density has 3 values for 2 experts"):
        merge("ties", gpt2_model, two, TiesConfig(density=(0.2, 0.3, 0.4)), progress=False)


def test_consensus_k_larger_than_the_number_of_experts(gpt2_model, two):
    with pytest.raises(InputError, match=r"k=3 but only 2 experts.*Use k <= 2"):
        merge("consensus_ta", gpt2_model, two, ConsensusConfig(k=3), progress=False)


def test_consensus_negative_tall_lambda_is_refused():
    with pytest.raises(InputError, match=r"ConsensusConfig\.tall_lambda=-1 is negative; TALL's λ_t weighs"):
        ConsensusConfig(tall_lambda=-1)
    with pytest.raises(InputError, match=r"ConsensusConfig\.tall_lambda=-0\.2 is negative"):
        ConsensusConfig(tall_lambda=(0.4, -0.2))
    assert ConsensusConfig(tall_lambda=0.0).tall_lambda == 0.0  # λ_t = 0: every mask selects every entry


@pytest.mark.parametrize("kwargs, match", [
    ({"ridge": math.nan}, "ridge=nan"),
    ({"ridge": -1e-3}, "ridge=-0.001"),
    ({"n_samples": 0}, "n_samples >= 1"),
])
def test_submodule_config_rejects_bad_numbers(kwargs, match):
    with pytest.raises(InputError, match=match):
        SubmoduleMergeConfig(**kwargs)


def test_saved_model_folder_is_an_expert(gpt2_model, two, tmp_path):
    model = tiny_model(style="gpt2", seed=3)
    model.load_state_dict(two[0])
    folder = save_model(model, tmp_path / "expert")
    from_folder = merge("task_arithmetic", gpt2_model, [folder, two[1]], progress=False)
    from_dict = merge("task_arithmetic", gpt2_model, two, progress=False)
    assert all(torch.equal(from_folder[k], from_dict[k]) for k in from_dict)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="expert 0: folder .*empty has no model.safetensors.*circuits.save_model"):
        merge("task_arithmetic", gpt2_model, [tmp_path / "empty"], progress=False)


def test_garbage_safetensors_names_the_file(gpt2_model, tmp_path):
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(InputError, match=r"expert 0: .*broken\.safetensors is not a readable safetensors file"):
        merge("ties", gpt2_model, [bad], progress=False)
    with pytest.raises(InputError, match="no safetensors file or saved-model folder"):
        merge("ties", gpt2_model, [tmp_path / "missing.safetensors"], progress=False)


def test_merged_tensors_are_checked_finite(tmp_path):
    base = {"w": torch.ones(4, 3, dtype=torch.float16)}
    expert = {"w": torch.full((4, 3), 2.0, dtype=torch.float16)}
    with pytest.raises(NonFiniteMergeError, match=r"task_arithmetic produced 12 NaN/Inf values in w.*smaller lam"):
        merge("task_arithmetic", base, [expert], TaskArithmeticConfig(lam=1e5), progress=False)
    assert issubclass(NonFiniteMergeError, ToolkitError)
    path = save_state_dict(base, tmp_path / "b.safetensors")  # the same inputs from a file merge fine at λ=1
    assert torch.equal(merge("task_arithmetic", path, [expert], progress=False)["w"], expert["w"])


def test_tensors_no_expert_changed_are_the_base(gpt2_model, perturb):
    experts = [perturb(gpt2_model, seed=1, only="blocks.0."), perturb(gpt2_model, seed=2, only="blocks.0.")]
    base = gpt2_model.state_dict()
    for method in ("weight_average", "karcher", "iso_c", "ties"):
        merged = merge(method, gpt2_model, experts, progress=False)
        assert torch.equal(merged["embed.W_E"], base["embed.W_E"]) and torch.equal(merged["blocks.1.mlp.W_in"],
                                                                                    base["blocks.1.mlp.W_in"])
        assert not torch.equal(merged["blocks.0.mlp.W_in"], base["blocks.0.mlp.W_in"]), method


def test_a_string_where_a_number_belongs_is_refused_not_read_digit_by_digit():
    with pytest.raises(InputError, match=r"ConsensusConfig\.tall_lambda is the string '0\.4'; give a number"):
        ConsensusConfig(tall_lambda="0.4")


def test_a_bool_where_a_number_belongs_is_refused_not_read_as_1():
    with pytest.raises(InputError, match=r"^ConsensusConfig\.k is True, a bool; give a number \(e\.g\. 2\)\.$"):
        ConsensusConfig(k=True)
    with pytest.raises(InputError,
                       match=r"^TaskArithmeticConfig\.lam is True, a bool; give a number \(e\.g\. 1\.0\)\.$"):
        TaskArithmeticConfig(lam=True)
    with pytest.raises(InputError, match=r"^TiesConfig\.density is False, a bool"):
        TiesConfig(density=False)


def test_a_string_inside_per_expert_values_is_refused_before_the_merge(gpt2_model, two):
    with pytest.raises(InputError, match=r"^ConsensusConfig\.tall_lambda\[1\] is the string 'x'; give a number "
                                         r"\(e\.g\. 0\.4\)\.$"):
        merge("consensus_ta", gpt2_model, two, ConsensusConfig(tall_lambda=(0.4, "x")), progress=False)
    with pytest.raises(InputError, match=r"^TiesConfig\.density\[0\] is True, a bool"):
        TiesConfig(density=(True, 0.5))
