"""SGLang's own sessions, driven by the gateway: one per workflow, closed at its end.

SGLang 0.5.23 (the pinned release) has what the end-of-session signal needs without the plugin:
``--enable-session-radix-cache`` (``srt/arg_groups/fields/memory.py``: "Track per-session
references on UnifiedRadixCache KV: eviction consumes unreferenced entries before referenced
ones, and closing a session only dereferences its KV"), ``POST /open_session``
(``OpenSessionReqInput``: ``capacity_of_str_len``, ``session_id``, ``timeout``) and
``POST /close_session`` (``CloseSessionReqInput``: ``session_id``) in
``srt/entrypoints/http_server.py``, and a top-level ``session_id`` on ``/generate``, chat,
completions and responses requests that tags the request's KV with the session
(``srt/managers/scheduler.py``: "radix-native sessions use only the top-level session_id").

With ``profiler gateway --sglang-sessions`` (:class:`~serving_hooks.settings.GatewaySettings`)
the gateway, for each workflow's calls to an upstream of the ``sglang`` dialect:

1. opens the session ``<workflow_type_id>:<workflow_id>`` on that upstream before its first call
   (a session the server already holds, e.g. after a gateway restart, counts as open);
2. adds ``session_id`` to every call's body (a client's own ``session_id`` or ``session_params``
   is left alone: that call is not managed);
3. closes it after the call that ends the workflow (the contract's ``session_end``: the client's
   ``app_metadata.last_call`` or ``p_end`` ≥ ``--session-end-p``), once the answer is complete,
   on every upstream the workflow's calls went to: SGLang then dereferences the session's KV,
   which eviction takes first.

What the plugin still does on its own (``serving_hooks.sglang_plugin``): the keep-alive TTL, the
host prefetch and the priority queue, none of which SGLang's sessions express. A failed open or
close is logged and counted (``profiler_gateway_sglang_sessions_total``), never an error for the
client: SGLang's radix-native sessions start on their first tagged call even unopened.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger("serving_hooks.sglang_sessions")

#: ``capacity_of_str_len`` sent on open: SGLang's older append-mode sessions bound the prompt
#: text with it; radix-native sessions do not read it.
OPEN_CAPACITY = 1 << 30
#: Sessions remembered as open per gateway (least recently used forgotten beyond it: a later
#: call of a forgotten one re-opens, which the server answers "already open").
MAX_OPEN = 100_000


def session_name(meta: Mapping[str, Any] | None) -> str | None:
    """The SGLang session of a call's workflow, or None without identity."""
    if not isinstance(meta, Mapping) or meta.get("workflow_id") in (None, ""):
        return None
    return f"{meta.get('workflow_type_id')}:{meta['workflow_id']}"


def client_manages_session(body: Mapping[str, Any] | None) -> bool:
    """Whether the client set SGLang's session fields itself (then the gateway leaves it be)."""
    return isinstance(body, Mapping) and (body.get("session_id") is not None
                                          or body.get("session_params") is not None)


class SglangSessions:
    """Open / close bookkeeping of SGLang sessions over the gateway's pooled upstream client."""

    def __init__(self, session_getter: Callable[[], aiohttp.ClientSession],
                 registry: CollectorRegistry | None = None, max_open: int = MAX_OPEN) -> None:
        #: returns the ``aiohttp.ClientSession`` to use (the gateway's pooled one, once started)
        self._http = session_getter
        self.max_open = max_open
        #: open sessions (least recently used first) -> the upstreams each is open on
        self._open: OrderedDict[str, set[str]] = OrderedDict()
        self._opening: dict[tuple[str, str], asyncio.Future] = {}
        self._tasks: set[asyncio.Future] = set()      # closes under way (kept from the GC)
        self.events = Counter("profiler_gateway_sglang_sessions", "SGLang sessions the gateway "
                              "opened and closed (--sglang-sessions), by event: open, open_failed, "
                              "close, close_failed", ["event"], registry=registry)

    def is_open(self, upstream: str, session_id: str) -> bool:
        return upstream in self._open.get(session_id, ())

    async def ensure_open(self, upstream: str, session_id: str) -> None:
        """Open ``session_id`` on ``upstream`` unless this gateway already did (concurrent first
        calls of one workflow share one open)."""
        key = (upstream, session_id)
        if self.is_open(upstream, session_id):
            self._open.move_to_end(session_id)
            return
        pending = self._opening.get(key)
        if pending is not None:
            await asyncio.shield(pending)
            return
        fut = asyncio.get_running_loop().create_future()
        self._opening[key] = fut
        try:
            if await self._post(upstream, "/open_session",
                                {"capacity_of_str_len": OPEN_CAPACITY, "session_id": session_id},
                                already_ok=True):
                self.events.labels("open").inc()
                self._open.setdefault(session_id, set()).add(upstream)
                self._open.move_to_end(session_id)
                while len(self._open) > self.max_open:
                    self._open.popitem(last=False)
            else:
                self.events.labels("open_failed").inc()
        finally:
            del self._opening[key]
            fut.set_result(None)

    def close_soon(self, upstream: str, session_id: str) -> None:
        """:meth:`close` as a task of its own: the caller (the gateway's after-call work: log,
        observe) does not wait on the upstream's answer."""
        task = asyncio.ensure_future(self.close(upstream, session_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, upstream: str, session_id: str) -> None:
        """Close ``session_id`` (its KV dereferenced) on ``upstream`` and on every other upstream
        it was opened on (a workflow the router spread), and forget it."""
        for where in sorted(self._open.pop(session_id, set()) | {upstream}):
            ok = await self._post(where, "/close_session", {"session_id": session_id})
            self.events.labels("close" if ok else "close_failed").inc()

    async def _post(self, upstream: str, path: str, payload: dict, already_ok: bool = False) -> bool:
        try:
            async with self._http().post(upstream + path, data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"}) as resp:
                text = await resp.text()
                if resp.status == 200:
                    return True
                # SGLang answers an open of a session it holds with 400 "... still open"
                if already_ok and resp.status == 400 and "still open" in text:
                    return True
                log.warning("SGLang %s%s answered %s: %s", upstream, path, resp.status, text[:200])
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.warning("SGLang %s%s failed: %s: %s", upstream, path, type(exc).__name__, exc)
        return False
