"""Run an ASGI app with uvicorn in a background thread on a real (ephemeral) port.

Used by the benchmark and the tests, and handy in a notebook: ``with serve_in_thread(app) as s:
httpx.get(s.url + "/healthz")``. Port 0 asks the OS for a free port; the bound port is read back
from uvicorn's listening socket once the server reports it has started.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.types import ASGIApp


@dataclass
class ServerHandle:
    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_in_thread(app: ASGIApp, host: str = "127.0.0.1", port: int = 0, *, timeout: float = 20.0,
                    **config_kwargs: Any) -> ServerHandle:
    """Start ``app`` under uvicorn in a daemon thread and wait until it accepts connections."""
    config_kwargs.setdefault("log_level", "warning")
    config_kwargs.setdefault("access_log", False)
    config_kwargs.setdefault("lifespan", "on")
    config = uvicorn.Config(app, host=host, port=port, **config_kwargs)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("uvicorn server thread exited before it started")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"uvicorn did not start within {timeout}s")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return ServerHandle(server, thread, host, bound)
