"""tests/sglang/cpu_standins: the ``sgl_kernel`` stand-in and the CUDA-host patches, on CPU.

The stand-in is loaded under another name (its submodule finder is keyed on the package's own
name), so nothing here shadows a real ``sgl_kernel`` for other tests."""
from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

torch = pytest.importorskip("torch")

from bench.gpu_bundle import REPO  # noqa: E402
from tests.sglang.cpu_standins import awp_cpu_standins as standins  # noqa: E402

NAME = "sgl_kernel_standin_under_test"


@pytest.fixture(scope="module")
def kernel():
    path = REPO / "tests" / "sglang" / "cpu_standins" / "sgl_kernel" / "__init__.py"
    spec = importlib.util.spec_from_file_location(NAME, path, submodule_search_locations=[])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = mod
    spec.loader.exec_module(mod)
    yield mod
    for key in [k for k in sys.modules if k == NAME or k.startswith(NAME + ".")]:
        del sys.modules[key]


def test_the_submodules_sglang_imports_on_cuda_resolve_and_others_stay_missing(kernel) -> None:
    """``kvcacheio``, ``quantization`` and ``utils`` import (SGLang imports them unguarded on
    CUDA); ``scalar_type`` stays an ImportError, which SGLang answers with its own mock."""
    kvcacheio = importlib.import_module(f"{NAME}.kvcacheio")
    assert importlib.import_module(f"{NAME}.utils").is_arch_support_pdl() is False
    importlib.import_module(f"{NAME}.quantization")
    with pytest.raises(NotImplementedError, match=rf"{NAME}\.kvcacheio\.transfer_kv_direct is not available"):
        kvcacheio.transfer_kv_direct([], [], None, None)
    with pytest.raises(ImportError):
        importlib.import_module(f"{NAME}.scalar_type")
    with pytest.raises(NotImplementedError, match="rmsnorm"):
        kernel.rmsnorm(torch.ones(2))


def test_the_renormalisations_keep_the_top_k_and_the_top_p_mass(kernel) -> None:
    p = torch.tensor([[0.5, 0.25, 0.15, 0.1], [0.1, 0.6, 0.2, 0.1]])
    k = kernel.top_k_renorm_prob(p, torch.tensor([2, 1]))
    assert torch.allclose(k, torch.tensor([[2 / 3, 1 / 3, 0, 0], [0, 1.0, 0, 0]]))
    top_p = kernel.top_p_renorm_prob(p, torch.tensor([0.7, 0.65]))
    assert torch.allclose(top_p, torch.tensor([[2 / 3, 1 / 3, 0, 0], [0, 0.75, 0.25, 0]]))


def test_the_direct_io_copy_indexes_each_side_on_its_own_device() -> None:
    src = [torch.arange(12.0).view(6, 2), torch.arange(12.0, 24.0).view(6, 2)]
    dst = [torch.zeros(4, 2), torch.zeros(4, 2)]
    standins.copy_across_devices(src, dst, torch.tensor([5, 0]), torch.tensor([1, 3]))
    assert torch.equal(dst[0][1], src[0][5]) and torch.equal(dst[1][3], src[1][0])
    assert dst[0][0].abs().sum() == 0 and dst[0][2].abs().sum() == 0


def test_the_gpu_patches_apply_only_with_their_switch_on_a_gpu(monkeypatch) -> None:
    """``register_gpu`` swaps the KV store's JIT check and HiCache's direct copy for torch only
    with ``AWP_GPU_STANDINS=1`` on a CUDA host (SGLang's modules faked here)."""
    import types

    fakes = {name: types.ModuleType(name) for name in (
        "sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.mem_cache.memory_pool",
        "sglang.srt.mem_cache.pool_host", "sglang.srt.mem_cache.pool_host.mha")}
    pool, mha = fakes["sglang.srt.mem_cache.memory_pool"], fakes["sglang.srt.mem_cache.pool_host.mha"]
    original = object()
    pool.can_use_store_cache = mha.transfer_kv_direct = original
    for name, mod in fakes.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setenv(standins.GPU_STANDINS_ENV, "1")
    standins.register_gpu()                                  # no GPU here
    assert pool.can_use_store_cache is original and mha.transfer_kv_direct is original
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv(standins.GPU_STANDINS_ENV)
    standins.register_gpu()                                  # a GPU, no switch
    assert pool.can_use_store_cache is original and mha.transfer_kv_direct is original
    monkeypatch.setenv(standins.GPU_STANDINS_ENV, "1")
    standins.register_gpu()
    assert pool.can_use_store_cache(1024, 1024) is False
    assert mha.transfer_kv_direct is standins.copy_across_devices
