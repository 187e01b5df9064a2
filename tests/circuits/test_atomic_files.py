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


def test_a_folder_as_destination_is_refused_and_kept(tmp_path):
    from circuits.atomic_files import UnwritableDestinationError

    folder = tmp_path / "graph.json"
    (folder / "inside.txt").parent.mkdir()
    (folder / "inside.txt").write_text("mine")
    with pytest.raises(UnwritableDestinationError, match="is a folder, and a file is written here"):
        write_text_atomic(folder, "x")
    assert (folder / "inside.txt").read_text() == "mine"


@pytest.mark.parametrize("where", ["under_a_file", "proc"])
def test_a_destination_whose_folder_cannot_be_made_is_one_clear_error(tmp_path, where):
    from circuits.atomic_files import UnwritableDestinationError

    if where == "under_a_file":
        (tmp_path / "plain.txt").write_text("mine")
        path = tmp_path / "plain.txt" / "x.json"
    else:
        if not os.path.isdir("/proc/self"):
            pytest.skip("no /proc on this system")
        path = "/proc/no-such-folder/x.json"
    with pytest.raises(UnwritableDestinationError, match="Cannot write .*Choose a path in a folder you can write"):
        write_text_atomic(path, "x")
    if where == "under_a_file":
        assert (tmp_path / "plain.txt").read_text() == "mine"
