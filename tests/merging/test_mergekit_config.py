"""A mergekit YAML runs on tiny TransformerLens models and equals mergekit's own functions tensor by tensor."""

import textwrap
import zlib

import pytest
import torch

from circuits.model_cache import save_model
from circuits.errors import InputError
from tests.tiny_models import tiny_model
from merging import load_mergekit_config
from merging.state_dicts import save_state_dict
from merging.methods import DellaConfig, TiesConfig
from merging.state_dicts import is_buffer

mk_registry = pytest.importorskip("mergekit.merge_methods.registry")
from mergekit.merge_methods.base import TensorGroup  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory, perturb):
    """A base .safetensors, expert ``add`` as a saved-model folder, experts ``mul`` and ``fr`` as .safetensors."""
    folder = tmp_path_factory.mktemp("mk")
    base = tiny_model(style="gpt2", seed=0)
    save_state_dict(base.state_dict(), folder / "base.safetensors")
    sds = {}
    for i, name in enumerate(("add", "mul", "fr")):
        sds[name] = perturb(base, seed=i + 1, scale=0.05)
        if name == "add":
            m = tiny_model(style="gpt2", seed=7)
            m.load_state_dict(sds[name])
            save_model(m, folder / name)
        else:
            save_state_dict(sds[name], folder / f"{name}.safetensors")
    return folder, base.state_dict(), sds


def write(folder, text, name="merge.yml"):
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def mergekit_tensor(method, base, experts, params, key=None, seed=None, with_base=True):
    tensors = [base, *experts] if with_base else list(experts)
    if seed is not None:  # the per-tensor seed merging.merge gives its generator
        torch.manual_seed((seed * 1_000_003 + zlib.crc32(key.encode())) % (2**63))
    (out,) = mk_registry.get(method)([TensorGroup.from_tensors(tensors, base_index=0 if with_base else None)],
                                     parameters=params)
    return out


YAMLS = {
    "ties": """\
        models:
          - model: add
            parameters: {weight: 0.6, density: 0.5}
          - model: mul.safetensors
            parameters: {weight: 0.4, density: 0.3}
          - model: fr.safetensors
            parameters: {weight: 0.8}
        base_model: base.safetensors
        merge_method: ties
        parameters: {density: 0.7, lambda: 0.9, int8_mask: true}
        dtype: float32
    """,
    "dare_ties": """\
        models:
          - model: base.safetensors
          - model: add
            parameters: {weight: 1.0, density: 0.4}
          - model: mul.safetensors
            parameters: {weight: 0.5, density: 0.6}
        base_model: base.safetensors
        merge_method: dare_ties
        parameters: {normalize: true}
    """,
    "della_linear": """\
        models:
          - model: add
            parameters: {weight: 1.0, density: 0.5, epsilon: 0.1}
          - model: fr.safetensors
            parameters: {weight: 0.7, density: 0.4}
        base_model: base.safetensors
        merge_method: della_linear
        parameters: {epsilon: 0.2, lambda: 1.1}
    """,
}
EXPECTED_PARAMS = {
    "ties": ({"weight": [0.6, 0.4, 0.8], "density": [0.5, 0.3, 0.7], "lambda": 0.9}, ["add", "mul", "fr"]),
    "dare_ties": ({"weight": [1.0, 0.5], "density": [0.4, 0.6], "normalize": True}, ["add", "mul"]),
    "della_linear": ({"weight": [1.0, 0.7], "density": [0.5, 0.4], "epsilon": [0.1, 0.2], "lambda": 1.1},
                     ["add", "fr"]),
}


@pytest.mark.parametrize("method", sorted(YAMLS))
def test_yaml_equals_mergekit_tensor_by_tensor(files, method):
    folder, base, sds = files
    plan = load_mergekit_config(write(folder, YAMLS[method], f"{method}.yml"))
    assert plan.method == method
    merged = plan.run(progress=False)
    params, names = EXPECTED_PARAMS[method]
    seed = 0 if method != "ties" else None
    for key, value in merged.items():
        if is_buffer(key):
            assert torch.equal(value, base[key])
            continue
        ref = mergekit_tensor(method, base[key], [sds[n][key] for n in names], params, key, seed)
        torch.testing.assert_close(value, ref, atol=1e-6, rtol=0, msg=key)
    target = tiny_model(style="gpt2", seed=4)
    target.load_state_dict(merged)  # strict: the merged state dict loads


