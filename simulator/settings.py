"""The tuning knobs of ``profiler simulate``: the cluster's engine constants, the autoscaler's
rules, ``ours``' policy overrides and the measurement window, declared once as the fields of
:class:`SimulateSettings` (the mechanism of ``serving_hooks/settings.py``).

They are config keys (``simulate --config FILE``, TOML) and ``PROFILER_SIMULATE_<KEY>``
environment variables, not flags: a run names its workload, load, policies and cluster size on
the command line and leaves these at their defaults, which were chosen or measured as each help
text says (docs/simulator.md). ``simulate --print-config`` prints them all. ``ClusterConfig`` and
``AutoscaleOptions`` take their defaults from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from serving_hooks.settings import SettingsError, check_settings, setting_field

PANEL_SIMULATE = "Simulator tuning (--config keys, PROFILER_SIMULATE_* env; --print-config)"


def _knob(default, help: str, **kw):
    return setting_field(default, help, panel=PANEL_SIMULATE, flag=False, **kw)


@dataclass(frozen=True)
class SimulateSettings:
    """``profiler simulate``'s config keys (its flags are the command's own)."""

    env_prefix: ClassVar[str] = "PROFILER_SIMULATE_"
    config_panel: ClassVar[str] = PANEL_SIMULATE

    train_workflows: int = _knob(
        400, "Generated workloads: workflows generated (another seed) to fit the profile on.")
    train_share: float = _knob(0.7, "Logs: share of workflows in the train split (profiler split's rule).")
    warmup: float = _knob(0.2, "Share of the workflows (by arrival) left out of the figures as warm-up.")
    tail: float = _knob(0.2, "Share of the last arrivals left out (they keep the load on while the window runs).")
    gaps: str = _knob("recorded", "Tool gaps: recorded, or sampled from the profile's tool lognormals.",
                      choices=("recorded", "sampled"))
    step_model: str = _knob(
        "roofline", "roofline (from --gpu/--model) or glm45-fit (the earlier fit: GLM-4.5-FP8 on "
                    "8xH100, 500k KV tokens).", choices=("roofline", "glm45-fit"))
    host_ratio: float = _knob(2.0, "Host KV tier as a multiple of the GPU tier (SGLang --hicache-ratio default 2).")
    pcie_s_per_token: Optional[float] = _knob(
        None, "Host<->GPU seconds per KV token (default: from --gpu/--model).")
    chunked_prefill_size: int = _knob(8192, "Prefill tokens per iteration (SGLang's default on 80 GB GPUs).")
    max_running_requests: int = _knob(256, "Running calls per replica (SGLang's --max-running-requests).")
    startup_delay: float = _knob(
        60.0, "Autoscaling: seconds a replica loads its model before it serves (an assumption for "
              "an 8B model with weights on local disk; docs/simulator.md).")
    autoscale_interval: float = _knob(15.0, "Autoscaling: seconds between decisions (Kubernetes HPA sync period 15 s).")
    scale_down_window: float = _knob(
        60.0, "Autoscaling: a pool is not shrunk below its largest target of this many seconds "
              "(HPA downscale stabilization, 300 s in Kubernetes; 60 s was chosen on a validation draw).")
    queue_target: float = _knob(
        16.0, "Reactive autoscaling: waiting calls per replica a pool is sized for (chosen on a validation draw).")
    autoscale_horizon: int = _knob(
        10, "Predictive autoscaling: steps each live session is projected (chosen on a validation "
            "draw; the sidecar's default).")
    ours_epsilon: Optional[float] = _knob(None, "ours: CapacityPolicy epsilon (union bound on P(OOM)); unset: the policy's own.")
    ours_aging_per_s: Optional[float] = _knob(
        None, "ours: PriorityPolicy aging per second of a workflow's age; unset: the policy's own.")
    ttft_slo: float = _knob(
        2.0, "Time-to-first-token target (s) of interactive calls (sessions whose logs mark a "
             "person's turn, wait_after: human): policies.NAME.interactive reports ttft_p99_s, "
             "slo_attainment and the batch sessions' avg/P95 JCT; --slo-search searches against it.")

    def __post_init__(self) -> None:
        check_settings(self)
        low = {"train_workflows": 10, "train_share": 0.0, "warmup": 0.0, "tail": 0.0, "host_ratio": 0.0,
               "chunked_prefill_size": 64, "max_running_requests": 1, "startup_delay": 0.0,
               "autoscale_interval": 0.1, "scale_down_window": 0.0, "queue_target": 0.01,
               "autoscale_horizon": 1, "ttft_slo": 0.001,
               "pcie_s_per_token": 0.0}
        for name, floor in low.items():
            value = getattr(self, name)
            if value is not None and value < floor:
                raise SettingsError(f"{name}: {value!r} is below its minimum {floor}")
        for name in ("warmup", "tail"):
            if getattr(self, name) > 0.9:
                raise SettingsError(f"{name}: {getattr(self, name)!r} is above its maximum 0.9")
