"""The AF1 tests' data: an equation template, its 100 one-digit prompts, runners scored on the plain model's
own predictions (so faithfulness is informative on a random model)."""

from fractions import Fraction

import torch
from datasets import Dataset

from circuits.end_logits import end_logits
from circuits.tasks import make_row
from circuits.templates import Template
from patching.all_for_one.template_prompts import split_fit_eval
from patching.all_for_one.runner import AF1Config, AF1Runner
from patching.sweeps.options import SweepOptions


EQ = Template("t-eq", "+", "equation", "{A}[+]{B}=")


def _data(model, n=None):
    rows = [make_row(model.tokenizer, EQ, Fraction(a), Fraction(b)) for a in range(10) for b in range(10)]
    return Dataset.from_list(rows[:n] if n else rows)


def _runner(model, config=AF1Config()):
    """A runner whose 'answers' are the plain model's own predictions, so faithfulness is informative (no bars)."""
    fit, ev = split_fit_eval(_data(model), 0.5, seed=0)
    runner = AF1Runner(model, fit, ev, config, options=SweepOptions(progress=False))
    for group in runner.groups:
        group.answers = end_logits(model, group.tokens).argmax(-1)
    return runner


def _self_answered(model, data):
    """``data`` with each prompt's answer set to the plain model's own prediction: every prompt is 'correct'."""
    predictions = end_logits(model, torch.tensor(data["tokens"])).argmax(-1).tolist()
    return data.remove_columns("answer_token_ids").add_column("answer_token_ids", [[p] for p in predictions])
