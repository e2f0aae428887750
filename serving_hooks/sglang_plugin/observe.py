"""What the plugin tells the operator: an activation line, periodic counters, decision traces.

The hooks run inside SGLang's scheduler process, which configures logging only *after* loading
plugins, so :func:`register`'s own log line is lost. The first scheduling round therefore logs

    agent-workflow plugin active: pid=… hooks=… backend=workflow-retention in_use=True clock=local …

and then, every ``AWP_LOG_EVERY_S`` seconds (default 60; ``0`` never), one line with the
plugin's counters since start (``priority_set``, ``priority_from_<source>``, ``retention_keep``
/ ``_drop`` / ``_neutral``, ``prefetch_*``)::

    agent-workflow plugin counters: priority_from_gateway=120 priority_set=131 retention_keep=97 …

With ``AWP_SGLANG_DEBUG=1`` every decision is logged as one ``awp-decision`` line of
``key=value`` pairs (the request id, the priority and where it came from, the keep/drop rank
and deadline), e.g. ``awp-decision priority rid=7f… priority=1250 source=gateway session=wf-1``,
and each finished request as ``awp-decision finish rid=… t=…`` in the scheduler's finish order.
All lines go through the ``serving_hooks.sglang_plugin`` logger into SGLang's own log output.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

from serving_hooks.sglang_plugin import HOOKS
from serving_hooks.sglang_plugin.settings import BACKEND_NAME
from serving_hooks.sglang_plugin.state import get_state

logger = logging.getLogger("serving_hooks.sglang_plugin")

_debug: bool | None = None


def debug_enabled() -> bool:
    global _debug
    if _debug is None:
        _debug = get_state().settings.debug
    return _debug


def set_debug(on: bool | None) -> None:
    """Force the decision trace on/off (``None``: read ``AWP_SGLANG_DEBUG`` again)."""
    global _debug
    _debug = on


def decision(kind: str, **fields: Any) -> None:
    """Log one decision when ``AWP_SGLANG_DEBUG=1``."""
    if debug_enabled():
        logger.info("awp-decision %s %s", kind, " ".join(f"{k}={v}" for k, v in fields.items()))


def counters_line(counters: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(counters.items())) or "(none yet)"


def tick(state: Any, scheduler: Any = None, now: float | None = None) -> bool:
    """Called every scheduling round: log the activation line once, then the counters every
    ``log_every_s``. Returns True when it logged."""
    now = time.monotonic() if now is None else now
    last = getattr(state, "_last_counters_log", None)
    if last is None:
        args = getattr(scheduler, "server_args", None)
        logger.info(
            "agent-workflow plugin active: pid=%d hooks=%d backend=%s in_use=%s clock=%s untagged=%s "
            "default_priority_value=%s tp_size=%s debug=%s", os.getpid(), len(HOOKS), BACKEND_NAME,
            getattr(args, "radix_cache_backend", None) == BACKEND_NAME, state.clock_mode(scheduler),
            "age" if state.settings.age_untagged else "off", getattr(args, "default_priority_value", None),
            getattr(scheduler, "tp_size", None), debug_enabled())
        state._last_counters_log = now
        return True
    every = state.settings.log_every_s
    if every > 0 and now - last >= every:
        logger.info("agent-workflow plugin counters: %s", counters_line(dict(state.counters)))
        state._last_counters_log = now
        return True
    return False
