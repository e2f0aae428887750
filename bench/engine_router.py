"""The real ``sglang-router`` (PyPI ``sglang-router``, a Rust binary) in front of SGLang replicas.

Started the way its README starts it, at its defaults::

    python -m sglang_router.launch_router --worker-urls URL1 URL2 --host 127.0.0.1 --port P

so the policy is the default ``cache_aware`` (``sglang_router/router_args.py``, ``RouterArgs``
in 0.3.2: ``policy = "cache_aware"``, ``cache_threshold = 0.3``, ``balance_abs_threshold = 64``,
``balance_rel_threshold = 1.5``, ``eviction_interval_secs = 60``, ``max_tree_size = 2**26``).
Per request the router matches the prompt text against its own approximate radix tree of
what it sent each worker: if the workers' loads (requests it has in flight on each) are
balanced and the match covers more than ``cache_threshold`` of the prompt, the worker holding
the match gets it, else the least-loaded worker; under imbalance, the least-loaded worker.
(Older versions sent a miss to the worker with the smallest tree; the simulator's model of
0.3.2 is ``bench.engine_sim.RouterCacheAware032``.) Only ``--host``/``--port`` and
the worker list are set here. It proxies OpenAI streams unchanged (``ignore_eos``,
``stream_options`` and the engine's ``usage.prompt_tokens_details.cached_tokens`` pass through;
checked against sglang-router 0.3.2 and SGLang 0.5.23).

Readiness: ``GET /readiness`` answers ``{"healthy_workers": n, ...}``; stop: SIGTERM to its PID, then
SIGKILL to its process group (``tests.sglang.real_server.stop_process_group``).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.sglang.real_server import stop_process_group  # the servers beside it stop the same way


def router_available() -> bool:
    return importlib.util.find_spec("sglang_router") is not None


class SGLangRouter:
    """One ``sglang_router.launch_router`` process on 127.0.0.1 over ``worker_urls``."""

    def __init__(self, worker_urls: list[str], port: int, log_path: Path,
                 extra_args: list[str] | None = None) -> None:
        self.worker_urls, self.port, self.log_path = list(worker_urls), port, Path(log_path)
        self.url = f"http://127.0.0.1:{port}"
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *self.worker_urls,
                "--host", "127.0.0.1", "--port", str(self.port), *self.extra_args]

    def start(self, timeout_s: float = 120.0) -> "SGLangRouter":
        if not router_available():
            raise RuntimeError("sglang-router is not installed: pip install -e '.[bench]' "
                               "(or pip install sglang-router==0.3.2)")
        self._log = self.log_path.open("ab")
        env = {**os.environ, "NO_COLOR": "1"}
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"sglang-router exited with {self.proc.returncode}; see {self.log_path}")
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"sglang-router not ready after {timeout_s:.0f}s; see {self.log_path}")
                try:
                    r = client.get(self.url + "/readiness")
                    if r.status_code == 200 and r.json().get("healthy_workers") == len(self.worker_urls):
                        return self
                except (httpx.HTTPError, ValueError):
                    pass
                time.sleep(0.5)

    def stop(self, grace_s: float = 10.0) -> None:
        stop_process_group(self.proc, grace_s, getattr(self, "_log", None))

    def __enter__(self) -> "SGLangRouter":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
