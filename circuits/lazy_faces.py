"""Package faces whose names load on first use.

A face (a package's ``__init__.py``) lists what a researcher imports first. Importing it must not load torch: the
command lines parse their flags and answer ``--help`` from torch-free modules (the catalogues) that sit inside the
same packages, and Python runs every parent package's ``__init__`` first. So a face names where each of its names
lives and imports that module when the name is first read::

    __getattr__, __dir__ = lazy_face(__name__, globals(), {"path_patch": "patching.node_level.path_patching"},
                                     submodules=("edges",))
"""

from __future__ import annotations

import importlib
from typing import Callable, Mapping, Sequence


def lazy_face(package: str, namespace: dict, exports: Mapping[str, str],
              submodules: Sequence[str] = ()) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of the face ``package`` (its ``globals()``: ``namespace``).

    ``exports``: name -> the module that defines it; ``submodules``: sub-packages reachable as attributes. A name read
    once is stored in the face, so later reads skip ``__getattr__``.
    """

    def __getattr__(name: str):
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            namespace[name] = value
            return value
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())) | set(exports))

    return __getattr__, __dir__
