"""Cluster and engine constants of a simulation, each with its default and where it comes from.

Every field is a ``profiler simulate`` option (``--replicas``, ``--kv-capacity-tokens``, …).
The defaults describe the setting the step-time model was calibrated on
(:data:`simulator.calibration.SWE_AGENT_GLM45`): GLM-4.5-FP8 served with tensor parallelism on
one 8-GPU node per replica.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from simulator.calibration import SWE_AGENT_GLM45, StepTimeModel

#: KV bytes per token of GLM-4.5 (92 layers × 8 KV heads × 128 dims × K and V × 2 bytes, bf16 KV).
GLM45_KV_BYTES_PER_TOKEN = 92 * 8 * 128 * 2 * 2


@dataclass
class ClusterConfig:
    """Hardware and engine settings (see each field's comment for the source of its default)."""

    #: Engine replicas behind the router.
    replicas: int = 4
    #: GPU KV capacity per replica in tokens. 8×H100-80GB at SGLang's mem fraction 0.9 = 576 GB,
    #: minus ~362 GB of FP8 weights and ~20 GB of activations/graphs, over 376,832 B per token.
    kv_capacity_tokens: int = 500_000
    #: Host (CPU DRAM) tier as a multiple of the GPU KV capacity: SGLang's ``--hicache-ratio``
    #: default (2.0). 0 disables the host tier.
    host_ratio: float = 2.0
    #: Seconds to move one token of KV between host and GPU: 376,832 B over 8 GPUs = 46 KiB per
    #: GPU per token at ~25 GB/s practical PCIe Gen5 x16 for paged copies ≈ 1.9 µs.
    pcie_s_per_token: float = 2.0e-6
    #: Prefill tokens per iteration (chunked prefill): SGLang's default on 80 GB GPUs.
    chunked_prefill_size: int = 8192
    #: Cap on requests running at once on a replica (SGLang's ``--max-running-requests``).
    max_running_requests: int = 256
    #: Share of the running calls' future output that admission keeps free: SGLang's
    #: ``min_new_token_ratio`` (0.7 × 0.14 ≈ 0.1, the value its estimate decays to).
    new_token_ratio: float = 0.1
    #: Per-call cap of that estimate: SGLang's ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` (4096).
    new_token_clip: int = 4096
    #: Iteration time model (calibrated, see :mod:`simulator.calibration`).
    step: StepTimeModel = field(default_factory=lambda: SWE_AGENT_GLM45)
    #: Largest number of identical decode iterations simulated as one event (exact arithmetic;
    #: only bounds how far ahead eviction frees memory for decode growth).
    max_macro_steps: int = 256

    @property
    def host_capacity_tokens(self) -> int:
        return int(self.kv_capacity_tokens * self.host_ratio)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["step"] = self.step.to_dict()
        return d
