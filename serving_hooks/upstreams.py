"""Which upstream gets a request: the gateway's routing seam.

The gateway only talks to an :class:`UpstreamRouter`::

    url = router.choose_upstream(request_id, body, sys_annotations, app_metadata)
    ...forward, stream...
    router.finished(request_id)          # always called, success or error

Two implementations:

* :class:`RoundRobinRouter` — cycles through the ``--upstream`` URLs; no state per request.
* :class:`CapacityRouting` — adapts :class:`serving_hooks.routing.CapacityRouter` (Pythia alg. 2:
  refuse a worker whose KV capacity the predicted upper bounds could overflow; it polls each
  worker's ``GET /v1/loads`` and falls back to round robin when they do not report). It needs the
  prompt size before the upstream has tokenized it: :func:`estimate_prompt_tokens` uses
  characters / 4, the usual rule of thumb for English text under BPE tokenizers.
"""
from __future__ import annotations

import itertools
import json
from typing import Any, Protocol, Sequence


def normalize_upstream(url: str) -> str:
    """``http://h:p``, ``http://h:p/`` and ``http://h:p/v1`` all name the same OpenAI server."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"upstream {url!r}: expected an http:// or https:// URL")
    return url


class UpstreamRouter(Protocol):
    upstreams: list[str]

    def choose_upstream(self, request_id: str, body: Any, sys_annotations: dict | None,
                        app_metadata: dict | None) -> str: ...

    def finished(self, request_id: str) -> None: ...


class RoundRobinRouter:
    """Cycle through the upstreams in order."""

    def __init__(self, upstreams: Sequence[str]) -> None:
        if not upstreams:
            raise ValueError("at least one --upstream URL is needed")
        self.upstreams = [normalize_upstream(u) for u in upstreams]
        self._cycle = itertools.cycle(self.upstreams)

    def choose_upstream(self, request_id: str, body: Any, sys_annotations: dict | None,
                        app_metadata: dict | None) -> str:
        return next(self._cycle)

    def finished(self, request_id: str) -> None:
        return None

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def estimate_prompt_tokens(body: Any) -> int:
    """Rough prompt size in tokens (characters / 4) of a chat or completions request body."""
    if not isinstance(body, dict):
        return 0
    if "messages" in body:
        text = json.dumps(body["messages"], ensure_ascii=False)
    else:
        prompt = body.get("prompt", "")
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return len(text) // 4


class CapacityRouting:
    """:class:`UpstreamRouter` over :class:`serving_hooks.routing.CapacityRouter`."""

    def __init__(self, upstreams: Sequence[str], **router_kwargs: Any) -> None:
        from serving_hooks.routing import CapacityRouter
        self.upstreams = [normalize_upstream(u) for u in upstreams]
        self.router = CapacityRouter(self.upstreams, **router_kwargs)

    def choose_upstream(self, request_id: str, body: Any, sys_annotations: dict | None,
                        app_metadata: dict | None) -> str:
        ann = sys_annotations or {}
        known = ann.get("known") is True
        band = ann.get("predicted_output_len") if known else None
        hi = int(band[1]) if band else None
        cov = ann.get("output_len_coverage") if known else None
        alpha = (1.0 - float(cov)) / 2 if cov is not None else None  # upper tail of a 2-sided band
        session = (app_metadata or {}).get("workflow_id")
        upper = ann.get("output_len_upper") if known else None
        return self.router.decide(str(session) if session is not None else None,
                                  estimate_prompt_tokens(body), hi, alpha, request_id=request_id,
                                  expected_out=ann.get("output_len_mean") if known else None,
                                  upper_bounds=tuple(map(tuple, upper or ()))).worker

    def finished(self, request_id: str) -> None:
        self.router.on_finish(request_id)

    async def start(self) -> None:
        await self.router.start()

    async def aclose(self) -> None:
        await self.router.aclose()
