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

from serving_hooks.policies import CallView, PrefetchPolicy
from serving_hooks.sglang_plugin.settings import PluginSettings


def custom_params_of(req: Any) -> dict | None:
    """``req.sampling_params.custom_params`` (what the gateway forwarded), or ``None``."""
    sp = getattr(req, "sampling_params", None)
    cp = getattr(sp, "custom_params", None)
    return cp if isinstance(cp, dict) and cp else None


class PluginState:
    """Policies + clock + counters shared by the hooks of one process."""

    def __init__(self, settings: PluginSettings, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.clock = clock
        self.prefetch: PrefetchPolicy = settings.new_prefetch_policy()
        self.counters: Counter[str] = Counter()

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
