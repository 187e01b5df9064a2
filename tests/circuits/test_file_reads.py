"""circuits.file_reads: every way a JSON or safetensors file can be wrong is one ToolkitError naming the file."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from circuits.errors import InputError, ToolkitError
from circuits.file_reads import UnreadableFileError, load_safetensors, open_safetensors, read_json
from tests.damaged_files import forge_safetensors_header


def test_json_that_cannot_be_read_names_the_file(tmp_path):
    (tmp_path / "ok.json").write_text('{"a": [1, 2]}')
    assert read_json(tmp_path / "ok.json") == {"a": [1, 2]}
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "binary.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    (tmp_path / "broken.json").write_text('{"a": ')
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    cases = {
        "folder.json": r"folder\.json is a folder, not a JSON file",
        "binary.json": r"binary\.json is not a text file \(byte \d+ is not UTF-8\); expected a JSON file",
        "broken.json": r"broken\.json is not valid JSON \(.*\); expected a JSON file",
        "deep.json": r"deep\.json nests its JSON deeper than Python's parser follows",
        "missing.json": r"missing\.json does not exist; expected a JSON file",
    }
    for name, message in cases.items():
        with pytest.raises(UnreadableFileError, match=message):
            read_json(tmp_path / name)
    # callers choose their own class (and what the file should be, and what to do)
    with pytest.raises(InputError, match=r"broken\.json is not valid JSON .*expected a graph\. Pass another\."):
        read_json(tmp_path / "broken.json", "a graph", error=InputError, hint="Pass another.")
    assert issubclass(UnreadableFileError, (ToolkitError, ValueError))


def test_forged_safetensors_headers_name_the_file(tmp_path):
    good = tmp_path / "good.safetensors"
    save_file({"w": torch.ones(4, 4), "b": torch.zeros(3)}, str(good))
    assert torch.equal(load_safetensors(good)["w"], torch.ones(4, 4))
    with open_safetensors(good) as f:
        assert sorted(f.keys()) == ["b", "w"]
    forged = tmp_path / "forged.safetensors"
    forged.write_bytes(good.read_bytes())
    forge_safetensors_header(forged)
    for read in (load_safetensors, open_safetensors):
        with pytest.raises(UnreadableFileError, match=r"forged\.safetensors is not a readable safetensors file "
                                                      r"\(.*header.*\)\. Save it again\."):
            read(forged, hint="Save it again.")
    with pytest.raises(InputError, match=r"expert 1: .*a_folder is a folder, not a safetensors file"):
        (tmp_path / "a_folder").mkdir()
        load_safetensors(tmp_path / "a_folder", error=InputError, prefix="expert 1: ")
    with pytest.raises(UnreadableFileError, match=r"nothing\.safetensors does not exist"):
        load_safetensors(tmp_path / "nothing.safetensors")
