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

Every variable is one field of :class:`PluginKnobs`, read through the same settings mechanism as
the service's ``PROFILER_*`` variables (``serving_hooks/settings.py``) with the prefix ``AWP_``;
the policies' own defaults are the knobs' defaults (declared once, in the policy classes).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Optional

from serving_hooks.policies import KeepDropPolicy, PrefetchPolicy, PriorityPolicy
from serving_hooks.settings import knobs, resolve_settings, setting_field

#: Name under which the cache backend is registered (``--radix-cache-backend``); defined here,
#: below ``retention`` and ``observe``, so both read it without importing each other.
BACKEND_NAME = "workflow-retention"

PANEL_PLUGIN = "SGLang plugin (AWP_* environment of the engine)"


@dataclass(frozen=True)
class PluginKnobs:
    """The plugin's environment variables: one field each, ``AWP_`` + the name in capitals unless
    the field names the variable users already set (``env=``)."""

    env_prefix: ClassVar[str] = "AWP_"

    enabled: bool = setting_field(
        False, "Turn the plugin on (installed but off otherwise: opt-in per server).",
        panel=PANEL_PLUGIN, env="AWP_SGLANG_PLUGIN")
    priority_aging_per_s: float = setting_field(
        PriorityPolicy.aging_per_s, "Score added per second of a workflow's age (alg. 3).",
        panel=PANEL_PLUGIN)
    priority_aging_per_duration: Optional[float] = setting_field(
        PriorityPolicy.aging_per_duration, "Aging per expected session duration; off: every "
        "session ages at AWP_PRIORITY_AGING_PER_S.", panel=PANEL_PLUGIN)
    priority_scale: float = setting_field(
        PriorityPolicy.scale, "Score -> SGLang integer priority multiplier.", panel=PANEL_PLUGIN)
    keep_idle: bool = setting_field(
        KeepDropPolicy.keep_idle, "Keep a session's prefix for its predicted idle gap.",
        panel=PANEL_PLUGIN)
    keep_max_ttl_s: float = setting_field(
        KeepDropPolicy.max_ttl_s, "Upper bound of a retention TTL (s).", panel=PANEL_PLUGIN)
    keep_min_revisit_p: float = setting_field(
        KeepDropPolicy.min_revisit_p, "Below this revisit probability a prefix is dropped.",
        panel=PANEL_PLUGIN)
    keep_lineage: str = setting_field(
        "session", "What counts as a revisit: session or agent.", panel=PANEL_PLUGIN,
        choices=("session", "agent"))
    prefetch: bool = setting_field(
        True, "Host prefetch staging (false: nothing is staged).", panel=PANEL_PLUGIN)
    prefetch_min_p: float = setting_field(
        PrefetchPolicy.min_p, "Smallest next-agent probability worth staging.", panel=PANEL_PLUGIN)
    prefetch_transfer_tok_s: float = setting_field(
        PrefetchPolicy.transfer_tok_s, "Tokens/s of the copy into host memory.", panel=PANEL_PLUGIN)
    prefetch_decode_tok_s: float = setting_field(
        PrefetchPolicy.decode_tok_s, "Decode speed used to predict a call's finish.",
        panel=PANEL_PLUGIN)
    decision_clock: str = setting_field(
        "auto", "Time used by aging and retention: local, step, or auto (step when TP > 1).",
        panel=PANEL_PLUGIN, choices=("auto", "local", "step"))
    step_s: float = setting_field(
        0.025, "Seconds one scheduler step counts as (step clock).", panel=PANEL_PLUGIN)
    untagged: str = setting_field(
        "age", "Requests without custom_params: age (default priority + aging) or off.",
        panel=PANEL_PLUGIN, choices=("age", "off"))
    log_every_s: float = setting_field(
        60.0, "Period of the counters log line (0: never).", panel=PANEL_PLUGIN)
    debug: bool = setting_field(
        False, "Log every decision.", panel=PANEL_PLUGIN, env="AWP_SGLANG_DEBUG")


def plugin_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this server opted in: ``AWP_SGLANG_PLUGIN=1`` (or ``true``/``yes``/``on``).

    Off by default: the entry point makes SGLang load the plugin in every server of an
    environment where the package is installed, and a server that did not ask for workflow
    scheduling must run as plain SGLang."""
    return PluginSettings.from_env(environ).enabled


@dataclass(frozen=True)
class PluginSettings:
    """The policies the plugin drives, built from :class:`PluginKnobs` (the environment)."""

    enabled: bool
    prefetch_enabled: bool
    priority: PriorityPolicy
    keep_drop: KeepDropPolicy
    prefetch_min_p: float
    prefetch_transfer_tok_s: float
    prefetch_decode_tok_s: float
    decision_clock: str
    step_s: float
    age_untagged: bool
    log_every_s: float
    debug: bool

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "PluginSettings":
        """The settings ``environ`` (``os.environ`` when None) gives; a bad value is a one-line
        ``ValueError`` naming its variable."""
        k = resolve_settings(environ=os.environ if environ is None else environ,
                             cls=PluginKnobs).settings
        return cls(
            enabled=k.enabled,
            prefetch_enabled=k.prefetch,
            priority=PriorityPolicy(aging_per_s=k.priority_aging_per_s,
                                    aging_per_duration=k.priority_aging_per_duration,
                                    scale=k.priority_scale),
            keep_drop=KeepDropPolicy(max_ttl_s=k.keep_max_ttl_s, keep_idle=k.keep_idle,
                                     min_revisit_p=k.keep_min_revisit_p, lineage=k.keep_lineage),
            prefetch_min_p=k.prefetch_min_p,
            prefetch_transfer_tok_s=k.prefetch_transfer_tok_s,
            prefetch_decode_tok_s=k.prefetch_decode_tok_s,
            decision_clock=k.decision_clock,
            step_s=k.step_s,
            age_untagged=k.untagged == "age",
            log_every_s=k.log_every_s,
            debug=k.debug,
        )

    def new_prefetch_policy(self) -> PrefetchPolicy:
        return PrefetchPolicy(
            min_p=self.prefetch_min_p,
            transfer_tok_s=self.prefetch_transfer_tok_s,
            decode_tok_s=self.prefetch_decode_tok_s,
        )


#: Every ``AWP_*`` variable the plugin reads (docs/sglang.md lists each with its default).
PLUGIN_ENV_VARS = tuple(k.env for k in knobs(PluginKnobs))
