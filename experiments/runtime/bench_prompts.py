"""Prompt batches the benchmarks share: few-shot prompts of one template and one token length (no padding)."""

from __future__ import annotations

from circuits.errors import InputError
from circuits.templates import get_templates


def one_length_prompts(model, *, op: str, n_prompts: int, n_shots: int, seed: int, correct_only: bool = False):
    """``n_prompts`` prompts of ``op``'s first equation template, all of the most common token length.

    Few-shot answers differ in length, so 4x as many prompts are sampled and those of the most common
    length kept (with ``correct_only``, only those the model answers correctly). Raises ``InputError``
    when fewer than ``n_prompts`` remain, rather than returning a smaller batch than asked for.
    """
    from circuits.answer_scoring import first_token_hits  # torch: not at import, so a benchmark's --help stays light
    from circuits.tasks import make_dataset

    template = get_templates(op, ("equation",))[0]
    data = make_dataset(model, op=op, n_prompts=4 * n_prompts, template_ids=(template.id,), n_shots=n_shots,
                        seed=seed)
    ok = first_token_hits(model, data) if correct_only else [True] * len(data)
    lengths = data["end_pos"]
    common = max(set(lengths), key=lengths.count)
    keep = [i for i, (n, good) in enumerate(zip(lengths, ok)) if n == common and good][:n_prompts]
    if len(keep) < n_prompts:
        which = "correctly answered prompts" if correct_only else "prompts"
        raise InputError(f"Only {len(keep)} of {len(data)} sampled {which} share one token length, fewer than "
                         f"--n-prompts {n_prompts}; lower --n-prompts (or --n-shots, which spreads the lengths).")
    return data.select(keep)
