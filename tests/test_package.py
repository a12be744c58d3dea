"""The public API: lazy, fast to import, and every class pinned to the `diffusers_ext` module."""

import importlib
import os
import subprocess
import sys

import diffusers_ext


def _run(code: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout


def test_import_loads_neither_torch_nor_diffusers():
    out = _run(
        "import sys, diffusers_ext; print(sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))"
    )
    assert eval(out) == []


def test_import_time_within_1_5x_of_diffusers():
    code = "import time; t = time.perf_counter(); import {}; print(time.perf_counter() - t)"
    # Interleaved runs, best of three each: the machine is shared and noisy.
    ours, theirs = [], []
    for _ in range(3):
        theirs.append(float(_run(code.format("diffusers"))))
        ours.append(float(_run(code.format("diffusers_ext"))))
    assert min(ours) < 1.5 * min(theirs), (ours, theirs)


def test_every_public_name_resolves_and_classes_are_pinned():
    for module_name, names in diffusers_ext._import_structure.items():
        module = importlib.import_module(f"diffusers_ext.{module_name}")
        for name in names:
            obj = getattr(diffusers_ext, name)
            assert obj is getattr(module, name)
            if isinstance(obj, type) and module_name != "_mixins":
                assert obj.__module__ == "diffusers_ext", name
    assert isinstance(diffusers_ext.__version__, str)
