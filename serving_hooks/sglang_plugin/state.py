"""Per-process state of the plugin: the policy objects, the prefetch plans, counters.

Each SGLang scheduler process loads the plugin and gets its own :class:`PluginState`
(one per process, created on first use). Everything here runs on the scheduler thread.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from policies import Annotation, PrefetchPolicy, from_custom_params
from policies.bookkeeping import SessionPriorityBook
from serving_hooks.sglang_plugin.settings import PluginSettings


#: The attribute the plugin caches a request's :class:`Annotation` under (read once per request).
ANNOTATION_ATTR = "_awp_annotation"


def custom_params_of(req: Any) -> dict | None:
    """``req.sampling_params.custom_params`` (what the gateway forwarded), or ``None``."""
    sp = getattr(req, "sampling_params", None)
    cp = getattr(sp, "custom_params", None)
    return cp if isinstance(cp, dict) and cp else None


class PluginState:
    """Policies + clock + counters shared by the hooks of one process.

    ``sessions`` is the :class:`SessionPriorityBook` (the object the simulator's scheduler keeps):
    per workflow id, the priority score of the session's latest predicted call and when it
    arrived (LRU, ``max_sessions``); every queued call of a session is aged from that reference,
    so the priority is the session's, not each call's (alg. 3, workflow level).
    """

    def __init__(self, settings: PluginSettings, clock: Callable[[], float] = time.monotonic,
                 max_sessions: int = 100_000):
        self.settings = settings
        self.clock = clock
        self.steps = 0              # scheduler forward steps seen (the ``step`` decision clock)
        self.prefetch: PrefetchPolicy = settings.new_prefetch_policy()
        self.counters: Counter[str] = Counter()
        self.sessions = SessionPriorityBook(settings.priority, max_sessions=max_sessions)
        self.max_sessions = max_sessions

    def clock_mode(self, scheduler: Any = None) -> str:
        """``local`` or ``step`` (``auto`` resolves to ``step`` once a scheduler with TP > 1 is seen)."""
        mode = self.settings.decision_clock
        if mode == "auto":
            if scheduler is not None and getattr(scheduler, "tp_size", 1) > 1:
                self._tp_seen = True
            return "step" if getattr(self, "_tp_seen", False) else "local"
        return mode

    def sync(self, scheduler: Any) -> None:
        """Read the scheduler's step counter (called from the hooks that get the scheduler)."""
        self.clock_mode(scheduler)
        ct = getattr(scheduler, "forward_ct", None)
        if isinstance(ct, int):
            self.steps = ct

    def now(self) -> float:
        """"Now" for aging and retention: :attr:`clock`, or the step clock (same on all ranks)."""
        if self.clock_mode() == "step":
            return self.steps * self.settings.step_s
        return self.clock()

    def annotation(self, req: Any) -> Annotation | None:
        """The request's :class:`Annotation`, rebuilt from its ``custom_params`` on first use and
        cached on the request (not per scheduler step); None without custom_params."""
        cached = getattr(req, ANNOTATION_ATTR, _UNSET)
        if cached is not _UNSET:
            return cached
        cp = custom_params_of(req)
        ann = from_custom_params(cp) if cp is not None else None
        try:
            setattr(req, ANNOTATION_ATTR, ann)
        except AttributeError:   # a request type without a __dict__: read it again next time
            pass
        return ann


_UNSET = object()
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
