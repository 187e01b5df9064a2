"""Causal variables: what a model's representations carry, tested against a causal model of the task.

* :mod:`patching.variables.causal_models`: the tasks' causal models and their interchange pairs (which answer a
  variable's swap predicts);
* :mod:`patching.variables.interchange`: interchange interventions and their accuracy (IIA) at a location, in full or
  in a subspace;
* :mod:`patching.variables.featurizers`: the subspaces (DAS, DBM, PCA, a random null) fitted and chosen on validation
  pairs.
"""
