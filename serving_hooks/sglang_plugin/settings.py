"""Plugin settings, read from the environment of the SGLang server process.

Every knob has a default that works; set the variables before ``python -m
sglang.launch_server`` (the scheduler processes inherit them). ``AWP_SGLANG_PLUGIN=1`` turns the
plugin on (installed but off otherwise: opt-in per server); the others tune priority aging
(``AWP_PRIORITY_*``), keep/drop (``AWP_KEEP_*``), host prefetch (``AWP_PREFETCH*``), the decision
clock (``AWP_DECISION_CLOCK``, ``AWP_STEP_S``), untagged requests (``AWP_UNTAGGED``) and logging
(``AWP_LOG_EVERY_S``, ``AWP_SGLANG_DEBUG``). The table of every variable, its default and
meaning: docs/sglang.md, "Plugin settings".

Rank consensus: under tensor parallelism every TP rank runs its own scheduler over the same
broadcast requests and must take the same decisions (SGLang asserts on it in write-back HiCache
mode). With TP > 1 (``auto``) or ``AWP_DECISION_CLOCK=step`` the plugin's "now" is the
scheduler's forward-step counter (``Scheduler.forward_ct``, the same on every rank) times
``AWP_STEP_S``, so every rank computes the same priorities and deadlines; aging and TTLs then
advance with work done, not wall time. With one rank (``auto``) the process clock is used. Why
there is no shared wall clock: docs/sglang.md, "Tensor parallelism".
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from serving_hooks.policies import KeepDropPolicy, PrefetchPolicy, PriorityPolicy

#: Name under which the cache backend is registered (``--radix-cache-backend``); defined here,
#: below ``retention`` and ``observe``, so both read it without importing each other.
BACKEND_NAME = "workflow-retention"


def _optional_f(name: str, default: float | None) -> float | None:
    """``_f`` for a setting that may be switched off (``off``: None; unset or empty: ``default``)."""
    raw = os.environ.get(name)
    if raw is not None and raw.strip().lower() == "off":
        return None
    return _f(name, default) if raw else default  # type: ignore[arg-type]


def _f(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={raw!r} is not a number") from exc


def _flag(name: str, default: bool = True) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() not in ("0", "false", "no", "off")


def plugin_enabled() -> bool:
    """Whether this server opted in: ``AWP_SGLANG_PLUGIN=1`` (or ``true``/``yes``/``on``).

    Off by default: the entry point makes SGLang load the plugin in every server of an
    environment where the package is installed, and a server that did not ask for workflow
    scheduling must run as plain SGLang."""
    return os.environ.get("AWP_SGLANG_PLUGIN", "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class PluginSettings:
    """The policies the plugin drives, configured from the environment."""

    enabled: bool
    prefetch_enabled: bool
    priority: PriorityPolicy
    keep_drop: KeepDropPolicy
    prefetch_min_p: float
    prefetch_transfer_tok_s: float
    prefetch_decode_tok_s: float
    decision_clock: str = "auto"
    step_s: float = 0.025
    age_untagged: bool = True
    log_every_s: float = 60.0
    debug: bool = False

    @classmethod
    def from_env(cls) -> "PluginSettings":
        lineage = os.environ.get("AWP_KEEP_LINEAGE", "session")
        if lineage not in ("session", "agent"):
            raise ValueError(f"AWP_KEEP_LINEAGE must be 'session' or 'agent', got {lineage!r}")
        clock = os.environ.get("AWP_DECISION_CLOCK", "auto") or "auto"
        if clock not in ("auto", "local", "step"):
            raise ValueError(f"AWP_DECISION_CLOCK must be 'auto', 'local' or 'step', got {clock!r}")
        untagged = os.environ.get("AWP_UNTAGGED", "age") or "age"
        if untagged not in ("age", "off"):
            raise ValueError(f"AWP_UNTAGGED must be 'age' or 'off', got {untagged!r}")
        return cls(
            decision_clock=clock,
            step_s=_f("AWP_STEP_S", 0.025),
            age_untagged=untagged == "age",
            log_every_s=_f("AWP_LOG_EVERY_S", 60.0),
            debug=_flag("AWP_SGLANG_DEBUG", False),
            enabled=plugin_enabled(),
            prefetch_enabled=_flag("AWP_PREFETCH"),
            priority=PriorityPolicy(
                aging_per_s=_f("AWP_PRIORITY_AGING_PER_S", PriorityPolicy.aging_per_s),
                aging_per_duration=_optional_f("AWP_PRIORITY_AGING_PER_DURATION",
                                               PriorityPolicy.aging_per_duration),
                scale=_f("AWP_PRIORITY_SCALE", PriorityPolicy.scale),
            ),
            keep_drop=KeepDropPolicy(
                max_ttl_s=_f("AWP_KEEP_MAX_TTL_S", KeepDropPolicy.max_ttl_s),
                keep_idle=_flag("AWP_KEEP_IDLE", KeepDropPolicy.keep_idle),
                min_revisit_p=_f("AWP_KEEP_MIN_REVISIT_P", KeepDropPolicy.min_revisit_p),
                lineage=lineage,
            ),
            prefetch_min_p=_f("AWP_PREFETCH_MIN_P", PrefetchPolicy.min_p),
            prefetch_transfer_tok_s=_f("AWP_PREFETCH_TRANSFER_TOK_S", PrefetchPolicy.transfer_tok_s),
            prefetch_decode_tok_s=_f("AWP_PREFETCH_DECODE_TOK_S", PrefetchPolicy.decode_tok_s),
        )

    def new_prefetch_policy(self) -> PrefetchPolicy:
        return PrefetchPolicy(
            min_p=self.prefetch_min_p,
            transfer_tok_s=self.prefetch_transfer_tok_s,
            decode_tok_s=self.prefetch_decode_tok_s,
        )
