"""The names of the merge experts' tasks, apart from their data so that reading them loads no torch.

:mod:`finetune.expert_tasks` builds each task's SFT data (tokenized, with ``datasets``);
``python -m experiments.merge`` needs only the names, in order, to check its flags and
word its messages before anything heavy loads. Both read them here.
"""

from __future__ import annotations

#: the experts' tasks, in the order the merges combine them: word-problem addition, multiplication,
#: English -> French number words
EXPERT_TASKS: tuple[str, ...] = ("add_word", "mul", "en_fr")