def test_config_maps_parameters(files):
    folder, _, _ = files
    plan = load_mergekit_config(write(folder, YAMLS["ties"], "ties.yml"))
    assert plan.config == TiesConfig(density=(0.5, 0.3, 0.7), lam=0.9)
    assert plan.weights == [0.6, 0.4, 0.8] and plan.dtype == torch.float32
    della = load_mergekit_config(write(folder, YAMLS["della_linear"], "dl.yml"))
    assert isinstance(della.config, DellaConfig) and della.config.epsilon == (0.1, 0.2)


def test_linear_model_stock_and_karcher(files):
    folder, base, sds = files
    linear = load_mergekit_config(write(folder, """\
        models:
          - {model: add, parameters: {weight: 2.0}}
          - {model: mul.safetensors, parameters: {weight: 1.0}}
        merge_method: linear
        dtype: float64
        out_dtype: float32
    """, "linear.yml")).run(progress=False)
    stock = load_mergekit_config(write(folder, """\
        models: [{model: add}, {model: mul.safetensors}, {model: fr.safetensors}]
        base_model: base.safetensors
        merge_method: model_stock
        parameters: {filter_wise: true}
    """, "stock.yml")).run(progress=False)
    karcher = load_mergekit_config(write(folder, """\
        models: [{model: add}, {model: fr.safetensors}]
        base_model: base.safetensors
        merge_method: karcher
        parameters: {max_iter: 5}
    """, "karcher.yml")).run(progress=False)
    for key in (k for k in base if not is_buffer(k)):
        a, m, f = sds["add"][key], sds["mul"][key], sds["fr"][key]
        ref = mergekit_tensor("linear", None, [a.double(), m.double()], {"weight": [2.0, 1.0]}, with_base=False)
        torch.testing.assert_close(linear[key], ref.float(), atol=1e-6, rtol=0, msg=key)
        assert linear[key].dtype == torch.float32
        torch.testing.assert_close(stock[key], mergekit_tensor("model_stock", base[key], [a, m, f],
                                                               {"filter_wise": True}), atol=1e-6, rtol=0, msg=key)
        torch.testing.assert_close(karcher[key], mergekit_tensor("karcher", base[key], [a, f], {"max_iter": 5}),
                                   atol=1e-6, rtol=0, msg=key)


def test_spherical_methods_and_nearswap(files):
    """slerp and nearswap (base and one model), nuslerp and multislerp with and without a base, as mergekit."""
    folder, base, sds = files

    def run(text, name):
        return load_mergekit_config(write(folder, text, name)).run(progress=False)

    slerp = run("""\
        models: [{model: base.safetensors}, {model: add}]
        base_model: base.safetensors
        merge_method: slerp
        parameters: {t: 0.3}
    """, "slerp.yml")
    nearswap = run("""\
        models: [{model: mul.safetensors}]
        base_model: base.safetensors
        merge_method: nearswap
        parameters: {t: 0.01}
    """, "nearswap.yml")
    nuslerp = run("""\
        models: [{model: add, parameters: {weight: 0.4}}, {model: fr.safetensors, parameters: {weight: 1.2}}]
        base_model: base.safetensors
        merge_method: nuslerp
        parameters: {nuslerp_flatten: false, nuslerp_row_wise: true}
    """, "nuslerp.yml")
    multislerp = run("""\
        models:
          - {model: add, parameters: {weight: 1.0}}
          - {model: mul.safetensors, parameters: {weight: 0.5}}
          - {model: fr.safetensors, parameters: {weight: 2.0}}
        merge_method: multislerp
        parameters: {normalize_weights: false}
    """, "multislerp.yml")
    for key in (k for k in base if not is_buffer(k)):
        b, a, m, f = base[key], sds["add"][key], sds["mul"][key], sds["fr"][key]
        torch.testing.assert_close(slerp[key], mergekit_tensor("slerp", b, [a], {"t": 0.3}), atol=1e-6, rtol=0)
        torch.testing.assert_close(nearswap[key], mergekit_tensor("nearswap", b, [m], {"t": 0.01}), atol=1e-6, rtol=0)
        torch.testing.assert_close(nuslerp[key], mergekit_tensor(
            "nuslerp", b, [a, f], {"weight": [0.4, 1.2], "nuslerp_flatten": False, "nuslerp_row_wise": True}),
            atol=1e-6, rtol=0)
        torch.testing.assert_close(multislerp[key], mergekit_tensor(
            "multislerp", None, [a, m, f], {"weight": [1.0, 0.5, 2.0], "normalize_weights": False},
            with_base=False), atol=1e-6, rtol=0)
    plan = load_mergekit_config(write(folder, """\
        models: [{model: add, parameters: {weight: 1}}, {model: fr.safetensors, parameters: {weight: 1}}]
        merge_method: nuslerp
    """, "nuslerp-no-base.yml"))
    assert plan.config.use_base is False and plan.expert_names == ["add", "fr.safetensors"]


