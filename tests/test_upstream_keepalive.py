"""Pooled connections an upstream has closed: the gateway and ``profiler replay`` lose no call.

The fault: an HTTP/1.1 server (SGLang's uvicorn) closes a keep-alive connection after it sat idle
for a while (5 s). If the client writes its next request onto that connection just as the close
is on its way, the request is lost — ``ClientOSError: Can not write request body`` or
``ServerDisconnectedError`` in aiohttp (the gateway), ``RemoteProtocolError: Server disconnected
without sending a response`` in httpx (the replay) — and the server never read it.

:class:`ClosingIdleServer` is a real server on a real port that produces that crossing every
time instead of by chance: a connection idle for ``idle_s`` or longer is closed when the next
request arrives on it, and that request is never answered (counted in ``lost``). Time only
makes the fault *more* certain: a client that waits longer than ``idle_s`` always meets it, and
a pool whose keep-alive is shorter than the wait never reuses the connection — a loaded machine
stretches both waits the same way, so no outcome below depends on timing luck.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from serving_hooks.replay import open_stream
from serving_hooks.upstreams import UpstreamClient, stale_connection_error
from tests.serving_helpers import metric, running_gateway

IDLE_S = 0.2      # the server's idle limit
WAIT_S = 0.5      # the client's pause between rounds: always beyond IDLE_S


class ClosingIdleServer:
    """HTTP/1.1 JSON chat server on 127.0.0.1 that closes connections idle >= ``idle_s`` under
    the next request (module doc). ``mode`` ``"fin"`` reads the request, then closes (the client
    sees a disconnect without response); ``"rst"`` closes with the request unread (a reset)."""

    def __init__(self, idle_s: float = IDLE_S, mode: str = "fin") -> None:
        self.idle_s, self.mode = idle_s, mode
        self.processed: list[int] = []   # the "n" of every request answered, in order
        self.lost = 0                    # requests that met a closed connection
        self.connections = 0
        self.connection_of: dict[int, int] = {}   # request "n" -> the connection (1, 2, …) it came on
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._conn, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()

    async def _read_request(self, reader: asyncio.StreamReader, first: bytes) -> bytes:
        length = 0
        line = first
        while line not in (b"\r\n", b""):
            line = await reader.readline()
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        return await reader.readexactly(length) if length else b""

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        last_answer: float | None = None
        try:
            while True:
                first = await reader.readline()
                if not first:
                    return
                if last_answer is not None and time.monotonic() - last_answer >= self.idle_s:
                    self.lost += 1
                    if self.mode == "fin":
                        await self._read_request(reader, first)
                    writer.close()      # unread bytes in the socket make this a reset ("rst")
                    return
                body = json.loads(await self._read_request(reader, first) or b"{}")
                self.processed.append(body.get("n"))
                self.connection_of[body.get("n")] = conn
                out = json.dumps({"id": f"c{body.get('n')}", "object": "chat.completion",
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": "ok"}}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(out), out))
                await writer.drain()
                last_answer = time.monotonic()
        except (ConnectionError, asyncio.IncompleteReadError):
            return

    def __enter__(self) -> "ClosingIdleServer":
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _call(client: httpx.Client, url: str, n: int) -> int:
    return client.post(url + "/v1/chat/completions",
                       json={"model": "m", "n": n, "messages": [{"role": "user", "content": "hi"}]}).status_code


def _two_rounds(gw_url: str, width: int) -> list[int]:
    """``width`` calls in parallel, a pause beyond the server's idle limit, ``width`` more."""
    statuses: list[int] = []
    with httpx.Client(timeout=30, trust_env=False) as client:
        for rnd in range(2):
            threads = [threading.Thread(target=lambda n=rnd * width + i: statuses.append(_call(client, gw_url, n)))
                       for i in range(width)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if rnd == 0:
                time.sleep(WAIT_S)
    return statuses


@pytest.mark.parametrize("mode", ["fin", "rst"])
def test_long_pool_keepalive_without_retry_drops_calls(mode: str) -> None:
    """The bug as it was: a 60 s pool keep-alive and no retry give the client 502s."""
    with ClosingIdleServer(mode=mode) as up, \
            running_gateway([up.url], upstream_keepalive_s=60.0, retry_stale_connections=False) as gw:
        statuses = _two_rounds(gw.url, width=3)
    assert up.lost >= 1
    assert statuses.count(502) == up.lost
    assert sorted(up.processed) == sorted(set(up.processed))  # nothing answered twice


@pytest.mark.parametrize("mode", ["fin", "rst"])
def test_stale_connection_is_retried_once_on_a_fresh_one(mode: str) -> None:
    """Same long keep-alive, retry on (the default): every call answered, each exactly once."""
    with ClosingIdleServer(mode=mode) as up, running_gateway([up.url], upstream_keepalive_s=60.0) as gw:
        statuses = _two_rounds(gw.url, width=3)
        retried = metric(gw.url, "profiler_gateway_upstream_responses_total",
                         outcome="stale_connection_retried")
    assert statuses == [200] * 6
    assert up.lost >= 1 and retried == up.lost
    assert sorted(up.processed) == list(range(6))


def test_pool_keepalive_shorter_than_the_servers_never_meets_a_closed_connection() -> None:
    """The default cure: a pool keep-alive below the server's idle limit (here 0.1 s < 0.2 s),
    no retry needed: the gateway opens fresh connections after the pause."""
    with ClosingIdleServer() as up, \
            running_gateway([up.url], upstream_keepalive_s=0.1, retry_stale_connections=False) as gw:
        statuses = _two_rounds(gw.url, width=3)
    assert statuses == [200] * 6 and up.lost == 0
    # the second round did not reuse the first round's connections (how many connections the first
    # round opened depends on how its 3 parallel calls overlapped: a loaded machine may serialise them)
    first = {up.connection_of[n] for n in range(3)}
    second = {up.connection_of[n] for n in range(3, 6)}
    assert first.isdisjoint(second), (first, second)


def test_fresh_connection_failure_is_not_retried() -> None:
    """Refused on a new connection is no stale pool: the gateway answers 502, sends nothing twice."""
    with ClosingIdleServer() as up:
        url = up.url
    client = UpstreamClient()

    async def go() -> None:
        await client.start()
        try:
            with pytest.raises(Exception) as info:
                await client.request("POST", url + "/v1/chat/completions", data=b"{}", headers=[])
            assert not stale_connection_error(info.value, reused=False)
        finally:
            await client.aclose()
    asyncio.run(go())
    assert client.retried == 0


def test_replay_client_resends_on_a_closed_pooled_connection() -> None:
    """``profiler replay``'s client: a plain send on the stale connection fails; ``open_stream``
    sends again on a new connection and the server answers every call once."""

    async def go(url: str, resend: bool) -> list[int]:
        limits = httpx.Limits(keepalive_expiry=60.0)
        async with httpx.AsyncClient(limits=limits, trust_env=False) as client:
            out = []
            for n in range(2):
                req = client.build_request("POST", url + "/v1/chat/completions", json={"n": n})
                resp = await (open_stream(client, req) if resend else client.send(req, stream=True))
                await resp.aread()
                await resp.aclose()
                out.append(resp.status_code)
                await asyncio.sleep(WAIT_S)
            return out

    with ClosingIdleServer() as up:
        with pytest.raises(httpx.RemoteProtocolError):
            asyncio.run(go(up.url, resend=False))
    with ClosingIdleServer() as up:
        assert asyncio.run(go(up.url, resend=True)) == [200, 200]
        assert up.lost == 1 and up.processed == [0, 1]
