"""circuits.lazy_faces: a face's names load their module on first read, and only then."""

import subprocess
import sys

import pytest

from circuits.lazy_faces import lazy_face


def test_a_name_loads_its_module_on_first_read_and_is_kept():
    namespace = {"__all__": ["sqrt", "json"]}
    getattr_, dir_ = lazy_face("demo", namespace, {"sqrt": "math"}, submodules=())
    assert getattr_("sqrt")(9.0) == 3.0 and "sqrt" in namespace  # stored: later reads skip __getattr__
    assert dir_() == sorted({"__all__", "sqrt", "json"})
    with pytest.raises(AttributeError, match="module 'demo' has no attribute 'cosine'"):
        getattr_("cosine")


def test_importing_every_face_loads_no_torch():
    code = ("import sys, circuits, patching, patching.edges, finetune, merging, merging.methods; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformer_lens')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
