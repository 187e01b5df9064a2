"""merging.methods.config_checks: the checks every merge config and every merge's weights go through."""

import math
from dataclasses import dataclass

import pytest

from circuits.errors import InputError
from merging.methods.config_checks import check_choice, check_config, check_no_weights, check_weights


@dataclass
class Demo:
    density: float | tuple = 0.5
    gamma: float = 0.1
    lam: float = 1.0
    epsilon: float = 0.0
    mode: str = "a"
    normalize: bool = True


def test_configs_are_checked_field_by_field():
    check_config(Demo(density=(0.2, 1.0), gamma=0.0))  # (0, 1] and [0, 1] hold; a bool is not a number here
    for kwargs, message in [({"density": 0.0}, r"Demo.density=0.0 is outside \(0, 1\]"),
                            ({"density": (0.5, 1.5)}, r"Demo.density=1.5 is outside"),
                            ({"gamma": 1.2}, r"Demo.gamma=1.2 is outside \[0, 1\]"),
                            ({"lam": math.nan}, "Demo.lam is nan; give a finite number"),
                            ({"epsilon": -0.1}, "Demo.epsilon=-0.1 is negative")]:
        with pytest.raises(InputError, match=message):
            check_config(Demo(**kwargs))
    check_choice(Demo(), "mode", ("a", "b"))
    with pytest.raises(InputError, match=r"Demo.mode must be one of \('a', 'b'\), got 'c'"):
        check_choice(Demo(mode="c"), "mode", ("a", "b"))


def test_weights_default_to_one_and_must_fit_the_experts():
    assert check_weights(None, 3) == [1.0, 1.0, 1.0] and check_weights((2, -1), 2) == [2.0, -1.0]
    assert check_weights([1, -1], 2) == [1.0, -1.0]  # a zero sum is fine unless the method divides by it
    with pytest.raises(InputError, match="sum to ~0"):
        check_weights([1, -1], 2, normalized=True)
    with pytest.raises(InputError, match="1 weights for 2 experts"):
        check_weights([1], 2)
    with pytest.raises(InputError, match="must be finite"):
        check_weights([1, math.inf], 2)
    check_no_weights([0.5, 0.5], "karcher")  # uniform weights say nothing: accepted
    with pytest.raises(InputError, match="karcher takes no per-expert weights"):
        check_no_weights([0.5, 1.0], "karcher")


def test_a_bool_in_a_number_field_is_refused_not_read_as_1():
    # True is an int to Python: it would run as k=1 or λ=1 without a word
    with pytest.raises(InputError, match=r"^Demo\.lam is True, a bool; give a number \(e\.g\. 1\.0\)\.$"):
        check_config(Demo(lam=True))
    with pytest.raises(InputError, match=r"^Demo\.density\[0\] is False, a bool; give a number \(e\.g\. 0\.5\)\.$"):
        check_config(Demo(density=(False, 0.5)))
    check_config(Demo(normalize=False))  # a bool field takes a bool


def test_each_per_expert_value_is_checked():
    with pytest.raises(InputError, match=r"^Demo\.density\[1\] is the string 'x'; give a number \(e\.g\. 0\.5\)\.$"):
        check_config(Demo(density=(0.4, "x")))
    with pytest.raises(InputError, match=r"^Demo\.density\[1\] is None \(a NoneType\); give a number"):
        check_config(Demo(density=[0.4, None]))
    with pytest.raises(InputError, match=r"^Demo\.density is nan; give a finite number"):
        check_config(Demo(density=(0.4, math.nan)))
