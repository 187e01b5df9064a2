"""The evaluation harness: arithmetic gained, general ability kept.

Every method (base, precise, full, LoRA) is scored by the same functions on
the same `HookedTransformer` architecture:

* **arithmetic accuracy** on *held-out templates* (:func:`math_suite`: the
  templates :func:`finetune.data.split_templates` keeps out of training) and
  on *transfer formats* built from those held-out templates: two-digit
  operands, one-decimal operands, word problems. Two scores per set:
  ``first_token`` (top-1 of the first answer token, the project's standard
  metric) and ``exact`` (every answer token is the argmax under teacher
  forcing, i.e. greedy decoding would write the whole answer);
* **drift on non-math text** (:func:`drift`): the mean per-token KL divergence
  ``KL(p_base || p_tuned)`` of next-token distributions and the tuned model's
  language-model loss (with the base model's for reference), on English text
  available offline: passages of the Python reference documentation shipped
  with the standard library (``pydoc_data.topics``) and
  :data:`NON_MATH_SENTENCES`, thirty sentences written for this project.

The paper's external benchmarks (GSM8K, SVAMP, MMLU, CommonsenseQA) are not evaluated: they
need the hub, and nothing in the pipeline used the loaders, so they were removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from datasets import Dataset
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from circuits.answer_scoring import token_hits
from circuits.arguments import check_positive_int
from circuits.errors import InputError
from circuits.seeds import derived_seed
from circuits.end_logits import unembed_end
from circuits.stats import Estimate, bootstrap, proportion
from circuits.templates import resolve_operation, template_by_id
from finetune.data import (SFTDataError, arithmetic_pairs, arithmetic_rows, collate, from_task_dataset, prompts_and_answers,
                           rows_from_pairs, split_templates, targets)

NON_MATH_SENTENCES = (
    "The old lighthouse keeper climbed the spiral stairs every evening to light the lamp.",
    "Rain fell softly on the tin roof while the children slept in the attic.",
    "She packed a small suitcase with books, a warm scarf and a jar of honey.",
    "The river widens near the village, where fishermen mend their nets at dawn.",
    "In spring the orchard fills with white blossoms and the hum of bees.",
    "He apologized for the delay and promised to send the letter by Friday.",
    "The museum's new exhibit explores how ancient sailors navigated by the stars.",
    "A gentle breeze carried the smell of bread from the bakery across the square.",
    "The committee will discuss the proposal at its next meeting.",
    "Her grandmother taught her how to knit, bake and tell a good story.",
    "The train slowed as it entered the tunnel beneath the mountains.",
    "Volunteers planted trees along the riverbank to prevent erosion.",
    "The detective noticed a faint scratch on the window frame.",
    "After the storm, the garden was covered in broken branches and fallen leaves.",
    "The orchestra tuned their instruments while the audience found their seats.",
    "Many birds migrate south in autumn to escape the cold winter.",
    "The library extended its opening hours during the examination period.",
    "He painted the fence a bright shade of blue that surprised the neighbours.",
    "The chef tasted the soup and added a pinch of salt and fresh thyme.",
    "Our guide told us stories about the castle and the families who lived there.",
    "The cat curled up on the windowsill, watching the snow fall outside.",
    "Scientists study coral reefs to understand how oceans are changing.",
    "The festival ended with music, dancing and lanterns floating on the lake.",
    "She wrote a short poem about the sea and read it aloud to her friends.",
    "The farmer checked the fences before the sheep were moved to the hill.",
    "A quiet path through the forest leads to a small wooden bridge.",
    "The students presented their research on renewable energy to the class.",
    "When the power went out, they lit candles and played board games.",
    "The bookshop on the corner sells maps, postcards and old novels.",
    "He learned to speak Italian while working at a restaurant in Rome.",
)


def pydoc_passages(n: int = 16, max_chars: int = 600) -> list[str]:
    """``n`` English passages from ``pydoc_data.topics`` (stdlib), deterministic: sorted topics, prose only."""
    from pydoc_data.topics import topics

    passages = []
    for key in sorted(topics):
        # Skip code-heavy paragraphs: keep lines that read as prose.
        prose = [line.strip() for line in topics[key].splitlines()
                 if len(line.strip()) > 40 and not line.startswith(" ") and "::" not in line]
        text = " ".join(prose)[:max_chars].strip()
        if len(text) >= max_chars // 2:
            passages.append(text)
        if len(passages) == n:
            break
    if len(passages) < n:
        raise RuntimeError(f"pydoc_data.topics gave only {len(passages)} passages of >= {max_chars // 2} chars.")
    return passages


def general_texts(n_pydoc: int = 16, max_chars: int = 600) -> list[str]:
    """The default non-math text: pydoc passages plus :data:`NON_MATH_SENTENCES`."""
    return pydoc_passages(n_pydoc, max_chars) + list(NON_MATH_SENTENCES)


@torch.no_grad()
def drift(
    model: HookedTransformer,
    base: HookedTransformer,
    texts: Sequence[str],
    *,
    max_tokens: int = 128,
    batch_size: int = 4,
    progress: bool = False,
    per_text: bool = False,
) -> dict:
    """Mean per-token ``KL(p_base || p_model)`` and LM losses of ``model`` and ``base`` on ``texts``.

    Texts are truncated to ``max_tokens`` tokens (BOS included); every position
    that predicts a real next token counts once. ``per_text=True`` adds
    ``"per_text"``: each text's summed KL, summed losses and token count, the
    unit :func:`drift_estimates` resamples for its intervals.
    """
    check_positive_int(batch_size, "batch_size")
    if not texts:
        raise InputError("drift needs at least one text.")
    tok = model.tokenizer
    max_tokens = min(max_tokens, model.cfg.n_ctx)
    encoded = [list(tok(t, add_special_tokens=True)["input_ids"])[:max_tokens] for t in texts]
    encoded = [e for e in encoded if len(e) >= 2]
    rows = [{"input_ids": e, "n_prompt": 1} for e in encoded]
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    kl_sum = loss_sum = base_loss_sum = 0.0
    count = 0
    sums: dict[str, list] = {"kl": [], "lm_loss": [], "base_lm_loss": [], "n_tokens": []}
    for start in tqdm(range(0, len(rows), batch_size), desc="drift", disable=not progress, leave=False):
        chunk = rows[start:start + batch_size]
        tokens, mask = collate(chunk, pad_id, model.cfg.device)
        target = targets(chunk, mask)
        logp = unembed_end(model, model(tokens, stop_at_layer=model.cfg.n_layers)[mask]).float().log_softmax(-1)
        if model is base:  # the base against itself: KL 0 and the same loss, without a second forward
            base_logp = logp
        else:
            base_logp = unembed_end(base, base(tokens.to(base.cfg.device),
                                               stop_at_layer=base.cfg.n_layers)[mask.to(base.cfg.device)])
            base_logp = base_logp.float().log_softmax(-1).to(logp.device)
        kl = (base_logp.exp() * (base_logp - logp)).sum(-1)
        loss = F.nll_loss(logp, target, reduction="none")
        base_loss = F.nll_loss(base_logp, target, reduction="none")
        kl_sum += float(kl.sum())
        loss_sum += float(loss.sum())
        base_loss_sum += float(base_loss.sum())
        count += int(mask.sum())
        if per_text:
            row_of = mask.nonzero()[:, 0].to(kl.device)
            for key, values in (("kl", kl), ("lm_loss", loss), ("base_lm_loss", base_loss)):
                per_row = torch.zeros(len(chunk), dtype=torch.float64, device=kl.device)
                sums[key] += per_row.index_add_(0, row_of, values.double()).tolist()
            sums["n_tokens"] += mask.sum(1).tolist()
    out = {"kl": kl_sum / count, "lm_loss": loss_sum / count, "base_lm_loss": base_loss_sum / count, "n_tokens": count}
    if per_text:
        out["per_text"] = sums
    return out


def _per_token_ratio(columns: np.ndarray) -> float:
    # columns: [texts, 2] = (summed quantity, token count): the per-token mean over the drawn texts
    return float(columns[:, 0].sum() / columns[:, 1].sum())


def drift_estimates(per_text: dict, other: dict | None = None, *, seed: int = 0) -> dict[str, Estimate]:
    """Per-token KL and LM-loss increase over base, with percentile-bootstrap intervals over texts.

    ``per_text`` is ``drift(..., per_text=True)["per_text"]``. Texts, not tokens,
    are resampled (tokens of one text are not independent). With ``other`` (the
    same texts under another model) the estimates are paired differences
    ``self - other`` of the per-token KL and LM loss.
    """
    n_tokens = np.asarray(per_text["n_tokens"], dtype=np.float64)
    kl = np.asarray(per_text["kl"], dtype=np.float64)
    loss_up = np.asarray(per_text["lm_loss"], dtype=np.float64) - np.asarray(per_text["base_lm_loss"], dtype=np.float64)
    if other is not None:
        if list(other["n_tokens"]) != list(per_text["n_tokens"]):
            raise InputError("Paired drift needs the same texts in both arms (token counts differ).")
        kl = kl - np.asarray(other["kl"], dtype=np.float64)
        loss_up = loss_up - (np.asarray(other["lm_loss"], dtype=np.float64)
                             - np.asarray(other["base_lm_loss"], dtype=np.float64))
    return {"kl": bootstrap(np.stack([kl, n_tokens], 1), _per_token_ratio, seed=seed),
            "lm_loss_increase": bootstrap(np.stack([loss_up, n_tokens], 1), _per_token_ratio, seed=seed)}


@dataclass(frozen=True)
class MathSuiteConfig:
    """Sizes of the arithmetic evaluation sets (per operation)."""

    ops: tuple[str, ...] = ("+", "-", "*", "/")
    n_heldout: int = 40
    n_transfer: int = 20
    transfer: tuple[str, ...] = ("multi_digit", "decimal", "word_problem")
    n_shots: int = 2
    seed: int = 12345


def math_suite(tokenizer, config: MathSuiteConfig = MathSuiteConfig()) -> dict[str, Dataset]:
    """Arithmetic eval sets (SFT rows) on held-out templates: ``heldout/<op>`` and ``<format>/<op>`` per transfer format."""
    suites: dict[str, Dataset] = {}
    for i, op in enumerate(config.ops):
        _, eval_ids = split_templates(op)
        non_word = [t for t in eval_ids if template_by_id(t).style != "word_problem"]
        word = [t for t in eval_ids if template_by_id(t).style == "word_problem"]
        common = dict(n_shots=config.n_shots, seed=derived_seed(config.seed, "suite operation", i))
        suites[f"heldout/{op}"] = arithmetic_rows(tokenizer, op, eval_ids, config.n_heldout, **common)
        if "multi_digit" in config.transfer:
            rng = (10, 99) if resolve_operation(op).symbol != "/" else (2, 99)
            suites[f"multi_digit/{op}"] = arithmetic_rows(tokenizer, op, non_word, config.n_transfer,
                                                          operand_range=rng, **common)
        if "decimal" in config.transfer:
            suites[f"decimal/{op}"] = arithmetic_rows(tokenizer, op, non_word, config.n_transfer, decimals=1,
                                                      operand_range=(1, 9), **common)
        if "word_problem" in config.transfer and word:
            suites[f"word_problem/{op}"] = arithmetic_rows(tokenizer, op, word, config.n_transfer,
                                                           operand_range=(1, 9), **common)
    return suites


def validation_suite(tokenizer, config: MathSuiteConfig, n_per_op: int, *, exclude: Sequence[Dataset] = (),
                     seed: int = 777) -> dict[str, Dataset]:
    """``heldout/<op>`` validation sets for choosing hyperparameters (learning rates), disjoint from ``exclude``.

    The prompts come from the same held-out templates as :func:`math_suite`'s
    ``heldout`` sets (so validation measures what the test measures), drawn
    with another seed, and a candidate is dropped when its asked line
    (``query``: template filled with the operands) or its whole prompt occurs in
    any dataset of ``exclude`` (pass the test sets and the training set). A
    test problem therefore never appears in validation, not even with other shots.
    """
    check_positive_int(n_per_op, "n_per_op")
    taken_queries = {q for ds in exclude if "query" in ds.column_names for q in ds["query"]}
    taken_prompts = {p for ds in exclude if "prompt" in ds.column_names for p in ds["prompt"]}
    suites: dict[str, Dataset] = {}
    for i, op in enumerate(config.ops):
        _, eval_ids = split_templates(op)
        candidates = arithmetic_pairs(op, eval_ids, 20 * n_per_op, n_shots=config.n_shots,
                                      seed=derived_seed(seed, "validation operation", i))
        kept, seen = [], set()
        for item in candidates:
            if item["query"] in taken_queries or item["prompt"] in taken_prompts or item["prompt"] in seen:
                continue
            seen.add(item["prompt"])
            kept.append(item)
            if len(kept) == n_per_op:
                break
        if len(kept) < n_per_op:
            raise SFTDataError(f"Only {len(kept)} validation prompts for {op!r} avoid the excluded sets; "
                               f"lower n_per_op (asked {n_per_op}).")
        suites[f"heldout/{op}"] = rows_from_pairs(tokenizer, kept)
    return suites


def pooled_hits(per_set: dict[str, dict], family: str, key: str = "exact_hits") -> list[int]:
    """The per-prompt hits of every set of ``family`` (e.g. ``"heldout"``; ``"transfer"``: every other family), in order."""
    names = sorted(n for n in per_set if (n.split("/")[0] == family) or (family == "transfer" and not n.startswith("heldout/")))
    if not names:
        raise InputError(f"No evaluation sets of family {family!r} in {sorted(per_set)}.")
    if any(key not in per_set[n] for n in names):
        raise InputError(f"The scores lack {key!r}: evaluate with per_prompt=True.")
    return [hit for n in names for hit in per_set[n][key]]


def accuracy_estimate(per_set: dict[str, dict], family: str, key: str = "exact_hits") -> Estimate:
    """Pooled accuracy of ``family`` with its Wilson 95% interval and n (prompts)."""
    return proportion(pooled_hits(per_set, family, key))


def answer_accuracy(model: HookedTransformer, task_ds: Dataset, batch_size: int = 16, *,
                    per_prompt: bool = False) -> dict:
    """``first_token`` and ``exact`` (every answer token argmax under teacher forcing) accuracy.

    ``task_ds`` holds SFT rows (``input_ids``, ``n_prompt``) or is a :mod:`circuits.tasks` dataset;
    both are scored by the one teacher-forced pass of :func:`circuits.answer_scoring.token_hits`.
    ``per_prompt=True`` adds ``first_token_hits`` and ``exact_hits`` (0/1 per prompt, in order),
    for intervals and paired comparisons between models on the same prompts.
    """
    check_positive_int(batch_size, "batch_size")
    rows = task_ds.to_list() if "input_ids" in task_ds.column_names else from_task_dataset(task_ds).to_list()
    first, whole = token_hits(model, *prompts_and_answers(rows), batch_size)
    first_hits, exact_hits = [int(hit) for hit in first], [int(hit) for hit in whole]
    out = {"first_token": sum(first_hits) / len(rows), "exact": sum(exact_hits) / len(rows), "n": len(rows)}
    if per_prompt:
        out |= {"first_token_hits": first_hits, "exact_hits": exact_hits}
    return out


def summarize_math(per_set: dict[str, dict[str, float]]) -> dict[str, float]:
    """Mean ``first_token``/``exact`` accuracy per family (``heldout``, ``multi_digit``, ...) over operations."""
    families: dict[str, list[dict[str, float]]] = {}
    for name, scores in per_set.items():
        families.setdefault(name.split("/")[0], []).append(scores)
    out = {}
    for family, scores in families.items():
        out[f"{family}/first_token"] = sum(s["first_token"] for s in scores) / len(scores)
        out[f"{family}/exact"] = sum(s["exact"] for s in scores) / len(scores)
    transfer = [k for k in families if k != "heldout"]
    if transfer:
        out["transfer/exact"] = sum(out[f"{f}/exact"] for f in transfer) / len(transfer)
        out["transfer/first_token"] = sum(out[f"{f}/first_token"] for f in transfer) / len(transfer)
    return out


def evaluate_suite(
    model: HookedTransformer,
    base: HookedTransformer,
    suite: dict[str, Dataset],
    texts: Sequence[str] | None = None,
    *,
    batch_size: int = 16,
    drift_tokens: int = 128,
    progress: bool = True,
    per_prompt: bool = False,
) -> dict:
    """Score ``model`` on every math set of ``suite`` and its drift from ``base`` on ``texts`` (default :func:`general_texts`).

    ``per_prompt=True`` keeps the per-prompt hits and per-text drift sums (for intervals).
    """
    model.eval()
    per_set = {name: answer_accuracy(model, ds, batch_size, per_prompt=per_prompt)
               for name, ds in tqdm(suite.items(), desc="math eval", disable=not progress, leave=False)}
    drift_scores = drift(model, base, general_texts() if texts is None else texts, max_tokens=drift_tokens,
                         batch_size=max(1, batch_size // 4), progress=progress, per_text=per_prompt)
    return {"math": per_set, "math_summary": summarize_math(per_set), "drift": drift_scores}


def paired_comparison(scores: dict, reference: dict, *, family: str = "heldout", seed: int = 0) -> dict[str, Estimate]:
    """``scores`` minus ``reference`` (two :func:`evaluate_suite` results with ``per_prompt=True``, same suite and texts).

    ``accuracy``: the paired bootstrap of the exact-accuracy difference over the
    same prompts (:func:`circuits.stats.paired_difference`); ``kl`` and
    ``lm_loss_increase``: the paired per-token drift differences, resampling texts.
    """
    from circuits.stats import paired_difference

    a, b = pooled_hits(scores["math"], family), pooled_hits(reference["math"], family)
    out = {"accuracy": paired_difference(a, b, seed=seed)}
    out |= drift_estimates(scores["drift"]["per_text"], reference["drift"]["per_text"], seed=seed)
    return out
