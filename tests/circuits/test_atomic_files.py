"""circuits.atomic_files: a write either completes or leaves the old file; circuits.options: one check for string options."""

import os
from typing import Literal

import pytest

from circuits.atomic_files import atomic_path, write_text_atomic
from circuits.errors import InputError
from circuits.options import allowed_values, check_option


def test_a_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a" / "b.txt"
    write_text_atomic(path, "first")
    write_text_atomic(path, "second")
    assert path.read_text() == "second" and os.listdir(path.parent) == ["b.txt"]
    assert path.stat().st_mode & 0o777 == 0o644


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    write_text_atomic(path, "old")
    with pytest.raises(RuntimeError, match="crash"):
        with atomic_path(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["r.json"]


def test_check_option_reads_the_allowed_values_from_a_literal():
    Mode = Literal["fast", "hooks"]
    assert allowed_values(Mode) == ("fast", "hooks") and allowed_values(("a", "b")) == ("a", "b")
    assert check_option("method", "fast", Mode) == "fast"
    with pytest.raises(InputError, match=r"Unknown method 'slow': use one of 'fast', 'hooks'\."):
        check_option("method", "slow", Mode)
