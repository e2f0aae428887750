"""Test-only SGLang plugin: the three CPU patches HiCache needs, applied in every server process.

SGLang loads plugins (entry-point group ``sglang.srt.plugins``) in the scheduler before it builds
the cache, which is where these must run. They are the ones the in-process HiCache test applies
(``tests/sglang/test_sglang_prefetch.py``): the host pool is allocated without pinning (the CUDA
host-register assertion), ``torch.cpu.Stream.synchronize`` becomes the no-op CUDA streams have,
and the ``direct`` IO backend's CUDA copy kernel is replaced by plain torch indexing. Does
nothing when CUDA is available or ``AWP_TEST_CPU_STANDINS`` is not ``1``.
"""
from __future__ import annotations

import os


def register() -> None:
    import torch

    if os.environ.get("AWP_TEST_CPU_STANDINS") != "1" or torch.cuda.is_available():
        return
    import sglang.srt.mem_cache.pool_host.common as host_common
    import sglang.srt.mem_cache.pool_host.mha as mha_host

    def alloc_unpinned(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
        return host_common.alloc_with_host_register(dims, dtype, device, False, allocator,
                                                    registration_granularity_bytes)

    def copy_direct(src_layers, dst_layers, src_indices, dst_indices, page_size=1, **_):
        for src, dst in zip(src_layers, dst_layers, strict=True):
            dst[dst_indices] = src[src_indices]

    funcs = host_common.ALLOC_MEMORY_FUNCS
    funcs.default_factory = lambda: alloc_unpinned
    for key in list(funcs):
        funcs[key] = alloc_unpinned
    torch.cpu.Stream.synchronize = lambda self: None
    mha_host.transfer_kv_direct = copy_direct
