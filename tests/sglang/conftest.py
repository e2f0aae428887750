"""pytest wiring for the tests that drive the real ``sglang`` package on CPU.

* Imports sglang once per test session, after installing the import shim below.
* Every test here is marked ``sglang`` and skipped, with the reason, when sglang is not
  installed (``pip install -e .[sglang]`` on a GPU box, or the CPU-only stack of ``.ci/run``).
* A session fixture publishes a test server config (SGLang's own test pattern,
  ``get_context().override_server_args(...).install()``) and loads plugins the way an SGLang
  process does, through the ``sglang.srt.plugins`` entry points.

Import shim
-----------
sglang imports ``triton`` (and, through some model modules, ``torchvision``) at import time.
Neither works beside the CPU build of torch: there is no CPU triton wheel, and PyPI's
torchvision is a CUDA build that fails with ``operator torchvision::nms does not exist``.
sglang ships stand-ins for Apple Silicon in ``sglang/_platform_stubs.py`` but only installs
them on macOS/arm64; this file loads that module *without importing the sglang package*
(whose ``__init__`` already needs triton) and registers the same triton stand-ins, plus a
stand-in ``torchvision`` after transformers has recorded that torchvision is unavailable.
Nothing is compiled or run through them: the tests drive sglang's Python scheduling and
radix-cache code, which only needs the imports to succeed.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

import pytest


def _sglang_package_dir() -> Path | None:
    """Where the installed sglang package lives, found without importing it.

    A namespace-package match (``origin`` None) is not sglang: this test folder is itself
    called ``sglang`` and may be found that way when ``tests/`` is on ``sys.path``.
    """
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.origin).parent
    return path if (path / "_platform_stubs.py").is_file() else None


def _load_platform_stubs():
    package_dir = _sglang_package_dir()
    if package_dir is None:
        return None
    path = package_dir / "_platform_stubs.py"
    mod_spec = importlib.util.spec_from_file_location("_sglang_platform_stubs_shim", path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[mod_spec.name] = module  # its dataclasses look their module up there
    mod_spec.loader.exec_module(module)
    return module


def _install_triton_stub(stubs) -> None:
    """The triton half of ``sglang._platform_stubs.install_platform_stubs``."""
    if "triton" in sys.modules or importlib.util.find_spec("triton") is not None:
        return
    sys.meta_path.insert(0, stubs._TritonFinder())
    mk = stubs._make_mock
    triton = mk("triton")
    triton.__version__ = "3.0.0"
    triton.cdiv = stubs._cdiv
    triton.next_power_of_2 = stubs._next_power_of_2
    triton.Config = stubs._Config

    class _constexpr:
        def __init__(self, value=None):
            self.value = value

    tl = mk("triton.language")
    tl.constexpr = _constexpr
    triton.language = tl
    tl.extra = mk("triton.language.extra")
    tl.extra.libdevice = mk("triton.language.extra.libdevice")
    runtime = mk("triton.runtime")
    triton.runtime = runtime
    jit_mod = mk("triton.runtime.jit")
    jit_mod.JITFunction = type("JITFunction", (), {})
    jit_mod.KernelInterface = type("KernelInterface", (stubs._StubBase,), {})
    runtime.jit = jit_mod
    cache_mod = mk("triton.runtime.cache")
    cache_mod.triton_key = stubs._triton_key
    runtime.cache = cache_mod
    autotuner = mk("triton.runtime.autotuner")
    autotuner.OutOfResources = type("OutOfResources", (Exception,), {})
    autotuner.PTXASError = type("PTXASError", (Exception,), {})
    runtime.autotuner = autotuner
    compiler_root = mk("triton.compiler")
    compiler_root.CompiledKernel = type("CompiledKernel", (stubs._StubBase,), {})
    compiler_impl = mk("triton.compiler.compiler")
    compiler_impl.ASTSource = type("ASTSource", (stubs._StubBase,), {})
    compiler_impl.triton_key = stubs._triton_key
    compiler_root.compiler = compiler_impl
    triton.compiler = compiler_root
    runtime.driver = mk("triton.runtime.driver")
    triton.testing = mk("triton.testing")
    tools = mk("triton.tools")
    triton.tools = tools
    tools.tensor_descriptor = mk("triton.tools.tensor_descriptor")
    backends = mk("triton.backends")
    triton.backends = backends
    compiler = mk("triton.backends.compiler")
    compiler.GPUTarget = type("GPUTarget", (stubs._StubBase,), {})
    backends.compiler = compiler


class _PrefixFinder:
    """Meta-path finder that answers every ``<prefix>.*`` import with a stand-in module."""

    def __init__(self, stubs, prefix: str):
        self.stubs, self.prefix = stubs, prefix

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.prefix and not fullname.startswith(self.prefix + "."):
            return None
        if fullname not in sys.modules:
            mod = self.stubs._make_mock(fullname)
            parent, _, child = fullname.rpartition(".")
            if parent in sys.modules:
                setattr(sys.modules[parent], child, mod)
        return sys.modules[fullname].__spec__


def _stub_torchvision(stubs) -> None:
    """Stand-in ``torchvision`` for sglang's unconditional imports; transformers is told it is
    unavailable first (its availability flags are computed at its own import)."""
    if "torchvision" in sys.modules:
        return
    import transformers.utils.import_utils as iu  # computes its flags before the stub exists

    if hasattr(iu, "is_torchvision_available") and hasattr(iu.is_torchvision_available, "cache_clear"):
        iu.is_torchvision_available.cache_clear()
    assert not iu.is_torchvision_available(), "a real torchvision is installed; the shim is not needed"
    sys.meta_path.insert(0, _PrefixFinder(stubs, "torchvision"))
    stubs._make_mock("torchvision")


def install() -> bool:
    """Install the stand-ins; return False when sglang is not installed."""
    os.environ.setdefault("SGLANG_RUST_BUILD_MODE", "never")  # never try to cargo-build here
    stubs = _load_platform_stubs()
    if stubs is None:
        return False
    _install_triton_stub(stubs)
    _stub_torchvision(stubs)
    return True


SGLANG_INSTALLED = _sglang_package_dir() is not None
SKIP_REASON = (
    "sglang is not installed: `pip install -e .[sglang]` (GPU) or the CPU-only stack that "
    ".ci/run installs (see README, SGLang section)"
)
if SGLANG_INSTALLED:
    install()


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.sglang)
            if not SGLANG_INSTALLED:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def sglang_runtime():
    """A published test server config with priority scheduling, and our plugin loaded."""
    if not SGLANG_INSTALLED:
        pytest.skip(SKIP_REASON)
    from sglang.srt import plugins
    from sglang.srt.runtime_context import get_context

    override = get_context().override_server_args(
        enable_priority_scheduling=True, schedule_policy="fcfs"
    )
    from serving_hooks.sglang_plugin.state import reset_state

    server_args = override.install()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWP_SGLANG_PLUGIN", "1")   # the plugin is opt-in
        reset_state()                         # settings read with it
        plugins.load_plugins()  # discovers serving_hooks.sglang_plugin:register by entry point
    yield server_args
    override.restore()


class FakeClock:
    """The plugin's clock, set by hand (``clock.t = …``)."""

    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(request):
    """A fresh plugin state on a :class:`FakeClock` starting at the module's ``CLOCK_START``.

    Decisions use that clock (``decision_clock="local"``), not the request clock a server uses."""
    from dataclasses import replace

    from serving_hooks.sglang_plugin.state import PluginState, get_state, reset_state

    c = FakeClock(getattr(request.module, "CLOCK_START", 0.0))
    reset_state(PluginState(replace(get_state().settings, decision_clock="local"), clock=c))
    yield c
    reset_state()
