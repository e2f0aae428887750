"""Test-only stand-in for ``sgl_kernel`` on a CPU-only machine (never install it).

PyPI's ``sgl-kernel`` wheels are CUDA builds; SGLang's CPU mode imports a few names from it at
import time but, on CPUs without Intel AMX, only ever *calls* ``assign_req_to_token_pool_cpu``
(it writes each request's KV slots into the request→token table). That one is implemented in
plain torch indexing; every other name resolves to a function that raises when called, so a
code path that would need a real kernel fails loudly. ``torch.ops.sgl_kernel`` stays empty, so
SGLang's AMX check stays false. Only on the PYTHONPATH of the test server (gated by
``AWP_TEST_CPU_STANDINS``); on a GPU machine it would shadow the real kernel.
"""
from __future__ import annotations

import torch


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                  start_offset: torch.Tensor, end_offset: torch.Tensor,
                                  out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """``req_to_token[r, start:end] = out_cache_loc[next (end - start) slots]`` for each request."""
    pt = 0
    for r, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = e - s
        req_to_token[r, s:e] = out_cache_loc[pt:pt + n].to(req_to_token.dtype)
        pt += n


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def _missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not available in the CPU test stand-in")

    _missing.__name__ = name
    return _missing
