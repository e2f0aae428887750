"""Where the gateway gets predictions from: in process (``--profile``) or a sidecar (``--sidecar``).

Both implement :class:`AnnotationSource`, so the gateway's fail-open logic is written once:

* ``blocking`` — True when :meth:`annotate_now` computes in the calling thread (microseconds; the
  gateway checks the time budget after the fact), False when :meth:`annotate` must be awaited
  (the gateway cancels it at the budget).
* ``annotate`` / ``annotate_now`` return the typed contract (:class:`Annotation`): the sidecar's
  JSON is read once, where it arrives; nothing downstream parses it again.
* ``takes_priority_inputs`` — True when ``priority_inputs`` (the gateway's model-pool queue
  depths) reach the priority policy, so the priority is computed once, with them; a sidecar
  computes its priority without them, and the gateway adds the pools' term itself.
* ``observe(completion)`` — report a finished call; errors are counted, never raised.
* ``cancel`` — roll back a failed call's session advance (False: not possible here);
  ``health`` — why predictions are unavailable (None: nothing remote to check).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

import aiohttp

from predictors.contract import Annotation
from serving_hooks.service import PredictionService

log = logging.getLogger(__name__)


#: Header a load balancer in front of several sidecars hashes on, so that every call of a
#: workflow reaches the replica holding its session (README "Several sidecars").
AFFINITY_HEADER = "X-Workflow-Id"


def _affinity_header(app_metadata: dict) -> dict[str, str]:
    wf = app_metadata.get("workflow_id") if isinstance(app_metadata, dict) else None
    return {AFFINITY_HEADER: str(wf)} if wf is not None else {}


class AnnotationSource(Protocol):
    """Where the gateway gets one call's :class:`Annotation` (module doc)."""

    blocking: bool
    takes_priority_inputs: bool

    def annotate_now(self, app_metadata: dict, request_id: str, input_tokens: int | None,
                     timeout_s: float | None = None, advance: bool = True,
                     priority_inputs: Mapping[str, Any] | None = None) -> Annotation: ...

    async def annotate(self, app_metadata: dict, request_id: str, input_tokens: int | None,
                       advance: bool = True,
                       priority_inputs: Mapping[str, Any] | None = None) -> Annotation: ...

    async def cancel(self, app_metadata: dict, request_id: str) -> bool: ...

    async def observe(self, completion: dict) -> None: ...

    async def health(self) -> str | None: ...

    async def warm_up(self) -> Any: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


class LocalAnnotator:
    """Predictions from a :class:`PredictionService` in this process."""

    blocking = True
    takes_priority_inputs = True

    def __init__(self, service: PredictionService) -> None:
        self.service = service
        self.observe_errors = 0

    def annotate_now(self, app_metadata: dict, request_id: str, input_tokens: int | None,
                     timeout_s: float | None = None, advance: bool = True,
                     priority_inputs: Mapping[str, Any] | None = None) -> Annotation:
        """Annotate in this thread. With ``timeout_s``, first wait at most that long for the
        session table to be free (another thread may hold it: a profile swap's replay, the
        autoscale scan) and raise :class:`TimeoutError` instead of waiting on: the caller's time
        budget is then a bound, not a hope."""
        if timeout_s is not None and not self.service.predictor.session_table_free(timeout_s):
            raise TimeoutError(f"session table busy for {timeout_s * 1000:g} ms")
        return self.service.annotate_call(app_metadata, request_id=request_id,
                                          input_tokens=input_tokens, advance=advance,
                                          priority_inputs=priority_inputs)

    async def annotate(self, app_metadata: dict, request_id: str, input_tokens: int | None,
                       advance: bool = True,
                       priority_inputs: Mapping[str, Any] | None = None) -> Annotation:
        return self.annotate_now(app_metadata, request_id, input_tokens, advance=advance,
                                 priority_inputs=priority_inputs)

    async def warm_up(self) -> int:
        """Build the profile's lazy structures before the first call (:meth:`Predictor.warm_up`)."""
        return await asyncio.to_thread(self.service.predictor.warm_up)

    async def cancel(self, app_metadata: dict, request_id: str) -> bool:
        """Roll back the session advance of a call that failed upstream (retry-safe sessions)."""
        return await asyncio.to_thread(self.service.predictor.cancel, app_metadata, request_id)

    async def health(self) -> str | None:
        """In process: nothing remote to check."""
        return None

    async def observe(self, completion: dict) -> None:
        """Report a finished call: here when the session table is free (no thread hand-off per
        call), else from a worker thread, so a table another thread holds (a profile swap's
        replay, the autoscale scan) is waited for there, never on the event loop."""
        try:
            if self.service.predictor.session_table_free(0):
                self.service.observe(completion)
            else:
                await asyncio.to_thread(self.service.observe, completion)
        except Exception:
            self.observe_errors += 1
            log.exception("observe failed")

    async def start(self) -> None:
        self.service.start()

    async def aclose(self) -> None:
        self.service.stop()