def test_arcee_ram_and_passthrough_equal_mergekit(files):
    """arcee_fusion (base and one model), ram and ramplus_tl (three), passthrough by models: and by a full-range
    slice, each as mergekit's own function on every tensor."""
    folder, base, sds = files

    def run(text, name):
        return load_mergekit_config(write(folder, text, name)).run(progress=False)

    fusion = run("""\
        models: [{model: add}]
        base_model: base.safetensors
        merge_method: arcee_fusion
    """, "arcee.yml")
    ram = run("""\
        models: [{model: add}, {model: mul.safetensors}, {model: fr.safetensors}]
        base_model: base.safetensors
        merge_method: ram
        parameters: {epsilon: 0.01}
    """, "ram.yml")
    ramplus = run("""\
        models: [{model: add}, {model: mul.safetensors}, {model: fr.safetensors}]
        base_model: base.safetensors
        merge_method: ramplus_tl
        parameters: {r: 0.5, alpha: 1.0, epsilon: 0.01}
    """, "ramplus.yml")
    scaled = run("""\
        models: [{model: mul.safetensors, parameters: {scale: 0.5}}]
        merge_method: passthrough
    """, "passthrough.yml")
    sliced = run("""\
        slices:
          - sources:
              - model: fr.safetensors
                layer_range: [0, 2]
        merge_method: passthrough
    """, "slices.yml")
    for key in (k for k in base if not is_buffer(k)):
        b, a, m, f = base[key], sds["add"][key], sds["mul"][key], sds["fr"][key]
        for ours, method, inputs, params, with_base in (
                (fusion, "arcee_fusion", [b, a], {}, True),
                (ram, "ram", [b, a, m, f], {"epsilon": 0.01}, True),
                (ramplus, "ramplus_tl", [b, a, m, f], {"r": 0.5, "alpha": 1.0, "epsilon": 0.01}, True),
                (scaled, "passthrough", [m], {"scale": [0.5]}, False),
                (sliced, "passthrough", [f], {"scale": [None]}, False)):
            expected = mergekit_tensor(method, inputs[0], inputs[1:], params, with_base=True) if with_base else \
                mergekit_tensor(method, None, inputs, params, with_base=False)
            torch.testing.assert_close(ours[key], expected, atol=1e-6, rtol=0, msg=f"{method} {key}")
    target = tiny_model(style="gpt2", seed=4)
    target.load_state_dict(sliced)  # strict: the full-range slice loads into the same architecture


@pytest.mark.parametrize("method", ["slerp", "nearswap", "ram"])
def test_int8_mask_is_refused_where_mergekit_does_not_declare_it(files, method):
    folder, _, _ = files
    t = "t: 0.5, " if method in ("slerp", "nearswap") else ""
    second = "" if t else ", {model: fr.safetensors}"
    path = write(folder, f"""\
        models: [{{model: mul.safetensors}}{second}]
        base_model: base.safetensors
        merge_method: {method}
        parameters: {{{t}int8_mask: true}}
    """, f"int8_{method}.yml")
    with pytest.raises(InputError, match="int8_mask"):
        load_mergekit_config(path).run()


def test_wudi_runs_from_a_yaml(files):
    from merging import merge
    from merging.methods import WudiConfig

    folder, base, sds = files
    plan = load_mergekit_config(write(folder, """\
        models: [{model: add}, {model: mul.safetensors}, {model: fr.safetensors}]
        base_model: base.safetensors
        merge_method: wudi
        parameters: {steps: 4, lr: 1.0e-3}
    """, "wudi.yml"))
    assert plan.method == "wudi" and plan.config == WudiConfig(steps=4, lr=1e-3)
    merged = plan.run(progress=False)
    expected = merge("wudi", base, [sds[n] for n in ("add", "mul", "fr")], WudiConfig(steps=4, lr=1e-3),
                     progress=False)
    for key, value in expected.items():
        torch.testing.assert_close(merged[key], value, atol=1e-6, rtol=0, msg=key)


