"""Retry-safe sessions: one logical call advances its session once, however many HTTP attempts.

Clients retry: the OpenAI SDKs resend the same body after a 502/429/timeout (and say so in
``x-stainless-retry-count``), other clients send an ``Idempotency-Key``. The predictor advances a
session once per ``request_id`` (``Predictor.annotate_call``), so the gateway gives every attempt
of one logical call **the same** request id. :class:`RetryLedger` decides that:

* an attempt is a *retry* of an earlier one of the same session when it carries the same
  ``Idempotency-Key``, or an identical body (SHA-256 of its bytes), within ``window_s``; or when
  ``x-stainless-retry-count`` > 0 (then the session's latest attempt within the window);
* a retry reuses the first attempt's request id; if that attempt already completed (the client
  gave up on a response that did arrive), the retry is annotated *without* advancing and its
  completion is not observed again;
* a failed attempt (no response, or 5xx/429) is rolled back by the gateway
  (``annotator.cancel``), so the next attempt advances afresh — a call that fails for good leaves
  its session as it was.

The clock is injected (``clock``) so tests step time instead of sleeping.
"""
from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from serving_hooks.settings import GatewaySettings

#: Default window within which an identical body of the same session counts as a retry (s):
#: the gateway's ``retry_window`` setting.
DEFAULT_WINDOW_S = GatewaySettings.retry_window


@dataclass
class Attempt:
    request_id: str
    retry: bool            # an earlier attempt of this call was seen
    completed: bool        # an earlier attempt completed (do not advance or observe again)


@dataclass
class _Entry:
    request_id: str
    t: float
    completed: bool = False


def retry_count(headers: Mapping[str, str]) -> int:
    """``x-stainless-retry-count`` as an int (0 when absent or malformed)."""
    try:
        return max(0, int(headers.get("x-stainless-retry-count", 0)))
    except (TypeError, ValueError):
        return 0


class RetryLedger:
    """Request ids per logical call (module doc); bounded to ``max_entries`` (oldest dropped)."""

    def __init__(self, window_s: float = DEFAULT_WINDOW_S, clock: Callable[[], float] = time.monotonic,
                 max_entries: int = 100_000) -> None:
        self.window_s = window_s
        self.clock = clock
        self.max_entries = max_entries
        self._by_key: OrderedDict[tuple, _Entry] = OrderedDict()
        self._latest: dict[tuple, tuple] = {}     # session -> key of its latest attempt
        self._by_rid: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def attempt(self, session: tuple, raw: bytes, headers: Mapping[str, str]) -> Attempt:
        """The request id of this HTTP attempt of a call of ``session`` (the gateway passes
        ``(workflow type, workflow id, agent)``: two agents sending the same body are two calls)."""
        h = {k.lower(): v for k, v in headers.items()}
        idem = h.get("idempotency-key")
        key = (session, "idem", idem) if idem else (session, "body", hashlib.sha256(raw).hexdigest())
        now = self.clock()
        with self._lock:
            entry = self._by_key.get(key)
            if entry is None and retry_count(h) > 0 and session in self._latest:
                entry = self._by_key.get(self._latest[session])
            if entry is not None and now - entry.t <= self.window_s:
                entry.t = now
                return Attempt(entry.request_id, True, entry.completed)
            entry = _Entry(f"gw-{uuid.uuid4().hex}", now)
            self._by_key[key] = entry
            self._by_rid[entry.request_id] = entry
            self._by_key.move_to_end(key)
            self._latest[session] = key
            while len(self._by_key) > self.max_entries:
                old_key, old = self._by_key.popitem(last=False)
                self._by_rid.pop(old.request_id, None)
                if self._latest.get(old_key[0]) == old_key:
                    del self._latest[old_key[0]]
            return Attempt(entry.request_id, False, False)

    def completed(self, request_id: str) -> bool:
        """Mark the call of ``request_id`` completed; False if it already was (do not observe)."""
        with self._lock:
            entry = self._by_rid.get(request_id)
            if entry is None:
                return True
            first, entry.completed = not entry.completed, True
            return first
