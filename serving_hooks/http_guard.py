"""Guards shared by the sidecar and the gateway: request-size limit and admin bearer token.

* :class:`BodySizeLimit` is a pure ASGI middleware: a request whose ``Content-Length`` exceeds
  the limit is answered ``413`` before its body is read; a chunked request (no length) is
  buffered up to the limit and refused the moment it goes over, so a client cannot make the
  server hold more than ``max_bytes`` of one request in memory.
* :func:`admin_auth` builds a FastAPI dependency that requires ``Authorization: Bearer <token>``
  on admin endpoints (reload, observe) when a token is configured, and is a no-op otherwise.
  Tokens are compared in constant time.
"""
from __future__ import annotations

import json
import secrets
from typing import Callable

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


class BodySizeLimit:
    """ASGI middleware refusing HTTP request bodies larger than ``max_bytes`` with 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = int(max_bytes)

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
        if length is not None:
            if length > self.max_bytes:
                await _send_json(send, 413, _too_large(self.max_bytes))
                return
            await self.app(scope, receive, send)  # the HTTP server enforces the declared length
            return
        # No length: buffer up to the limit, then replay the body to the app as one message.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_json(send, 413, _too_large(self.max_bytes))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


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