def test_slerp_with_two_models_is_refused(files):
    folder, _, _ = files
    with pytest.raises(InputError, match=r"slerp merges at most 1 model\(s\) besides base_model, got 2"):
        load_mergekit_config(write(folder, """\
            models: [{model: add}, {model: fr.safetensors}]
            base_model: base.safetensors
            merge_method: slerp
            parameters: {t: 0.5}
        """, "slerp2.yml"))


@pytest.mark.parametrize("text, match", [
    ("models: [{model: add, parameters: {weight: 1}}]\nmerge_method: passthrough\n",
     "passthrough takes no per-model weight"),
    ("models: [{model: add}, {model: fr.safetensors}]\nmerge_method: passthrough\n",
     r"passthrough merges at most 1 model\(s\) besides base_model, got 2"),
    ("models: [{model: add}]\nmerge_method: frankenmerge\n", "merge_method 'frankenmerge' is not implemented here"),
    ("models: [{model: add}]\nbase_model: base.safetensors\nmerge_method: slerp\n",
     r"slerp requires parameters \['t'\] \(mergekit has no default for them\)"),
    ("models: [{model: add}]\nbase_model: base.safetensors\nmerge_method: nearswap\nparameters: {t: [[0, 1]]}\n",
     r"parameters.t\[0\]: a filtered entry is \{filter: <module name part>, value: <value or gradient>\}"),
    ("models: [{model: add}]\nbase_model: base.safetensors\nmerge_method: nearswap\nparameters: {t: []}\n",
     "parameters.t: an empty list"),
    ("models: [{model: add}]\nbase_model: base.safetensors\nmerge_method: nearswap\n"
     "parameters: {t: {filter: 3, value: 0.5}}\n", "filter must be a string"),
    ("models: [{model: mul.safetensors}]\nbase_model: base.safetensors\nmerge_method: slerp\n"
     "parameters: {t: [{filter: self_attn, value: 0.3}]}\n",
     "t has no value for tensor .* add an entry without a filter"),
    ("models: [{model: mul.safetensors}]\nbase_model: base.safetensors\nmerge_method: passthrough\n",
     "drop base_model"),  # the hint said "list the base among models", which passthrough refuses too
    ("models: [{model: add, parameters: {weight: 1}}]\nbase_model: base.safetensors\nmerge_method: ties\n"
     "parameters: {densty: 0.5}\n", "unknown parameter 'densty' for ties; accepted: .*'density'"),
    ("models: [{model: add, parameters: {weight: 1, dens: 0.5}}]\nbase_model: base.safetensors\n"
     "merge_method: ties\n", r"unknown per-model parameters \['dens'\]"),
    ("models: [{model: add}]\nbase_model: base.safetensors\nmerge_method: ties\n", "missing parameter 'weight'"),
    ("models: [{model: add, parameters: {weight: [0.1, 'x']}}]\nbase_model: base.safetensors\nmerge_method: ties\n",
     r"weight\[1\] is 'x' \(a str\): weight takes a number"),
    ("models: [{model: add, parameters: {weight: 1}}]\nmerge_method: ties\n", "ties needs base_model"),
    ("models: [{model: nowhere, parameters: {weight: 1}}]\nbase_model: base.safetensors\nmerge_method: ties\n",
     "cannot resolve model 'nowhere'"),
    ("modules: {}\nmerge_method: ties\n", r"unsupported keys \['modules'\]"),
    ("slices: []\nmerge_method: passthrough\n", r"slices must be a list of \{sources: \[...\]\} entries"),
    ("slices:\n  - sources: [{model: add, layer_range: [0, 1]}]\n  - sources: [{model: add, layer_range: [1, 2]}]\n"
     "merge_method: passthrough\n", "2 slices; stacking layer ranges changes the layer count"),
    ("slices:\n  - sources: [{model: add, layer_range: [0, 1]}]\nmerge_method: passthrough\n",
     r"source 'add': layer_range \[0, 1\], but the model has 2 layers; .* give layer_range: \[0, 2\]"),
    ("slices:\n  - sources: [{model: add, layer_range: [0, 2]}]\n    residual_weight: 0.5\nmerge_method: passthrough\n",
     r"slices\[0\]: \['residual_weight'\] not supported here"),
    ("models: [{model: add}]\nslices:\n  - sources: [{model: add, layer_range: [0, 2]}]\nmerge_method: passthrough\n",
     "give models or slices, not both"),
    ("models: [{model: add}, {model: fr.safetensors}]\nbase_model: base.safetensors\nmerge_method: sce\n"
     "dtype: float8\n", "dtype 'float8' is not one of"),
    ("models: [{model: add, parameters: {weight: 1}}, {model: fr.safetensors, parameters: {weight: 1}}]\n"
     "base_model: base.safetensors\nmerge_method: sce\n", "sce takes no per-model weight"),
])
def test_bad_configs_are_clear_errors(files, text, match):
    folder, _, _ = files
    with pytest.raises(InputError, match=match):
        load_mergekit_config(write(folder, text, "bad.yml"))


