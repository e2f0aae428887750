"""Step time from hardware: a named GPU and model, turned into :class:`StepTimeModel` by a roofline.

One engine iteration reads the weights once, reads the KV cache of every sequence it touches and
does the matrix work of every token it processes. Each of those is priced at the GPU's datasheet
rate times an efficiency (what kernels reach in practice), and the iteration costs their **sum**
(no overlap of compute and memory traffic inside one iteration: an upper-bound roofline, the
conservative side for every policy alike)::

    iteration = overhead + W / (B·η_B)                       weights, once per iteration
              + Σ_decoding (2N / (F·η_F))                     one token of GEMMs per sequence
              + Σ_decoding K_i · (kv_B / (B·η_B) + 4·L·H·d / (F·η_F))   KV read + attention
              + Σ_prefill P_j · 2N / (F·η_F)                  GEMMs of the new prompt tokens
              + Σ_prefill P_j · (ctx_j + P_j/2) · 4·L·H·d / (F·η_F)   causal attention
              + Σ_prefill ctx_j · kv_B / (B·η_B)              the cached prefix's KV, read once

``W`` weight bytes, ``N`` parameters, ``B`` HBM bandwidth, ``F`` dense bf16 FLOP/s, ``kv_B`` KV
bytes per token (``2·L·H_kv·d·bytes``), ``L`` layers, ``H`` query heads, ``d`` head dim,
``K_i`` context of decoding sequence ``i``, ``P_j`` prompt tokens computed for call ``j`` (cache
hits are not computed), ``ctx_j`` its context before them. A call served entirely from the cache
computes one token and reads its prefix once: no per-context prefill charge beyond that read.

Constants and sources:

* H100 SXM5 80 GB: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16 (NVIDIA H100 datasheet);
  H200 141 GB: 4.8 TB/s, 989 TFLOP/s (NVIDIA H200 datasheet).
* Efficiencies ``η_B = 0.80`` (paged-attention and GEMV kernels reach 75–85 % of HBM bandwidth),
  ``η_F = 0.55`` (prefill MFU of FlashAttention-2/3 + cuBLAS on H100), overhead 2 ms per iteration
  (scheduler, sampling, kernel launches with CUDA graphs): **calibratable** — fit them on a real
  engine's ``profiler replay`` timings with :func:`simulator.calibration.fit_step_time`, or pass
  another :class:`GPU` with measured effective rates.
* Llama-3.1-8B: 8.03 B parameters, 32 layers, 32 query heads, 8 KV heads, head dim 128, bf16
  (its ``config.json``): 16.1 GB of weights, 131,072 KV bytes per token.

KV capacity per replica (:func:`kv_capacity_tokens`): ``(mem_fraction · HBM − W − activations)
/ kv_B`` with SGLang's ``--mem-fraction-static`` 0.9 (its default on 80 GB GPUs is about that) and
4 GB of activations and CUDA graphs: ≈ 396k tokens for Llama-3.1-8B on one H100 80 GB.
"""
from __future__ import annotations

from dataclasses import dataclass

from simulator.calibration import StepTimeModel


@dataclass(frozen=True)
class GPU:
    """Datasheet rates of one GPU and the efficiencies kernels reach on it."""

    name: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    dense_flops: float
    pcie_bytes_per_s: float = 25e9
    hbm_efficiency: float = 0.80
    flops_efficiency: float = 0.55
    overhead_s: float = 0.002


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a dense decoder-only transformer (the fields of its ``config.json``)."""

    name: str
    params: float
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    bytes_per_param: float = 2.0
    kv_bytes_per_elem: float = 2.0

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_elem


H100_SXM = GPU("H100 SXM 80GB", 80e9, 3.35e12, 989e12)
H200 = GPU("H200 141GB", 141e9, 4.8e12, 989e12)
LLAMA31_8B = ModelSpec("Llama-3.1-8B", 8.03e9, 32, 32, 8, 128)
LLAMA31_70B = ModelSpec("Llama-3.1-70B", 70.6e9, 80, 64, 8, 128)
GPUS = {"h100-sxm": H100_SXM, "h200": H200}
MODELS = {"llama-3.1-8b": LLAMA31_8B, "llama-3.1-70b": LLAMA31_70B}


def roofline_step(gpu: GPU, model: ModelSpec, tp: int = 1) -> StepTimeModel:
    """The iteration model of the module docstring as :class:`StepTimeModel` coefficients, for
    ``tp`` GPUs in tensor parallel (rates × ``tp``; communication not priced)."""
    bw = gpu.hbm_bytes_per_s * gpu.hbm_efficiency * tp
    fl = gpu.dense_flops * gpu.flops_efficiency * tp
    gemm = 2 * model.params / fl
    attn = 4 * model.layers * model.q_heads * model.head_dim / fl
    kv_read = model.kv_bytes_per_token / bw
    t0 = gpu.overhead_s + model.weight_bytes / bw
    return StepTimeModel(
        t0=t0, a=gemm, a_ctx=kv_read, c=kv_read + attn, e=gemm, a_attn=attn, prefill_t0=t0,
        source=f"roofline: {model.name} on {tp}× {gpu.name}",
    )


def kv_capacity_tokens(gpu: GPU, model: ModelSpec, tp: int = 1, mem_fraction: float = 0.9,
                       activation_bytes: float = 4e9) -> int:
    """GPU KV tokens per replica (module docstring)."""
    free = mem_fraction * gpu.hbm_bytes * tp - model.weight_bytes - activation_bytes * tp
    if free <= 0:
        raise ValueError(f"{model.name} does not fit {tp}× {gpu.name}: raise the tensor parallelism")
    return int(free / model.kv_bytes_per_token)


def pcie_s_per_token(gpu: GPU, model: ModelSpec, tp: int = 1) -> float:
    """Seconds to move one token of KV between host and GPU (each GPU moves its shard)."""
    return model.kv_bytes_per_token / (gpu.pcie_bytes_per_s * tp)
