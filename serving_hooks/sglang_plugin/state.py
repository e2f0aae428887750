"""Per-process state of the plugin: the policy objects, the prefetch plans, counters.

Each SGLang scheduler process loads the plugin and gets its own :class:`PluginState`
(one per process, created on first use). Everything here runs on the scheduler thread.
"""
from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from serving_hooks.policies import CallView, PrefetchPolicy
from serving_hooks.sglang_plugin.settings import PluginSettings


def custom_params_of(req: Any) -> dict | None:
    """``req.sampling_params.custom_params`` (what the gateway forwarded), or ``None``."""
    sp = getattr(req, "sampling_params", None)
    cp = getattr(sp, "custom_params", None)
    return cp if isinstance(cp, dict) and cp else None


class PluginState:
    """Policies + clock + counters shared by the hooks of one process.

    ``sessions`` remembers, per workflow id, the priority score of the session's latest call
    and when it arrived (LRU, ``max_sessions``): every queued call of a session is aged from
    that reference, so the priority is the session's, not each call's (alg. 3, workflow level).
    """

    def __init__(self, settings: PluginSettings, clock: Callable[[], float] = time.monotonic,
                 max_sessions: int = 100_000):
        self.settings = settings
        self.clock = clock
        self.request_clock = 0.0    # latest request stamp admitted (AWP_DECISION_CLOCK=request)
        self.prefetch: PrefetchPolicy = settings.new_prefetch_policy()
        self.counters: Counter[str] = Counter()
        self.sessions: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self.max_sessions = max_sessions

    def note_session(self, session_id: str, score: float, now: float) -> None:
        """The session's latest call arrived at ``now`` with ``score`` (its workflow score)."""
        self.sessions[session_id] = (score, now)
        self.sessions.move_to_end(session_id)
        while len(self.sessions) > self.max_sessions:
            self.sessions.popitem(last=False)

    def admit_time(self, req: Any) -> float:
        """The decision time of a request being admitted (advances the request clock).

        ``request`` clock: the API server's stamp ``req.time_stats.created_time`` (the same
        value on every TP rank); a request without one uses the local clock, counted in
        ``clock_local_fallback``. ``local`` clock: :attr:`clock`.
        """
        if self.settings.decision_clock == "local":
            return self.clock()
        stamp = getattr(getattr(req, "time_stats", None), "created_time", 0.0) or 0.0
        if stamp <= 0.0:
            self.counters["clock_local_fallback"] += 1
            stamp = time.perf_counter()  # the API server's stamps are perf_counter values
        self.request_clock = max(self.request_clock, float(stamp))
        return float(stamp)

    def now(self) -> float:
        """"Now" for aging and retention: the request clock, or :attr:`clock` when local."""
        if self.settings.decision_clock == "local":
            return self.clock()
        return self.request_clock

    def view(self, req: Any) -> CallView | None:
        cp = custom_params_of(req)
        return CallView.from_custom_params(cp) if cp is not None else None


_STATE: PluginState | None = None
_LOCK = threading.Lock()


def get_state() -> PluginState:
    """The process's :class:`PluginState` (settings read from the environment once)."""
    global _STATE
    if _STATE is None:
        with _LOCK:
            if _STATE is None:
                _STATE = PluginState(PluginSettings.from_env())
    return _STATE


def reset_state(state: PluginState | None = None) -> PluginState:
    """Replace the process state (tests; a config reload)."""
    global _STATE
    with _LOCK:
        _STATE = state if state is not None else PluginState(PluginSettings.from_env())
    return _STATE
