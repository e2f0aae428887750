"""Test-only stand-in for ``sgl_kernel`` where the real kernel package cannot be installed.

PyPI's ``sgl-kernel`` wheels are CUDA builds pinned to one torch (511 MB). Two places run SGLang
without them: a CPU-only machine (the tests' real server), and the offline GPU host of
``bench/gpu_bundle.py``, whose torch is not the one the wheel is built for. SGLang imports names
(and, on CUDA, the submodules ``kvcacheio``, ``quantization`` and ``utils``) from it at import time, so those
resolve here and every name to a function that raises when called: a code
path that needs a real kernel fails loudly and names it. A few are implemented in plain torch:
``assign_req_to_token_pool_cpu`` (the one CPU call: each request's KV slots into the
request→token table), ``is_arch_support_pdl`` (no programmatic dependent launch: the
stand-in launches nothing), and the top-k / top-p renormalisations of the pytorch sampler.
``torch.ops.sgl_kernel`` stays empty, so SGLang's AMX check stays false. Only on the PYTHONPATH of
the test server or the GPU bundle's run; where the real kernel is installed it would shadow it.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

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


def is_arch_support_pdl() -> bool:
    """Programmatic dependent launch is a kernel-launch attribute of the real kernels: off."""
    return False


def top_k_renorm_prob(probs: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    """Zero every probability below a row's k-th largest, renormalise: ``p_i [p_i >= p_(k)] / Σ``."""
    k = top_ks.clamp(1, probs.shape[-1]).long().view(-1, 1)
    kth = probs.sort(dim=-1, descending=True).values.gather(-1, k - 1)
    kept = probs.where(probs >= kth, torch.zeros_like(probs))
    return kept / kept.sum(dim=-1, keepdim=True)


def top_p_renorm_prob(probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Keep a row's smallest most-likely set whose mass reaches p, renormalise."""
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(dim=-1) - sorted_p          # mass strictly before each entry
    keep_sorted = before < top_ps.view(-1, 1).to(probs.dtype)
    keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
    kept = probs.where(keep, torch.zeros_like(probs))
    return kept / kept.sum(dim=-1, keepdim=True)


def _missing(qualname: str):
    def missing(*args, **kwargs):
        raise NotImplementedError(f"{qualname} is not available in the sgl_kernel stand-in "
                                  "(tests/sglang/cpu_standins)")

    missing.__name__ = qualname.rsplit(".", 1)[-1]
    return missing


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(f"sgl_kernel.{name}")


class _StandinModule(types.ModuleType):
    """``sgl_kernel.<sub>``: this package's torch implementations by name, else a raising one."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        own = globals().get(name)
        return own if callable(own) and not isinstance(own, type) else _missing(f"{self.__name__}.{name}")


#: the submodules SGLang imports unconditionally on CUDA; any other stays missing (ImportError),
#: since SGLang treats some as optional (``sgl_kernel.scalar_type``: a mock when absent)
SUBMODULES = frozenset({"kvcacheio", "quantization", "utils"})


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``sgl_kernel.<sub>`` for each of :data:`SUBMODULES` to a :class:`_StandinModule`."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + ".") and fullname.split(".", 1)[1] in SUBMODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=False)
        return None

    def create_module(self, spec):
        return _StandinModule(spec.name)

    def exec_module(self, module):
        return None


if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.append(_SubmoduleFinder())
