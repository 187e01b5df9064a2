"""What the experiments read out of a model beside patching: attention, probes, numbers, neurons.

* :mod:`circuits.analyze.attention`: where each head's END query attends (operand / operator heads)
  and circuitsvis attention views;
* :mod:`circuits.analyze.probes`: logit-lens probes of the MLPs' inputs and outputs;
* :mod:`circuits.analyze.number_tokens`, :mod:`circuits.analyze.number_geometry`: number
  representations (Fourier spectra, helix fits, mod-T probes);
* :mod:`circuits.analyze.heuristic_neurons`: neurons matched against arithmetic pattern families.

Answers are scored by the core module :mod:`circuits.answer_scoring`.
"""
