"""Source checks (architecture, keys, dtype, NaN/Inf, processed weights), task vectors and safetensors I/O."""

import math
import os

import pytest
import torch

from circuits.errors import InputError
from tests.damaged_files import change_a_tensor, forge_safetensors_header
from tests.tiny_models import tiny_model
from merging.state_dicts import StateDictSource, load_state_dict, save_state_dict
from merging.methods import TaskArithmeticConfig
from merging import merge, task_vector
from merging.primitives import combine
from merging.state_dicts import as_sources, check_compatible, is_buffer


def apply_task_vectors(base, task_vectors, coefficients):
    """``θ0 + Σ_i c_i τ_i`` for every parameter, buffers copied from the base: the inverse of ``task_vector``."""
    b = StateDictSource(base, "base")
    return {k: b.get(k) if is_buffer(k) else combine(b.get(k), [tv[k] for tv in task_vectors], list(coefficients))
            for k in b.keys()}


def check(base, experts):
    b, es = as_sources(base, experts)
    return check_compatible(b, es)


def test_task_vector_skips_buffers_and_roundtrips(perturb, gpt2_model):
    expert = perturb(gpt2_model)
    tv = task_vector(gpt2_model, expert)
    assert not any(k.endswith(("IGNORE", "mask")) for k in tv)
    assert torch.equal(tv["blocks.0.attn.W_Q"], expert["blocks.0.attn.W_Q"] - gpt2_model.state_dict()["blocks.0.attn.W_Q"])
    back = apply_task_vectors(gpt2_model, [tv], [1.0])
    assert torch.allclose(back["blocks.1.mlp.W_in"], expert["blocks.1.mlp.W_in"], atol=1e-6)
    assert torch.equal(back["blocks.0.attn.IGNORE"], gpt2_model.state_dict()["blocks.0.attn.IGNORE"])


def test_different_architecture_is_rejected(gpt2_model):
    other = tiny_model(style="gpt2", n_heads=2, d_head=16).state_dict()
    with pytest.raises(ValueError, match="expert 0 has a different architecture.*blocks.0.attn.W_Q"):
        check(gpt2_model, [other])
    with pytest.raises(ValueError, match="expert 0 does not have the base's parameters"):
        check(gpt2_model, [tiny_model(style="gemma").state_dict()])


def test_missing_and_extra_keys_are_rejected(perturb, gpt2_model):
    missing = perturb(gpt2_model)
    del missing["blocks.1.mlp.b_in"]
    with pytest.raises(ValueError, match=r"expert 1 .*missing 1 keys.*blocks\.1\.mlp\.b_in"):
        check(gpt2_model, [perturb(gpt2_model), missing])
    extra = perturb(gpt2_model)
    extra["blocks.0.attn.W_extra"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"extra 1 keys.*W_extra"):
        check(gpt2_model, [extra])


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_nan_and_inf_are_rejected(perturb, gpt2_model, value):
    bad = perturb(gpt2_model)
    bad["blocks.1.mlp.W_out"][0, 0] = value
    with pytest.raises(ValueError, match=r"expert 0: blocks\.1\.mlp\.W_out has 1 NaN/Inf"):
        merge("task_arithmetic", gpt2_model, [bad], progress=False)


def test_buffers_with_inf_are_not_checked(perturb, gpt2_model):
    sd = gpt2_model.state_dict()
    assert torch.isinf(sd["blocks.0.attn.IGNORE"]).all()
    keys = check(gpt2_model, [perturb(gpt2_model)])
    assert "blocks.0.attn.IGNORE" not in keys


def test_dtype_mismatch_is_rejected(perturb, gpt2_model):
    half = {k: v.half() if v.is_floating_point() else v for k, v in perturb(gpt2_model).items()}
    with pytest.raises(ValueError, match="dtype torch.float16.*Cast all models"):
        check(gpt2_model, [half])


def test_processed_models_are_rejected():
    folded = tiny_model(style="gpt2")
    folded.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    with pytest.raises(ValueError, match="base has processed weights.*LNPre.*from_pretrained_no_processing"):
        check(folded, [folded.state_dict()])
    base = tiny_model(style="gpt2")
    with pytest.raises(ValueError, match="expert 0 has processed weights.*centred writing weights"):
        check(base, [folded.state_dict()])
    only_folded = tiny_model(style="gpt2")
    only_folded.process_weights_(fold_ln=True, center_writing_weights=False, center_unembed=False)
    with pytest.raises(ValueError, match=r"expert 0 .*missing .*ln1\.w.*looks processed \(folded LayerNorm\)"):
        check(base, [only_folded.state_dict()])


def test_centred_writing_weights_are_rejected(perturb, gpt2_model):
    centred = perturb(gpt2_model)
    for key in ("blocks.0.attn.W_O", "blocks.0.mlp.W_out"):
        centred[key] = centred[key] - centred[key].mean(-1, keepdim=True)
    with pytest.raises(ValueError, match="expert 0 has processed weights.*centred writing weights"):
        check(gpt2_model, [centred])


def test_no_experts_and_bad_sources(perturb, gpt2_model):
    with pytest.raises(ValueError, match="No experts"):
        merge("ties", gpt2_model, [], progress=False)
    with pytest.raises(InputError, match="expected a state dict"):
        StateDictSource(42, "expert 0")
    with pytest.raises(ValueError, match="Unknown merge method 'foo'"):
        merge("foo", gpt2_model, [perturb(gpt2_model)], progress=False)
    with pytest.raises(InputError, match="ties expects a TiesConfig"):
        merge("ties", gpt2_model, [perturb(gpt2_model)], TaskArithmeticConfig(), progress=False)


