"""Helpers shared by the tests of the sidecar and the gateway (not fixtures: plain functions)."""
from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families


def wait_for(condition, timeout: float = 5.0) -> bool:
    """Poll ``condition`` (logging and observing happen after the client has its answer)."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def metric(url: str, name: str, **labels) -> float:
    """A sample's value from a server's /metrics (0 when absent)."""
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0
