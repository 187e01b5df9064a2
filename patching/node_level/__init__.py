"""Node-level methods: which heads and MLPs carry the task, and what removing them does.

* :mod:`patching.node_level.path_patching`: exact path patching from every head and MLP to the answer logit (or to
  receiver heads' q/k/v), with an END-only fast path;
* :mod:`patching.node_level.activation_patching`: activation patching of head outputs, MLP outputs and the residual
  stream (equal to ``transformer_lens.patching``'s sweeps, faster);
* :mod:`patching.node_level.attribution_patching`: attribution patching, and its rank agreement with exact patching;
* :mod:`patching.node_level.head_ranking`: which heads are "the key heads";
* :mod:`patching.node_level.knockout_curves` (and its fast path :mod:`patching.node_level.knockout_fast`):
  mean-ablation knockout, effect-rank vs random-rank curves, transfer formats;
* :mod:`patching.node_level.number_interventions`: frequency filters, helix-subspace patching and heuristic-neuron
  knockout on number representations.

The entry points are on the :mod:`patching` face (``path_patch``, ``knockout_curve``, ...).
"""