def test_models_mapping_overrides_paths(files, gpt2_model):
    folder, base, sds = files
    path = write(folder, """\
        models:
          - {model: expert-a, parameters: {weight: 1.0}}
          - {model: expert-b, parameters: {weight: 1.0}}
        base_model: the-base
        merge_method: task_arithmetic
        parameters: {normalize: true}
    """, "mapped.yml")
    merged = load_mergekit_config(path, models={"the-base": gpt2_model, "expert-a": sds["add"],
                                                "expert-b": sds["mul"]}).run(progress=False)
    key = "blocks.0.mlp.W_in"
    torch.testing.assert_close(merged[key], (sds["add"][key] + sds["mul"][key]) / 2)


def test_values_of_the_wrong_type_are_refused(files):
    folder, _, _ = files
    head = ("models: [{model: add, parameters: {weight: 1}}]\nbase_model: base.safetensors\n"
            "merge_method: ties\n")
    with pytest.raises(InputError, match=r"bad_bool\.yml: parameters\.normalize is 'no' \(a str\): normalize "
                                         r"takes true or false \(unquoted in YAML\)"):
        load_mergekit_config(write(folder, head + "parameters: {normalize: 'no'}\n", "bad_bool.yml"))
    with pytest.raises(InputError, match=r"model 'add' density is 'half' \(a str\): density takes a number"):
        load_mergekit_config(write(folder, "models: [{model: add, parameters: {weight: 1, density: half}}]\n"
                                           "base_model: base.safetensors\nmerge_method: ties\n", "bad_num.yml"))
    with pytest.raises(InputError, match=r"parameters\.max_iter is 2\.5 \(a float\): max_iter takes a whole number"):
        load_mergekit_config(write(folder, "models: [{model: add}]\nmerge_method: karcher\n"
                                           "parameters: {max_iter: 2.5}\n", "bad_int.yml"))
    with pytest.raises(InputError, match=r"parameters\.int8_mask is 'yes' \(a str\)"):
        load_mergekit_config(write(folder, head + "parameters: {int8_mask: 'yes'}\n", "bad_mask.yml"))
    # YAML 1.1 reads 1e-3 (no dot) as a string; a numeric string is read as the number, as mergekit does
    plan = load_mergekit_config(write(folder, head + "parameters: {lambda: 1e-3, normalize: no}\n", "ok.yml"))
    assert plan.config == TiesConfig(lam=0.001, normalize=False)


def test_duplicate_yaml_keys_are_refused(files):
    folder, _, _ = files
    text = """\
        models:
          - model: add
            parameters: {weight: 1, density: 0.5}
        base_model: base.safetensors
        merge_method: ties
        parameters:
          density: 0.2
          density: 0.7
    """
    with pytest.raises(InputError, match=r"dup\.yml: duplicate key 'density' \(lines 7 and 8\); YAML would keep "
                                         "only the last value"):
        load_mergekit_config(write(folder, text, "dup.yml"))
    with pytest.raises(InputError, match=r"dup_top\.yml: duplicate key 'merge_method' \(lines 3 and 4\)"):
        load_mergekit_config(write(folder, "models: [{model: add, parameters: {weight: 1}}]\nbase_model: "
                                           "base.safetensors\nmerge_method: ties\nmerge_method: dare_ties\n",
                                   "dup_top.yml"))
    # a YAML merge key (<<) may be overridden: that is no duplicate
    text = "models:\n  - model: add\n    parameters:\n      <<: {weight: 1.0, density: 0.5}\n      density: 0.3\n" \
           "base_model: base.safetensors\nmerge_method: ties\n"
    plan = load_mergekit_config(write(folder, text, "merge_key.yml"))
    assert plan.config.density == (0.3,) and plan.weights == [1.0]


