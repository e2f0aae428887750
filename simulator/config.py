"""Cluster and engine constants of a simulation, each with its default and where it comes from.

Every field is a ``profiler simulate`` option (``--replicas``, ``--kv-capacity-tokens``, …).
The defaults describe **Llama-3.1-8B in bf16 on one H100 SXM 80 GB per replica**, with the step
time, KV capacity and PCIe time of the hardware roofline (:mod:`simulator.hardware`).
:func:`glm45_fit_config` gives the earlier setting (GLM-4.5-FP8 on one 8×H100 node per replica,
step time fitted on the bundled SWE-agent traces, ``--step-model glm45-fit``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from simulator.calibration import SWE_AGENT_GLM45, StepTimeModel
from simulator.settings import SimulateSettings as S
from simulator.hardware import GPUS, H100_SXM, LLAMA31_8B, MODELS, kv_capacity_tokens, pcie_s_per_token, roofline_step

#: KV bytes per token of GLM-4.5 (92 layers × 8 KV heads × 128 dims × K and V × 2 bytes, bf16 KV).
GLM45_KV_BYTES_PER_TOKEN = 92 * 8 * 128 * 2 * 2
#: Step models ``--step-model`` names.
STEP_MODELS = ("roofline", "glm45-fit")


@dataclass
class ClusterConfig:
    """Hardware and engine settings (see each field's comment for the source of its default)."""

    #: Engine replicas behind the router.
    replicas: int = 4
    #: GPUs each replica runs on (tensor parallel; ``--tp``): the job-level metrics' GPU count.
    gpus_per_replica: int = 1
    #: GPU KV capacity per replica in tokens: Llama-3.1-8B on one H100 80 GB at SGLang's mem
    #: fraction 0.9, minus 16.1 GB of weights and 4 GB of activations, over 131,072 B per token
    #: (:func:`simulator.hardware.kv_capacity_tokens`, ≈ 396k).
    kv_capacity_tokens: int = field(default_factory=lambda: kv_capacity_tokens(H100_SXM, LLAMA31_8B))
    #: Host (CPU DRAM) tier as a multiple of the GPU KV capacity: SGLang's ``--hicache-ratio``
    #: default (2.0). 0 disables the host tier.
    host_ratio: float = S.host_ratio
    #: Seconds to move one token of KV between host and GPU: 131,072 B at ~25 GB/s practical
    #: PCIe Gen5 x16 for paged copies ≈ 5.2 µs.
    pcie_s_per_token: float = field(default_factory=lambda: pcie_s_per_token(H100_SXM, LLAMA31_8B))
    #: Prefill tokens per iteration (chunked prefill): SGLang's default on 80 GB GPUs.
    chunked_prefill_size: int = S.chunked_prefill_size
    #: Cap on requests running at once on a replica (SGLang's ``--max-running-requests``).
    max_running_requests: int = S.max_running_requests
    #: Share of the running calls' future output that admission keeps free: SGLang's
    #: ``min_new_token_ratio`` (0.7 × 0.14 ≈ 0.1, the value its estimate decays to).
    new_token_ratio: float = 0.1
    #: Per-call cap of that estimate: SGLang's ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` (4096).
    new_token_clip: int = 4096
    #: Requests carry ``max_tokens`` = their real output length with ``ignore_eos`` (what
    #: ``profiler replay`` sends): SGLang 0.5.23 then reserves each running call's whole remaining
    #: output (``ratio = 1.0 if ignore_eos``, ``schedule_policy.py``), not ``new_token_ratio × clip``.
    fixed_length_requests: bool = False
    #: The replicas share one host's compute (the CPU bench: every replica on the same cores): an
    #: iteration that starts while ``m`` other replicas are mid-iteration takes ``1 + m`` times
    #: its step time (processor sharing, fixed for the iteration). False: one GPU per replica.
    shared_compute: bool = False
    #: With ``shared_compute``, how much of a step another mid-iteration replica adds: an
    #: iteration takes ``1 + compute_share × m`` times its step time. 1.0 is full processor
    #: sharing (each replica's step all on the shared cores); less when part of a step (the
    #: scheduler's single-threaded Python) runs beside the other replica on a core of its own.
    compute_share: float = 1.0
    #: Iteration time model (hardware roofline, :mod:`simulator.hardware`; or fitted,
    #: :mod:`simulator.calibration`).
    step: StepTimeModel = field(default_factory=lambda: roofline_step(H100_SXM, LLAMA31_8B))
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


def glm45_fit_config(**kw) -> ClusterConfig:
    """The earlier default: GLM-4.5-FP8 on one 8×H100 node per replica (576 GB at mem fraction 0.9
    minus ~362 GB of FP8 weights and ~20 GB of activations over 376,832 B per token ≈ 500k
    tokens; 46 KiB per GPU per token over PCIe ≈ 2 µs), step time fitted on the SWE-agent traces."""
    base = dict(kv_capacity_tokens=500_000, pcie_s_per_token=2.0e-6, step=SWE_AGENT_GLM45)
    base.update(kw)
    return ClusterConfig(**base)


def hardware_config(gpu: str = "h100-sxm", model: str = "llama-3.1-8b", tp: int = 1,
                    **kw) -> ClusterConfig:
    """A cluster of ``gpu`` × ``tp`` per replica serving ``model`` (names of
    :data:`simulator.hardware.GPUS` / ``MODELS``): roofline step, KV capacity and PCIe time."""
    if gpu not in GPUS:
        raise ValueError(f"--gpu {gpu!r}: use one of {', '.join(GPUS)}")
    if model not in MODELS:
        raise ValueError(f"--model {model!r}: use one of {', '.join(MODELS)}")
    g, m = GPUS[gpu], MODELS[model]
    base = dict(kv_capacity_tokens=kv_capacity_tokens(g, m, tp), pcie_s_per_token=pcie_s_per_token(g, m, tp),
                step=roofline_step(g, m, tp), gpus_per_replica=tp)
    base.update({k: v for k, v in kw.items() if v is not None})
    return ClusterConfig(**base)
