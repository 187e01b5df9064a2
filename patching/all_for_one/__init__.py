"""All for One (Mamidanna et al. 2025): tokens wait, a few layers transfer to the last token, which computes alone.

* :mod:`patching.all_for_one.cama`: context-aware mean ablation of the residual stream;
* :mod:`patching.all_for_one.abp`: attention-based peeking masks (self peek, full peek);
* :mod:`patching.all_for_one.runner`: the AF1 model (CAMA up to L_wait, full peek for L_transfer
  layers, self peek after) run over cached residuals;
* :mod:`patching.all_for_one.search`: the (L_wait, L_transfer) grid, selection, head pruning,
  held-out selection;
* :mod:`patching.all_for_one.template_prompts`: the authors' five prompt formats.

This face offers the entry points (``__all__``): :func:`search_af1` (the whole search),
:func:`af1_accuracy` (one setting), :class:`AF1Config`, :class:`AF1Runner` (prompts, means and cached
residuals, swept cheaply) and :func:`make_template_dataset` (prompts of :func:`authors_templates`).
Everything else is imported from the modules above (e.g. :func:`patching.all_for_one.search.grid_hits`,
:class:`patching.all_for_one.cama.CamaConfig`).
"""

from patching.all_for_one.runner import AF1Config, AF1Runner
from patching.all_for_one.search import af1_accuracy, search_af1
from patching.all_for_one.template_prompts import authors_templates, make_template_dataset

__all__ = ["search_af1", "af1_accuracy", "AF1Config", "AF1Runner", "make_template_dataset", "authors_templates"]
