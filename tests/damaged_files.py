"""Files damaged the ways a user's files get damaged, for the tests of every reader: a forged safetensors header
(with the manifest refreshed, so only the reader can notice), a changed tensor of the same size.

Cross-cutting: a helper of tests/circuits, tests/merging and tests/finetune; it imports nothing from the toolkit
but the manifest writer.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path


def forge_safetensors_header(path: str | Path) -> Path:
    """Rewrite ``path``'s header so its first tensor claims bytes past the end of the file (same file otherwise)."""
    path = Path(path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    first = next(k for k in header if k != "__metadata__")
    header[first]["data_offsets"] = [0, len(raw) * 4]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    return path


def change_a_tensor(path: str | Path) -> Path:
    """Flip one byte near the end of ``path`` (a tensor's data, not the header): same size, other content."""
    path = Path(path)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40
    path.write_bytes(bytes(data))
    return path


def refresh_manifest(directory: str | Path, manifest: str = "manifest.json") -> None:
    """Recompute the sizes and sha256 in ``directory``'s manifest, as someone covering up an edit would."""
    from circuits.model_cache import file_entries

    directory = Path(directory)
    data = json.loads((directory / manifest).read_text())
    data["files"] = file_entries(directory, exclude=(manifest,))
    (directory / manifest).write_text(json.dumps(data))
