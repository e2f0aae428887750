"""GET /v1/autoscale on a real sidecar: live sessions → projected calls → replicas (alg. 4)."""
from __future__ import annotations

import httpx

from tests.test_sidecar_api import meta, profile_root, start_sidecar  # noqa: F401 (fixture)


def test_autoscale_grows_with_live_sessions(profile_root):
    server, _ = start_sidecar(profile_root)
    with server, httpx.Client(base_url=server.url) as c:
        empty = c.get("/v1/autoscale").json()
        assert empty["live_sessions"] == 0 and empty["models"] == {}
        for i in range(40):  # forty sessions that just ran their planner: explorers come next
            c.post("/v1/annotate", json={"app_metadata": meta(f"s{i}", "planner"), "request_id": f"p{i}"})
        few = c.get("/v1/autoscale", params={"horizon": 3, "window_s": 30}).json()
        assert few["live_sessions"] == 40
        explorer = few["models"]["coding_assistant/explorer"]
        assert explorer["projected_calls"] > 40  # fan-out of 1-4 explorers per session
        for i in range(40, 400):
            c.post("/v1/annotate", json={"app_metadata": meta(f"s{i}", "planner"), "request_id": f"p{i}"})
        many = c.get("/v1/autoscale", params={"horizon": 3, "window_s": 30}).json()
        assert many["models"]["coding_assistant/explorer"]["suggested_replicas"] > explorer["suggested_replicas"]
        assert many["total_suggested_replicas"] >= few["total_suggested_replicas"]
        assert c.get("/v1/autoscale", params={"horizon": 0}).status_code == 422
