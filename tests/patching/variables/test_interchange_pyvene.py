"""The interchange engine against pyvene (Wu et al. 2024), an independent implementation of the same intervention.

pyvene is not a dependency of the toolkit: this test runs where it is importable and is skipped elsewhere. A
random two-layer GPT-2 built with ``transformers`` is wrapped by pyvene and, with its weights converted, loaded
by TransformerLens; the same fixed k-dimensional rotation is swapped at the same block output and position.
"""

from __future__ import annotations

import pytest
import torch

pyvene = pytest.importorskip("pyvene")

from transformer_lens import HookedTransformer, HookedTransformerConfig  # noqa: E402
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from circuits.end_logits import unembed_end  # noqa: E402
from patching.variables.featurizers import FixedSubspace  # noqa: E402
from patching.variables.interchange import PairBatch, intervened_answer_residuals, location, prepare  # noqa: E402


def twin_gpt2(d_model: int, n_vocab: int) -> tuple[GPT2LMHeadModel, HookedTransformer]:
    """A random two-layer GPT-2 for pyvene and the same weights loaded by TransformerLens."""
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=d_model, n_head=4, vocab_size=n_vocab, n_positions=64,
                                    bos_token_id=0, eos_token_id=0)).eval()
    cfg = HookedTransformerConfig(n_layers=2, d_model=d_model, n_heads=4, d_head=8, d_mlp=4 * d_model, d_vocab=n_vocab,
                                  n_ctx=64, act_fn="gelu_new", normalization_type="LN")
    model = HookedTransformer(cfg)
    model.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    return hf, model.eval()


@torch.no_grad()
def test_the_same_rotation_gives_the_same_intervened_logits_as_pyvene():
    torch.manual_seed(0)
    d_model, n_vocab, k, position = 32, 100, 5, 7  # END of 8-token prompts
    hf, model = twin_gpt2(d_model, n_vocab)
    base = torch.randint(0, n_vocab, (4, 8))
    source = torch.randint(0, n_vocab, (4, 8))
    source[:, :position] = base[:, :position]  # a shared prefix, so the engine's cached-prefix path is compared
    basis = torch.linalg.qr(torch.randn(d_model, k))[0]

    wrapped = pyvene.IntervenableModel(pyvene.IntervenableConfig(
        [{"layer": 1, "component": "block_output", "low_rank_dimension": k,
          "intervention_type": pyvene.LowRankRotatedSpaceIntervention}]), hf)
    intervention = next(iter(wrapped.interventions.values()))
    intervention = intervention[0] if isinstance(intervention, tuple) else intervention
    intervention.rotate_layer.weight = basis  # through the orthogonal parametrization: the same orthonormal columns
    _, theirs = wrapped({"input_ids": base}, [{"input_ids": source}], {"sources->base": position})

    where = location("resid_post", 1, position)
    prepared = prepare(model, PairBatch(base, source, torch.zeros(4, 1, dtype=torch.long), base.shape[1]), [where])
    assert prepared.prefix == position
    resid, _ = intervened_answer_residuals(model, prepared, where, FixedSubspace(basis, "das"))
    torch.testing.assert_close(unembed_end(model, resid), theirs.logits[:, -1], atol=1e-5, rtol=1e-5)
    # and the intervention moved the answer: the comparison is not of two unintervened runs
    assert (theirs.logits[:, -1] - hf(base).logits[:, -1]).abs().max() > 1e-3


@torch.no_grad()
def test_a_location_through_the_answer_gives_pyvenes_logits_at_every_answer_position():
    """The span from END over the answer positions, full vectors swapped: pyvene intervening at those positions of
    the base fed its answer tokens, with the source fed the same tokens. (pyvene's rotated interventions over
    several positions rotate their concatenation, not each position, so the subspace case is the test above.)"""
    torch.manual_seed(1)
    d_model, n_vocab, end, n_answer = 32, 100, 7, 3
    hf, model = twin_gpt2(d_model, n_vocab)
    answers = torch.randint(0, n_vocab, (4, n_answer))
    base = torch.cat([torch.randint(0, n_vocab, (4, end + 1)), answers[:, :-1]], 1)  # prompt, then the answer but its last
    source = torch.randint(0, n_vocab, (4, end + 1))
    source[:, :3] = base[:, :3]

    wrapped = pyvene.IntervenableModel(pyvene.IntervenableConfig(
        [{"layer": 0, "component": "block_output", "intervention_type": pyvene.VanillaIntervention}]), hf)
    span = [[list(range(end, end + n_answer))] * 4]
    fed_source = torch.cat([source, base[:, end + 1:]], 1)
    _, theirs = wrapped({"input_ids": base}, [{"input_ids": fed_source}], {"sources->base": (span, span)})

    where = location("resid_post", 0, end, through_answer=True)
    prepared = prepare(model, PairBatch(base, source, answers, end + 1), [where])
    resid, targets = intervened_answer_residuals(model, prepared, where)
    assert torch.equal(targets, answers.flatten())
    torch.testing.assert_close(unembed_end(model, resid), theirs.logits[:, end:].flatten(0, 1), atol=1e-5, rtol=1e-5)
    # the answer positions moved too: a swap at END alone would leave them to the base run
    alone = location("resid_post", 0, end)
    resid_alone, _ = intervened_answer_residuals(model, prepare(model, PairBatch(base, source, answers, end + 1), [alone]),
                                                 alone)
    assert (unembed_end(model, resid_alone) - theirs.logits[:, end:].flatten(0, 1)).abs().max() > 1e-3
