"""All for One (Mamidanna et al. 2025): tokens wait, a few layers transfer to the last token, which computes alone.

* :mod:`patching.all_for_one.cama`: context-aware mean ablation of the residual stream;
* :mod:`patching.all_for_one.abp`: attention-based peeking masks (self peek, full peek);
* :mod:`patching.all_for_one.runner`: the AF1 model (CAMA up to L_wait, full peek for L_transfer
  layers, self peek after) run over cached residuals;
* :mod:`patching.all_for_one.search`: the (L_wait, L_transfer) grid, selection, head pruning,
  held-out selection;
* :mod:`patching.all_for_one.template_prompts`: the authors' five prompt formats.
"""
