"""Helpers shared by the tests of the sidecar and the gateway (plain functions; the fake upstream
fixture they share is ``upstream`` in ``tests/conftest.py``)."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families


def wait_for(condition, timeout: float = 120.0, every_s: float = 0.01) -> bool:
    """Poll ``condition`` every ``every_s`` (logging and observing happen after the client has its
    answer); the timeout only bounds a wait that would never end, so it is generous: a suite run
    three times in a row beside a CPU-heavy job on 2 shared cores needed more than 30 s here."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(every_s)
    return condition()


def metric(url: str, name: str, **labels) -> float:
    """A sample's value from a server's /metrics (0 when absent)."""
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def free_port() -> int:
    """A TCP port nothing listens on (for an unreachable upstream or a server started later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fit_generated_profile(root: Path, n_workflows: int, seed: int, **fit_options: Any) -> Path:
    """Fit a profile root ``root/profile`` on ``n_workflows`` generated coding-assistant
    workflows (written to ``root/logs``); ``fit_options`` go to ``FitOptions``."""
    from fitting import profile_fit as fitting
    from store.workloads import generate, write_jsonl

    write_jsonl(generate("coding_assistant", n_workflows, seed=seed), root / "logs" / "ca.jsonl")
    fitting.fit_profile([root / "logs"], root / "profile", options=fitting.FitOptions(**fit_options))
    return root / "profile"


@contextmanager
def running_gateway(upstreams: list[str], profile_root: Path | None = None, *,
                    sidecar: str | None = None, log_dir: Path | None = None, annotator: Any = None,
                    gate: Any = None, reload_every_s: float = 2.0, tracer: Any = None,
                    retries: Any = None, router: Any = None, pools: Any = None,
                    **options: Any) -> Iterator[Any]:
    """A gateway on a real port over ``upstreams`` (round robin, or ``router``; ``pools`` the
    :class:`ModelPools` of a multi-model test), predicting in process from
    ``profile_root`` (with ``gate`` and hot reload every ``reload_every_s``), from a ``sidecar``
    URL, or with ``annotator``; ``options`` are :class:`GatewayOptions`. Yields the
    :class:`Gateway` with its ``url`` set.

    The annotation budget defaults to 30 s here, not the deployed 5 ms: a test that checks what
    the annotations say must not depend on how fast a loaded machine computes them (an
    annotation over budget is forwarded without one). Tests of the budget itself name
    ``budget_s``."""
    options.setdefault("budget_s", 30.0)
    from serving_hooks.annotator import LocalAnnotator, SidecarAnnotator
    from serving_hooks.gateway import Gateway, GatewayOptions, create_gateway_app
    from serving_hooks.gateway_log import GatewayLog
    from serving_hooks.server_thread import serve_in_thread
    from serving_hooks.service import prediction_service
    from serving_hooks.upstreams import RoundRobinRouter

    registry = CollectorRegistry()
    service = None
    if annotator is None and profile_root is not None:
        service = prediction_service(profile_root, registry, "profiler_gateway", gate=gate,
                                     reload_every_s=reload_every_s)
        annotator = LocalAnnotator(service)
    elif annotator is None and sidecar is not None:
        annotator = SidecarAnnotator(sidecar)
    gw = Gateway(router or RoundRobinRouter(upstreams), annotator,
                 log_writer=GatewayLog(log_dir) if log_dir else None,
                 options=GatewayOptions(**options), registry=registry, service=service,
                 tracer=tracer, retries=retries, pools=pools)
    with serve_in_thread(create_gateway_app(gw), server_header=False, date_header=False) as server:
        gw.url = server.url
        yield gw


def logged(gw: Any) -> float:
    """Gateway records written to its log so far."""
    return gw.registry.get_sample_value("profiler_gateway_log_records_total", {"outcome": "written"}) or 0


def swap_profiles_under_load(url: str, root: Path, base: Any, predictor: Any,
                             send: Callable[[httpx.Client, str], None], clients: int = 3,
                             calls_between: int = 15, timeout: float = 60.0) -> list[str]:
    """Write three new profile versions under ``root`` while ``clients`` threads keep calling
    ``send(client, workflow_id)`` against ``url`` (a fresh workflow id per call).

    Each version is ``base``'s data plus an empty workflow type ``m<k>`` (a marker). The steps are
    paced by events, not by sleeps: at least ``calls_between`` calls complete before the first
    version is written, after each version is active (the server's poller swapped it in) and
    before the clients stop — so the calls see the base version and the last one however slow
    the machine is. ``timeout`` only bounds a wait that would never end (a broken reload).
    Returns the versions written.
    """
    from store.profile_artifact import write_profile

    stop = threading.Event()
    done = [0]
    progressed = threading.Condition()

    def client(tid: int) -> None:
        with httpx.Client(base_url=url, timeout=timeout) as c:
            i = 0
            while not stop.is_set():
                i += 1
                send(c, f"t{tid}-{i}")
                with progressed:
                    done[0] += 1
                    progressed.notify_all()

    def calls_complete(n: int) -> None:
        with progressed:
            target = done[0] + n
            assert progressed.wait_for(lambda: done[0] >= target, timeout), "clients stalled"

    threads = [threading.Thread(target=client, args=(t,)) for t in range(clients)]
    for t in threads:
        t.start()
    written = []
    try:
        for k in range(3):
            calls_complete(calls_between)
            data = {**base.data, "workflow_types": {**base.data["workflow_types"], f"m{k}": {"calls": 0}}}
            written.append(write_profile(root, data, {"sources": []}).version)
            assert wait_for(lambda: predictor.version == written[-1], timeout), "version not swapped in"
        calls_complete(calls_between)
    finally:
        stop.set()
        for t in threads:
            t.join()
    return written
