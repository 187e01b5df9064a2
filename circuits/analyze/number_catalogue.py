"""The choices of the number analyses, readable without torch: where activations are read, which periods the helix has.

:mod:`circuits.analyze.number_tokens` reads a number's activations at one component of a layer,
and :mod:`circuits.analyze.number_geometry` fits them with a helix of fixed periods; both need
torch. ``python -m experiments.numbers`` offers the components as ``--components`` choices and
sizes its smallest valid run from the helix's periods before anything heavy loads, so the two
lists live here and all three read them.
"""

from __future__ import annotations

#: component name -> TransformerLens activation name (hook ``blocks.{layer}.hook_<name>``): the residual
#: stream before, between and after attention and the MLP, and what attention and the MLP write into it
COMPONENTS: dict[str, str] = {
    "resid_pre": "resid_pre",
    "resid_mid": "resid_mid",
    "resid_post": "resid_post",
    "attn_out": "attn_out",
    "mlp_out": "mlp_out",
}

#: the helix's periods T (units, fives, tens, hundreds): basis cos 2πn/T, sin 2πn/T for each, beside n itself
HELIX_PERIODS: tuple[int, ...] = (2, 5, 10, 100)
