"""circuits.atomic_files: a write either completes or leaves the old file."""

import os

import pytest

from circuits.atomic_files import atomic_path, write_text_atomic


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
