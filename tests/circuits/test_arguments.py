"""circuits.arguments: one check for every string option, reading the allowed values from a Literal alias."""

from typing import Literal

import pytest

from circuits.errors import InputError
from circuits.arguments import allowed_values, check_option


def test_check_option_reads_the_allowed_values_from_a_literal():
    Mode = Literal["fast", "hooks"]
    assert allowed_values(Mode) == ("fast", "hooks") and allowed_values(("a", "b")) == ("a", "b")
    assert check_option("method", "fast", Mode) == "fast"
    with pytest.raises(InputError, match=r"^Unknown method 'slow': method must be one of 'fast', 'hooks'\.$"):
        check_option("method", "slow", Mode)
    with pytest.raises(InputError, match=r"^Layer 3: Unknown level 'x'"):
        check_option("level", "x", ("layer",), where="Layer 3: ")
    with pytest.raises(TypeError):
        allowed_values(str)