def test_lazy_safetensors_sources_match_in_memory(perturb, tmp_path, gemma_model):
    experts = [perturb(gemma_model, seed=1), perturb(gemma_model, seed=2)]
    base_path = save_state_dict(gemma_model.state_dict(), tmp_path / "base.safetensors")
    paths = [save_state_dict(e, tmp_path / f"e{i}.safetensors") for i, e in enumerate(experts)]
    lazy = merge("task_arithmetic", base_path, paths, TaskArithmeticConfig(lam=0.5), progress=False)
    eager = merge("task_arithmetic", gemma_model, experts, TaskArithmeticConfig(lam=0.5), progress=False)
    assert lazy.keys() == eager.keys()
    assert all(torch.equal(lazy[k], eager[k]) for k in eager)
    src = StateDictSource(paths[0], "expert 0")
    assert src.shape("blocks.0.attn.W_Q") == tuple(gemma_model.blocks[0].attn.W_Q.shape)


def test_save_is_atomic_and_roundtrips(tmp_path):
    path = tmp_path / "sub" / "merged.safetensors"
    save_state_dict({"a": torch.arange(6.0).view(2, 3)}, path, metadata={"method": "ties"})
    assert torch.equal(load_state_dict(path)["a"], torch.arange(6.0).view(2, 3))
    with pytest.raises(TypeError, match=r"state_dict\['a'\] is a str, not a tensor"):
        save_state_dict({"a": "not a tensor"}, path, overwrite=True)  # fails before replacing
    assert torch.equal(load_state_dict(path)["a"], torch.arange(6.0).view(2, 3))
    assert os.listdir(path.parent) == ["merged.safetensors"]  # no temp file left behind


def test_an_existing_file_is_replaced_only_when_asked(tmp_path):
    from circuits.atomic_files import DestinationExistsError

    path = tmp_path / "weights.safetensors"
    path.write_bytes(b"someone else's file")
    with pytest.raises(DestinationExistsError, match="already exists; pass overwrite=True"):
        save_state_dict({"a": torch.ones(2)}, path)
    assert path.read_bytes() == b"someone else's file"
    save_state_dict({"a": torch.ones(2)}, path, overwrite=True)
    assert torch.equal(load_state_dict(path)["a"], torch.ones(2))


def test_a_changed_expert_folder_is_refused_as_load_model_refuses_it(perturb, gpt2_model, tmp_path):
    """A tensor changed in a saved expert folder was merged as it was; load_model refuses the same folder."""
    from circuits.loading import load_model, save_model
    from circuits.model_cache import CorruptModelDirError

    expert = tiny_model(style="gpt2", seed=0)
    expert.load_state_dict(perturb(gpt2_model))
    folder = save_model(expert, tmp_path / "expert")
    merge("task_arithmetic", gpt2_model, [folder], progress=False)  # intact: merges
    change_a_tensor(folder / "model.safetensors")
    message = r"The model directory .*expert is not intact: model\.safetensors has the right size but a different sha256"
    with pytest.raises(CorruptModelDirError, match=message):
        load_model(folder, device="cpu")
    with pytest.raises(CorruptModelDirError, match=message):  # the same check, from the one shared reader
        merge("task_arithmetic", gpt2_model, [folder], progress=False)


def test_forged_state_dict_headers_name_the_file(tmp_path):
    """load_state_dict raised safetensors' own SafetensorError, naming no file, on a forged header."""
    path = save_state_dict({"a": torch.ones(2, 3), "b": torch.zeros(4)}, tmp_path / "forged.safetensors")
    forge_safetensors_header(path)
    for read in (load_state_dict, lambda p: merge("task_arithmetic", {"a": torch.ones(2, 3), "b": torch.zeros(4)}, [p],
                                                  progress=False)):
        with pytest.raises(InputError, match=r"forged\.safetensors is not a readable safetensors file \(.*\)\. "
                                             r"Re-save it with merging\.state_dicts\.save_state_dict or circuits\.save_model\."):
            read(path)


def test_a_value_that_is_not_a_tensor_is_refused_by_key(tmp_path):
    from circuits.errors import InputTypeError

    path = tmp_path / "sub" / "w.safetensors"
    with pytest.raises(InputTypeError, match=r"^state_dict\['w'\] is a list, not a tensor: save_state_dict writes "
                                             r"torch tensors only; convert it \(e\.g\. torch\.as_tensor\(value\)\) "
                                             r"or leave the key out\.$"):
        save_state_dict({"a": torch.ones(2), "w": [1, 2]}, path)
    assert not path.parent.exists()


def test_tensors_sharing_memory_are_saved_as_independent_copies(tmp_path):
    """Tied weights and views of another entry: safetensors refuses shared memory; each is saved as its own copy."""
    t = torch.arange(6.0)
    tied = torch.nn.Linear(3, 2).weight
    sd = {"a": t, "b": t[:2], "c": t[3:], "tied_in": tied, "tied_out": tied, "t_view": t.view(2, 3).T}
    path = save_state_dict(sd, tmp_path / "shared.safetensors")
    loaded = load_state_dict(path)
    assert loaded.keys() == sd.keys()
    for k, v in sd.items():
        assert torch.equal(loaded[k], v.detach()), k
    assert loaded["b"].untyped_storage().data_ptr() != loaded["a"].untyped_storage().data_ptr()
    assert torch.equal(t, torch.arange(6.0))  # the caller's tensors are untouched
