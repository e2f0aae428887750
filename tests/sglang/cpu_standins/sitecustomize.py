"""Test-only import shim for a real SGLang server on a CPU-only machine (see ../README notes).

This folder is put on the ``PYTHONPATH`` of the SGLang server that ``tests/sglang/
test_real_server.py`` starts, and of nothing else. Python imports ``sitecustomize`` in every
process at start-up, including each scheduler/detokenizer process SGLang spawns; when
``AWP_TEST_CPU_STANDINS=1`` it installs the same ``triton``/``torchvision`` stand-ins the
in-process tests use (``tests/sglang/conftest.py``, loaded by path, installs them on import).
Without the variable it does nothing, so a stray copy on a GPU machine cannot shadow anything.
"""
import os

if os.environ.get("AWP_TEST_CPU_STANDINS") == "1":
    import importlib.util
    import sys
    from pathlib import Path

    _conftest = Path(__file__).resolve().parent.parent / "conftest.py"
    _spec = importlib.util.spec_from_file_location("_awp_sglang_cpu_shim", _conftest)
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _mod
    _spec.loader.exec_module(_mod)  # installs the stand-ins when sglang is installed
