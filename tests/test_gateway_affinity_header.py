"""The gateway's sidecar client names the workflow in a header a load balancer can hash on."""
from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request

from serving_hooks.annotator import AFFINITY_HEADER, SidecarAnnotator
from serving_hooks.server_thread import serve_in_thread


def test_annotate_and_observe_carry_the_workflow_id_header():
    seen: list[tuple[str, str | None]] = []
    app = FastAPI()

    @app.post("/v1/annotate")
    async def annotate(request: Request) -> dict:
        seen.append(("annotate", request.headers.get(AFFINITY_HEADER)))
        return {"sys_annotations": {"known": False}}

    @app.post("/v1/observe")
    async def observe(request: Request) -> dict:
        seen.append(("observe", request.headers.get(AFFINITY_HEADER)))
        return {"in_band": None}

    async def drive(url: str) -> None:
        client = SidecarAnnotator(url)
        meta = {"workflow_type_id": "app", "workflow_id": "s-42", "agent_id": "a"}
        await client.annotate(meta, "r1", None)
        await client.observe({"app_metadata": meta, "request_id": "r1", "output_tokens": 3})
        await asyncio.gather(*client._pending)
        await client.aclose()

    with serve_in_thread(app) as server:
        asyncio.run(drive(server.url))
    assert seen == [("annotate", "s-42"), ("observe", "s-42")]
