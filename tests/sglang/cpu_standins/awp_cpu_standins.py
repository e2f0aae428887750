"""Test-only SGLang plugin: the CPU patches a real server needs here, applied in every server process.

SGLang loads plugins (entry-point group ``sglang.srt.plugins``) in the scheduler before it builds
the cache, which is where these must run. Three are the ones the in-process HiCache test applies
(``tests/sglang/test_sglang_prefetch.py``): the host pool is allocated without pinning (the CUDA
host-register assertion), ``torch.cpu.Stream.synchronize`` becomes the no-op CUDA streams have,
and the ``direct`` IO backend's CUDA copy kernel is replaced by plain torch indexing.

The fourth makes a prefix-cache hit save attention work on CPU as it does on GPU.
SGLang's torch-native backend (the one attention backend that runs on CPU) computes an extend's
attention for *every* position of the sequence, the cached prefix included (queries padded to the
full length, ``per_req_query_redudant``), then keeps the new positions' rows: a cached prefix of
P tokens saves the linear layers' work on P but none of the attention's, which costs
O((P + n)²) per extend instead of the O(n · (P + n)) of the GPU kernels (FlashInfer, Triton,
FA3). :func:`extend_attention_new_tokens` attends with the n new queries only, under the causal
mask aligned to the sequence's end (``causal_lower_right``): the same rows, bit for bit up to
floating-point order. ``AWP_CPU_EXTEND_ATTENTION=sglang`` keeps SGLang's own.

Does nothing when CUDA is available or ``AWP_TEST_CPU_STANDINS`` is not ``1``.

On a CUDA host without ``sgl-kernel`` (``bench/gpu_bundle.py``'s offline GPU run,
``AWP_GPU_STANDINS=1``) two other patches keep every call on torch: the KV store takes SGLang's
plain indexed write instead of its JIT ``store_cache`` kernel, and HiCache's ``direct`` IO backend
copies host↔device by torch indexing instead of ``sgl_kernel.kvcacheio.transfer_kv_direct``.
"""
from __future__ import annotations

import os

#: ``AWP_CPU_EXTEND_ATTENTION``: ``new-tokens`` (the default; :func:`extend_attention_new_tokens`)
#: or ``sglang`` (the torch-native backend's whole-sequence extend); ``bench_engine`` reads these
EXTEND_ATTENTION_ENV = "AWP_CPU_EXTEND_ATTENTION"
EXTEND_ATTENTION_CHOICES = ("new-tokens", "sglang")


def extend_attention_new_tokens(original):
    """A ``TorchNativeAttnBackend._run_sdpa_forward_extend`` that attends with the new tokens'
    queries only (causal, aligned to the end of the sequence); ``original`` serves what it does not
    cover (encoder-decoder, cross attention, sliding windows, non-causal)."""
    import torch
    from torch.nn.attention.bias import causal_lower_right
    from torch.nn.functional import scaled_dot_product_attention

    def run(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
            extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None, enable_gqa=False,
            causal=False, is_cross_attn=False, sliding_window_size=None):
        if encoder_lens is not None or is_cross_attn or not causal or (
                sliding_window_size is not None and sliding_window_size > -1):
            return original(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                            extend_prefix_lens, extend_seq_lens, encoder_lens, scaling=scaling,
                            enable_gqa=enable_gqa, causal=causal, is_cross_attn=is_cross_attn,
                            sliding_window_size=sliding_window_size)
        query = query.movedim(0, query.dim() - 2)        # [heads, tokens, head_size]
        start_q = 0
        for i in range(seq_lens.shape[0]):
            n, kv_len = int(extend_seq_lens[i]), int(seq_lens[i])
            end_q = start_q + n
            q = query[:, start_q:end_q, :]
            tokens = req_to_token[req_pool_indices[i], :kv_len]
            k = k_cache[tokens].movedim(0, query.dim() - 2)
            v = v_cache[tokens].movedim(0, query.dim() - 2)
            if not (q.dtype == k.dtype == v.dtype):
                k, v = k.to(q.dtype), v.to(q.dtype)
            mask = None if n == kv_len else causal_lower_right(n, kv_len)
            out = scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask,
                                               is_causal=mask is None, scale=scaling, enable_gqa=enable_gqa)
            output[start_q:end_q, :, :] = out.squeeze(0).movedim(query.dim() - 2, 0)
            start_q = end_q
        return output

    run.awp_original = original
    return run


#: set on a CUDA host that runs SGLang without ``sgl-kernel`` (bench/gpu_device_run.sh)
GPU_STANDINS_ENV = "AWP_GPU_STANDINS"


def copy_across_devices(src_layers, dst_layers, src_indices, dst_indices, page_size=1, **_) -> None:
    """``transfer_kv_direct`` in torch: ``dst[dst_indices] = src[src_indices]`` per layer, each side
    indexed on its own device (host pool ↔ GPU pool); a copy to the host blocks, since the host
    side indexes the copied rows at once."""
    for src, dst in zip(src_layers, dst_layers, strict=True):
        rows = src[src_indices.to(src.device)].to(dst.device, non_blocking=dst.device.type == "cuda")
        dst[dst_indices.to(dst.device)] = rows


def register_gpu() -> None:
    """The CUDA-without-sgl-kernel patches (module doc); a no-op unless ``AWP_GPU_STANDINS=1``."""
    import torch

    if os.environ.get(GPU_STANDINS_ENV) != "1" or not torch.cuda.is_available():
        return
    import sglang.srt.mem_cache.memory_pool as memory_pool
    import sglang.srt.mem_cache.pool_host.mha as mha_host

    memory_pool.can_use_store_cache = lambda *a, **k: False
    mha_host.transfer_kv_direct = copy_across_devices


def register() -> None:
    import torch

    register_gpu()
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
    if os.environ.get(EXTEND_ATTENTION_ENV, EXTEND_ATTENTION_CHOICES[0]) == "new-tokens":
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        current = TorchNativeAttnBackend._run_sdpa_forward_extend
        if not hasattr(current, "awp_original"):
            TorchNativeAttnBackend._run_sdpa_forward_extend = extend_attention_new_tokens(current)
