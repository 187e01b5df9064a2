"""finetune.configs: one config per method on a shared base; train() picks the method from the config's type."""

import pytest

from circuits.errors import InputError
from finetune.configs import (
    FullSFTConfig, LoraSFTConfig, PreciseSFTConfig, SFTConfig, TrainConfig, method_of, method_config,
)
from finetune.lora import LoraSettings
from finetune.trainer import train


def test_each_method_config_holds_only_its_own_fields():
    assert {"tune_kv", "rescale"} <= set(PreciseSFTConfig.__dataclass_fields__)
    assert "lora" not in PreciseSFTConfig.__dataclass_fields__ and "train_embeddings" not in PreciseSFTConfig.__dataclass_fields__
    assert "train_embeddings" in FullSFTConfig.__dataclass_fields__ and "tune_kv" not in FullSFTConfig.__dataclass_fields__
    assert "lora" in LoraSFTConfig.__dataclass_fields__ and "rescale" not in LoraSFTConfig.__dataclass_fields__
    for kind in (PreciseSFTConfig, FullSFTConfig, LoraSFTConfig, TrainConfig):
        assert issubclass(kind, SFTConfig)


def test_the_all_methods_config_narrows_to_each_method():
    config = TrainConfig(lr=1e-3, batch_size=4, tune_kv=False, train_embeddings=True, lora=LoraSettings(r=2))
    precise = method_config(config, "precise")
    assert type(precise) is PreciseSFTConfig and precise.lr == 1e-3 and precise.tune_kv is False
    assert type(method_config(config, "full")) is FullSFTConfig and method_config(config, "full").train_embeddings
    assert method_config(config, "lora").lora.r == 2
    # the resume identity of a precise run does not depend on LoRA's settings
    other = TrainConfig(lr=1e-3, batch_size=4, tune_kv=False, lora=LoraSettings(r=16))
    assert method_config(other, "precise").identity() == precise.identity()
    assert method_config(other, "lora").identity() != method_config(config, "lora").identity()


def test_the_method_comes_from_the_config_unless_named():
    assert method_of(LoraSFTConfig(), None) == "lora" and method_of(FullSFTConfig(), None) == "full"
    assert method_of(TrainConfig(), None) == "precise" and method_of(SFTConfig(), None) == "precise"
    assert method_of(TrainConfig(), "full") == "full"
    with pytest.raises(InputError, match="Unknown method 'qlora'"):
        method_of(TrainConfig(), "qlora")
    with pytest.raises(InputError, match="configures another method"):
        method_config(LoraSFTConfig(), "precise")
    assert method_config(SFTConfig(lr=1e-3), "full").lr == 1e-3  # the shared base works for every method


def test_the_shared_checks_run_for_every_method_config():
    for kind in (PreciseSFTConfig, FullSFTConfig, LoraSFTConfig, TrainConfig):
        with pytest.raises(InputError, match="lr must be a finite number"):
            kind(lr=float("nan"))


def test_train_runs_the_method_its_config_names(tiny):
    from tests.tiny_models import char_tokenizer
    from finetune.data import encode_pairs
    from finetune.trainer import train

    data = encode_pairs(char_tokenizer(), [(f"{a}+{a}=", str(2 * a)) for a in range(4)])
    result = train(tiny, data, FullSFTConfig(lr=1e-3, batch_size=2, max_steps=1, progress=False))
    assert result.method == "full" and result.steps == 1 and len(result.losses) == 1
    with pytest.raises(InputError, match="configures another method"):
        train(tiny, data, FullSFTConfig(lr=1e-3, batch_size=2, max_steps=1), method="lora")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("lr", float("nan"), "lr must be a finite number > 0"),
        ("lr", float("inf"), "lr must be a finite number > 0"),
        ("lr", -1e-3, "lr must be a finite number > 0"),
        ("lr", 0.0, "lr must be a finite number > 0"),
        ("betas", (1.0, 0.999), r"beta1 must lie in \[0, 1\)"),
        ("betas", (0.9, -0.1), r"beta2 must lie in \[0, 1\)"),
        ("betas", (0.9, float("nan")), r"beta2 must lie in \[0, 1\)"),
        ("eps", 0.0, "eps must be a finite number > 0"),
        ("warmup_ratio", 2.0, r"warmup_ratio must lie in \[0, 1\]"),
    ],
)
def test_bad_optimizer_settings_are_refused(field, value, message):
    with pytest.raises(InputError, match=message):
        TrainConfig(**{field: value})