def test_deeply_nested_yaml_is_a_clear_error(files):
    folder, _, _ = files
    deep = "models: " + "[" * 100_000 + "]" * 100_000 + "\nmerge_method: ties\n"
    with pytest.raises(InputError, match=r"deep\.yml: the YAML nests deeper than 32 levels \(line 1\)"):
        load_mergekit_config(write(folder, deep, "deep.yml"))


def test_a_binary_file_is_named_not_a_unicode_traceback(tmp_path):
    path = tmp_path / "bin.yml"
    path.write_bytes(b"\xff\xfe\x00merge_method: ties\x80\x81")
    with pytest.raises(InputError, match=r"bin\.yml is not a text file \(not UTF-8\)"):
        load_mergekit_config(path)


SLERP_CARD = """\
    slices:
      - sources:
          - model: add
            layer_range: [0, 2]
          - model: mul.safetensors
            layer_range: [0, 2]
    merge_method: slerp
    base_model: add
    parameters:
      t:
        - filter: self_attn
          value: [0, 0.4, 1]
        - filter: mlp
          value: [1, 0.6, 0]
        - value: 0.25
    dtype: float32
"""


def _mergekit_setting(tensor_name, setting, t):
    """mergekit 0.1.5's own resolution of a YAML parameter for one tensor (mergekit.config.evaluate_setting)."""
    from mergekit.config import ConditionalParameter, evaluate_setting

    if isinstance(setting, list) and setting and isinstance(setting[0], dict):
        setting = [ConditionalParameter(**entry) for entry in setting]
    return evaluate_setting(tensor_name, setting, t, validate=float)


def test_the_slerp_config_of_model_cards_equals_mergekit_tensor_by_tensor(files):
    """Gradients over the layers under filters on the module's name, with an unfiltered fallback: each tensor's t
    is mergekit's own resolution of the YAML (its evaluate_setting, on the Hugging Face name of the tensor and its
    layer position), and each merged tensor mergekit's slerp at that t."""
    import yaml

    from merging.lines import n_layers_of
    from merging.mergekit_settings import hf_name, layer_position

    folder, base, sds = files
    path = write(folder, SLERP_CARD, "slerp_card.yml")
    merged = load_mergekit_config(path).run(progress=False)
    setting = yaml.safe_load(textwrap.dedent(SLERP_CARD))["parameters"]["t"]
    keys = [k for k in base if not is_buffer(k)]
    n_layers = n_layers_of(keys)
    ts = set()
    for key in keys:
        t = _mergekit_setting(hf_name(key), setting, layer_position(key, n_layers))
        ts.add(round(t, 6))
        expected = mergekit_tensor("slerp", sds["add"][key], [sds["mul"][key]], {"t": t})
        torch.testing.assert_close(merged[key], expected, atol=1e-6, rtol=0, msg=key)
    assert ts == {0.0, 0.25, 1.0}  # two layers: both ends of each gradient, and the fallback


@pytest.mark.parametrize("setting", [[0, 0.5, 0.3, 0.7, 1], [1.0, 0.0], [0.25], [True, False, True],
                                     [{"filter": "mlp", "value": [0, 1]}, {"filter": "*", "value": 0.2}],
                                     [{"filter": "self_attn", "value": 0.9}]])
def test_a_setting_resolves_as_mergekit_resolves_it_at_every_layer_position(setting):
    """Interpolation between a gradient's points (and discrete picks for booleans), filters and their fallbacks,
    on the names of every kind of tensor, against mergekit's evaluate_setting."""
    from mergekit.config import ConditionalParameter, evaluate_setting

    from merging.mergekit_settings import hf_name, read_setting, resolved

    ours = read_setting(setting, lambda v, where: v, "t")
    theirs = [ConditionalParameter(**e) for e in setting] if isinstance(setting[0], dict) else setting
    validate = bool if isinstance(setting[0], bool) else float
    for key in ("blocks.3.attn.W_Q", "blocks.3.mlp.W_in", "blocks.0.ln1.w", "embed.W_E", "unembed.W_U"):
        for t in (0.0, 0.1, 0.25, 0.4, 0.5, 0.77, 0.9, 1.0):
            expected = evaluate_setting(hf_name(key), theirs, t, validate=validate)
            got = resolved([ours], hf_name(key), t)
            assert got == pytest.approx(expected) if expected is not None else got is None, (key, t)


