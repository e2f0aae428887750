"""Guards shared by the sidecar and the gateway: request-size limit and admin bearer token.

* :class:`BodySizeLimit` is a pure ASGI middleware: a request whose ``Content-Length`` exceeds
  the limit is answered ``413`` before its body is read; a chunked request (no length) is
  buffered up to the limit and refused the moment it goes over, so a client cannot make the
  server hold more than ``max_bytes`` of one request in memory. With ``body_timeout_s`` the whole
  body must also arrive within that many seconds of the request's headers, else ``408``: a slow
  client that trickles (or never finishes) its body cannot hold a worker and a buffer forever.
* :func:`admin_auth` builds a FastAPI dependency that requires ``Authorization: Bearer <token>``
  on admin endpoints (reload, observe) when a token is configured, and is a no-op otherwise.
  Tokens are compared in constant time.
* :func:`strict_json_loads` parses only JSON that every peer reads the same way (RFC 8259 §§6-8:
  no ``NaN``/``Infinity``, no number that overflows a double such as ``1e400``, no lone UTF-16
  surrogate, UTF-8 only, bounded nesting) and raises :class:`StrictJSONError` with a one-line
  reason otherwise. :class:`StrictJSONBody` applies it to every JSON request of the sidecar, so
  such input gets ``400`` instead of failing later (a ``NaN`` that cannot be rendered back, a
  surrogate that cannot be encoded: ``500`` before).
"""
from __future__ import annotations

import asyncio
import json
import re
import secrets
from typing import Any, Callable

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp


async def _send_json(send, code: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": code,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _too_large(limit: int) -> dict:
    return {"error": {"message": f"request body larger than the limit of {limit} bytes",
                      "type": "request_too_large", "code": 413}}


def _too_slow(timeout_s: float) -> dict:
    return {"error": {"message": f"request body not received within {timeout_s:g} s",
                      "type": "request_timeout", "code": 408}}


async def read_body(receive, max_bytes: int | None = None) -> bytes | None:
    """The whole ASGI request body, or None once it goes over ``max_bytes``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if max_bytes is not None and size > max_bytes:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replaying(body: bytes, receive):
    """An ASGI ``receive`` that yields ``body`` as one message, then defers to ``receive``."""
    replayed = False

    async def replay():
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class BodySizeLimit:
    """ASGI middleware refusing HTTP request bodies larger than ``max_bytes`` with 413 and, when
    ``body_timeout_s`` is set, bodies that take longer than that to arrive with 408."""

    def __init__(self, app: ASGIApp, max_bytes: int, body_timeout_s: float | None = None) -> None:
        self.app = app
        self.max_bytes = int(max_bytes)
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await _send_json(send, 400, {"error": {"message": "bad Content-Length header",
                                                           "type": "bad_request", "code": 400}})
                    return
                break
        if length is not None and length > self.max_bytes:
            await _send_json(send, 413, _too_large(self.max_bytes))
            return
        if length is not None and self.body_timeout_s is None:
            await self.app(scope, receive, send)  # the HTTP server enforces the declared length
            return
        # Read the body here (bounded by the size limit and the deadline), then replay it to the
        # app as one message.
        try:
            body = await asyncio.wait_for(read_body(receive, self.max_bytes), self.body_timeout_s)
        except asyncio.TimeoutError:
            await _send_json(send, 408, _too_slow(self.body_timeout_s))
            return
        if body is None:
            await _send_json(send, 413, _too_large(self.max_bytes))
            return
        await self.app(scope, replaying(body, receive), send)


class StrictJSONError(ValueError):
    """A body that is not strict, interoperable JSON (see :func:`strict_json_loads`)."""


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _reject_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise StrictJSONError(f"number {text[:40]} overflows a double")
    return value


def _has_lone_surrogate(obj: Any) -> bool:
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def strict_json_loads(raw: bytes | str) -> Any:
    """Parse ``raw`` as strict JSON (see module doc) or raise :class:`StrictJSONError`."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
    except UnicodeDecodeError as exc:
        raise StrictJSONError(f"body is not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except StrictJSONError:
        raise
    except RecursionError:
        raise StrictJSONError("JSON nested too deeply") from None
    except ValueError as exc:
        raise StrictJSONError(f"not JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        raise StrictJSONError("string with a lone UTF-16 surrogate (not Unicode text)")
    return value


class StrictJSONBody:
    """ASGI middleware: a JSON request body that :func:`strict_json_loads` refuses gets ``400``
    with the reason; anything else passes through with its body replayed unchanged.

    Put it inside :class:`BodySizeLimit` (which bounds what is buffered here).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        ctype = next((v for k, v in scope.get("headers", ()) if k == b"content-type"), b"")
        if ctype and b"json" not in ctype.lower():
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body.strip():
            try:
                strict_json_loads(body)
            except StrictJSONError as exc:
                await _send_json(send, 400, {"detail": str(exc)})
                return
        await self.app(scope, replaying(body, receive), send)


def admin_auth(token: str | None) -> Callable:
    """A FastAPI dependency that checks the admin bearer token (no-op when ``token`` is None)."""
    bearer = HTTPBearer(auto_error=False)

    async def check(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if token is None:
            return
        if credentials is None or credentials.scheme.lower() != "bearer" or \
                not secrets.compare_digest(credentials.credentials.encode(), token.encode()):
            raise HTTPException(status_code=status.HTTP_401_UNAUTHORIZED,
                                detail="admin endpoint: missing or wrong bearer token",
                                headers={"WWW-Authenticate": "Bearer"})

    return check