class SidecarAnnotator:
    """Predictions from a sidecar (``profiler serve``) over HTTP (a pooled aiohttp session)."""

    blocking = False
    takes_priority_inputs = False   # the sidecar's policy knows no gateway queues

    def __init__(self, url: str, *, token: str | None = None, observe_timeout_s: float = 2.0,
                 max_connections: int = 64) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.observe_timeout_s = observe_timeout_s
        self.max_connections = max_connections
        self.observe_errors = 0
        self._session: aiohttp.ClientSession | None = None
        self._pending: set[asyncio.Task] = set()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                base_url=self.url, headers=self.headers, trust_env=False,
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                timeout=aiohttp.ClientTimeout(total=5.0))
        return self._session

    def annotate_now(self, app_metadata: dict, request_id: str, input_tokens: int | None,
                     timeout_s: float | None = None, advance: bool = True,
                     priority_inputs: Mapping[str, Any] | None = None) -> Annotation:
        raise TypeError("a sidecar is asked asynchronously: await annotate()")

    async def annotate(self, app_metadata: dict, request_id: str, input_tokens: int | None,
                       advance: bool = True,
                       priority_inputs: Mapping[str, Any] | None = None) -> Annotation:
        """The sidecar's answer, read into the contract here (the one parse of its JSON)."""
        payload: dict[str, Any] = {"app_metadata": app_metadata, "request_id": request_id}
        if not advance:
            payload["advance"] = False
        if input_tokens is not None:
            payload["input_tokens"] = input_tokens
        async with self._http().post("/v1/annotate", json=payload,
                                     headers=_affinity_header(app_metadata)) as r:
            r.raise_for_status()
            return Annotation.from_dict((await r.json())["sys_annotations"], app_metadata)

    async def _post_observe(self, completion: dict) -> None:
        try:
            async with self._http().post("/v1/observe", json=completion,
                                         headers=_affinity_header(completion.get("app_metadata") or completion),
                                         timeout=aiohttp.ClientTimeout(total=self.observe_timeout_s)) as r:
                r.raise_for_status()
        except Exception as exc:
            self.observe_errors += 1
            log.debug("sidecar observe failed: %s", exc)

    async def observe(self, completion: dict) -> None:
        """Send in the background: a completed response never waits on the sidecar."""
        task = asyncio.get_running_loop().create_task(self._post_observe(completion))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def health(self, timeout_s: float = 1.0) -> str:
        """``"ok"`` when the sidecar's ``/healthz`` answers 200 within ``timeout_s``, else why not
        (``"unreachable (ClientConnectorError)"``, ``"http 503"``, ``"timeout"``): the gateway's
        own ``/healthz`` reports it, so a dead sidecar no longer hides behind ``status: ok``. The
        reason names no host or port."""
        try:
            async with self._http().get("/healthz", timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                return "ok" if r.status == 200 else f"http {r.status}"
        except asyncio.TimeoutError:
            return "timeout"
        except (aiohttp.ClientError, OSError) as exc:
            return f"unreachable ({type(exc).__name__})"

    async def cancel(self, app_metadata: dict, request_id: str) -> bool:
        """The sidecar has no rollback endpoint: a failed call stays advanced there (retries of
        it still advance once: same request id)."""
        return False

    async def warm_up(self) -> None:
        """Open the pooled connection to the sidecar (a failure is logged: calls fail open)."""
        try:
            await self.annotate({"workflow_type_id": "__warmup__", "workflow_id": "__warmup__",
                                 "agent_id": "__warmup__"}, "gw-warmup", None, advance=False)
        except Exception as exc:
            log.warning("sidecar warm-up failed (calls fail open until it answers): %s", exc)

    async def start(self) -> None:
        self._http()

    async def aclose(self) -> None:
        if self._pending:
            await asyncio.wait(self._pending, timeout=self.observe_timeout_s)
        if self._session is not None:
            await self._session.close()
            self._session = None