def test_per_model_gradients_and_filtered_densities_equal_mergekit(files):
    """TIES with a per-model weight gradient and a global density given per module, one model's own density
    overriding it: mergekit's precedence (the model's value, else the global one, else the default)."""
    from merging.lines import n_layers_of
    from merging.mergekit_settings import hf_name, layer_position

    folder, base, sds = files
    path = write(folder, """\
        models:
          - model: add
            parameters: {weight: [0.2, 1.0], density: [{filter: mlp, value: 0.9}]}
          - model: mul.safetensors
            parameters: {weight: 0.5}
        base_model: base.safetensors
        merge_method: ties
        parameters:
          density: [{filter: self_attn, value: 0.3}, {value: 0.6}]
    """, "ties_gradients.yml")
    merged = load_mergekit_config(path).run(progress=False)
    keys = [k for k in base if not is_buffer(k)]
    n_layers = n_layers_of(keys)
    for key in keys:
        name, t = hf_name(key), layer_position(key, n_layers)
        global_density = _mergekit_setting(name, [{"filter": "self_attn", "value": 0.3}, {"value": 0.6}], t)
        own = _mergekit_setting(name, [{"filter": "mlp", "value": 0.9}], t)
        densities = [own if own is not None else global_density, global_density]
        weights = [_mergekit_setting(name, [0.2, 1.0], t), 0.5]
        from mergekit.merge_methods.base import TensorGroup
        group = TensorGroup.from_tensors([base[key], sds["add"][key], sds["mul"][key]], base_index=0)
        (expected,) = mk_registry.get("ties")([group], parameters={"density": densities, "weight": weights,
                                                                   "normalize": True, "lambda": 1.0})
        torch.testing.assert_close(merged[key], expected, atol=1e-6, rtol=0, msg=key)


#: mergekit's examples/gradient-slerp.yml as its repository holds it (the model names resolve through models=)
GRADIENT_SLERP_EXAMPLE = """\
slices:
  - sources:
      - model: psmathur/orca_mini_v3_13b
        layer_range: [0, 40]
      - model: garage-bAInd/Platypus2-13B
        layer_range: [0, 40]
merge_method: slerp
base_model: psmathur/orca_mini_v3_13b
parameters:
  t:
    - pattern: self_attn
      value: [0, 0.5, 0.3, 0.7, 1]
    - pattern: mlp
      value: [1, 0.5, 0.7, 0.3, 0]
    - value: 0.5
dtype: float16
"""


def test_mergekits_gradient_slerp_example_runs_verbatim_as_mergekit_resolves_it(tmp_path):
    """The example names its modules under pattern:, which mergekit 0.1.5 ignores: its first entry's gradient then
    applies to every tensor, in mergekit and here, and here a warning says so."""
    from merging.lines import n_layers_of
    from merging.mergekit_settings import IgnoredPatternWarning, hf_name, layer_position

    orca = tiny_model(style="gemma", n_layers=40, n_heads=2, d_head=4, seed=1).state_dict()
    platypus = {k: v + 0.1 * torch.randn(v.shape, generator=torch.Generator().manual_seed(2))
                if v.is_floating_point() and not is_buffer(k) else v for k, v in orca.items()}
    path = tmp_path / "gradient-slerp.yml"
    path.write_text(GRADIENT_SLERP_EXAMPLE)
    with pytest.warns(IgnoredPatternWarning, match="mergekit 0.1.5 reads no 'pattern' key"):
        plan = load_mergekit_config(path, models={"psmathur/orca_mini_v3_13b": orca,
                                                  "garage-bAInd/Platypus2-13B": platypus})
    merged = plan.run(progress=False)
    keys = [k for k in orca if not is_buffer(k)]
    n_layers = n_layers_of(keys)
    setting = [{"pattern": "self_attn", "value": [0, 0.5, 0.3, 0.7, 1]},
               {"pattern": "mlp", "value": [1, 0.5, 0.7, 0.3, 0]}, {"value": 0.5}]
    for key in keys:
        t = _mergekit_setting(hf_name(key), setting, layer_position(key, n_layers))
        expected = mergekit_tensor("slerp", orca[key].half(), [platypus[key].half()], {"t": t})
        assert merged[key].dtype == torch.float16
        torch.testing.assert_close(merged[key].float(), expected.float(), atol=2e-3, rtol=2e-3, msg=key)
