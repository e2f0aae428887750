"""A small fake OpenAI-compatible server: try the gateway without a GPU, and test it.

It answers ``POST /v1/chat/completions`` and ``POST /v1/completions`` (plain JSON or SSE with
``stream: true``, including the usage-only final chunk for ``stream_options.include_usage``),
``POST /v1/responses`` (OpenAI Responses, plain or SSE events ending in ``response.completed``),
SGLang's native ``POST /generate`` (``text`` + ``meta_info``; streamed as cumulative ``data:``
chunks), ``GET /v1/models`` and ``GET /v1/loads``, and records every request it received (raw bytes,
parsed body, headers) so a test can check what the gateway forwarded.

The reply is deterministic: ``reply_tokens`` words (``tok0 tok1 …``); when the request offers
``tools``, the reply calls the first one. Per-request behaviour is steered by headers, which the
gateway forwards like any other: ``x-fake-status: 500`` answers that status with an OpenAI error
body, ``fail_next = 2`` (an attribute) answers the next two requests ``502`` — a
retrying client sends the same headers each time —, ``x-fake-delay: 1.5`` waits before answering, ``x-fake-tokens: 20`` sets the reply length.

Run one: ``python -m serving_hooks.fake_openai --port 30000``.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Received:
    path: str
    raw: bytes
    body: dict | None
    headers: dict[str, str]


@dataclass
class FakeOpenAI:
    reply_tokens: int = 8
    model: str = "fake-model"
    chunk_delay_s: float = 0.0
    received: list[Received] = field(default_factory=list)
    keep: int = 10_000          # requests remembered (oldest dropped)
    record: bool = True
    fail_next: int = 0          # answer this many upcoming generation requests with 502
    waiting_requests: int = 0   # the queue depth /v1/loads reports (``num_waiting_reqs``)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/responses", self._responses, methods=["POST"]),
            Route("/generate", self._native_generate, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/loads", self._loads, methods=["GET"]),
        ])

    # -- helpers --------------------------------------------------------------------------------
    async def _take(self, request: Request) -> tuple[bytes, dict | None]:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if self.record:
            with self._lock:
                self.received.append(Received(request.url.path, raw, body, dict(request.headers)))
                del self.received[:-self.keep]
        return raw, body if isinstance(body, dict) else None

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            self._n += 1
            return f"{prefix}-{self._n}"

    async def _steer(self, request: Request) -> Response | None:
        delay = float(request.headers.get("x-fake-delay", 0) or 0)
        if delay:
            await asyncio.sleep(delay)
        status = int(request.headers.get("x-fake-status", 200) or 200)
        with self._lock:
            if self.fail_next > 0:
                self.fail_next -= 1
                status = 502
        if status != 200:
            return JSONResponse({"error": {"message": f"fake upstream failure {status}",
                                           "type": "server_error", "code": status}},
                                status_code=status, headers={"x-fake": "error"})
        return None

    # -- endpoints ------------------------------------------------------------------------------
    async def _chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def _generate(self, request: Request, chat: bool) -> Response:
        raw, body = await self._take(request)
        steered = await self._steer(request)
        if steered is not None:
            return steered
        if body is None:
            return JSONResponse({"error": {"message": "body is not a JSON object", "type":
                                           "invalid_request_error", "code": 400}}, status_code=400)
        n = int(request.headers.get("x-fake-tokens", self.reply_tokens))
        words = [f"tok{i}" for i in range(n)]
        prompt_tokens = max(1, len(json.dumps(body.get("messages", body.get("prompt", "")))) // 4)
        tool = None
        if chat and body.get("tools"):
            tool = ((body["tools"][0] or {}).get("function") or {}).get("name")
        rid = self._next_id("chatcmpl" if chat else "cmpl")
        created = int(time.time())
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                 "total_tokens": prompt_tokens + n, "prompt_tokens_details": {"cached_tokens": 0}}
        obj = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            if chat:
                message = {"role": "assistant", "content": " ".join(words)}
                if tool:
                    message["tool_calls"] = [{"id": "call_1", "type": "function",
                                              "function": {"name": tool, "arguments": "{}"}}]
                choice = {"index": 0, "message": message,
                          "finish_reason": "tool_calls" if tool else "stop"}
            else:
                choice = {"index": 0, "text": " ".join(words), "finish_reason": "stop"}
            return JSONResponse({"id": rid, "object": obj, "created": created, "model": self.model,
                                 "choices": [choice], "usage": usage})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(choices: list, usage_value=None) -> bytes:
            payload = {"id": rid, "object": f"{obj}.chunk" if chat else obj, "created": created,
                       "model": self.model, "choices": choices}
            if usage_value is not None:
                payload["usage"] = usage_value
            return b"data: " + json.dumps(payload).encode() + b"\n\n"

        async def events():
            if chat:
                yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "finish_reason": None}])
            for i, w in enumerate(words):
                text = w if i == 0 else " " + w
                if self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
                yield chunk([{"index": 0, "delta": {"content": text}, "finish_reason": None}] if chat
                            else [{"index": 0, "text": text, "finish_reason": None}])
            if tool:
                yield chunk([{"index": 0, "delta": {"tool_calls": [
                    {"index": 0, "id": "call_1", "type": "function",
                     "function": {"name": tool, "arguments": ""}}]}, "finish_reason": None}])
                yield chunk([{"index": 0, "delta": {"tool_calls": [
                    {"index": 0, "function": {"arguments": "{}"}}]}, "finish_reason": None}])
            finish = "tool_calls" if tool else "stop"
            yield chunk([{"index": 0, "delta": {}, "finish_reason": finish}] if chat
                        else [{"index": 0, "text": "", "finish_reason": finish}])
            if include_usage:
                yield chunk([], usage)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"x-fake": "stream"})

    async def _responses(self, request: Request) -> Response:
        """OpenAI Responses API: ``output`` message (or a ``function_call`` when tools are
        offered), ``usage.input_tokens/output_tokens``; streamed as typed events."""
        raw, body = await self._take(request)
        steered = await self._steer(request)
        if steered is not None:
            return steered
        if body is None:
            return JSONResponse({"error": {"message": "body is not a JSON object"}}, status_code=400)
        n = int(request.headers.get("x-fake-tokens", self.reply_tokens))
        text = " ".join(f"tok{i}" for i in range(n))
        in_tokens = max(1, len(json.dumps(body.get("input", ""))) // 4)
        rid = self._next_id("resp")
        tools = body.get("tools") or []
        output = [{"type": "message", "id": f"msg-{rid}", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]}]
        if tools and isinstance(tools[0], dict) and tools[0].get("name"):
            output.append({"type": "function_call", "id": f"fc-{rid}", "call_id": "call_1",
                           "name": tools[0]["name"], "arguments": "{}", "status": "completed"})
        resp = {"id": rid, "object": "response", "created_at": int(time.time()), "status": "completed",
                "model": self.model, "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
                "tools": [], "usage": {"input_tokens": in_tokens, "output_tokens": n,
                                       "total_tokens": in_tokens + n,
                                       "input_tokens_details": {"cached_tokens": 0},
                                       "output_tokens_details": {"reasoning_tokens": 0}}}
        if not body.get("stream"):
            return JSONResponse(resp)

        def event(kind: str, payload: dict, seq: int) -> bytes:
            data = {"type": kind, "sequence_number": seq, **payload}
            return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()

        async def events():
            started = {**resp, "status": "in_progress", "output": [], "usage": None}
            yield event("response.created", {"response": started}, 0)
            seq = 1
            for i in range(n):
                if self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
                yield event("response.output_text.delta", {"item_id": f"msg-{rid}", "output_index": 0,
                                                           "content_index": 0, "logprobs": [],
                                                           "delta": (" " if i else "") + f"tok{i}"}, seq)
                seq += 1
            yield event("response.completed", {"response": resp}, seq)

        return StreamingResponse(events(), media_type="text/event-stream", headers={"x-fake": "stream"})

    async def _native_generate(self, request: Request) -> Response:
        """SGLang's ``/generate``: ``{"text", "meta_info": {"prompt_tokens", "completion_tokens",
        "finish_reason"}}``; streamed, cumulative text per ``data:`` chunk, then ``[DONE]``."""
        raw, body = await self._take(request)
        steered = await self._steer(request)
        if steered is not None:
            return steered
        if body is None:
            return JSONResponse({"error": {"message": "body is not a JSON object"}}, status_code=400)
        n = int(request.headers.get("x-fake-tokens", self.reply_tokens))
        words = [f"tok{i}" for i in range(n)]
        in_tokens = max(1, len(json.dumps(body.get("text", ""))) // 4)
        rid = self._next_id("gen")

        def meta(k: int, done: bool) -> dict:
            return {"id": rid, "prompt_tokens": in_tokens, "completion_tokens": k,
                    "finish_reason": {"type": "length", "length": n} if done else None}

        if not body.get("stream"):
            return JSONResponse({"text": " ".join(words), "meta_info": meta(n, True)})

        async def chunks():
            for k in range(1, n + 1):
                yield b"data: " + json.dumps({"text": " ".join(words[:k]),
                                              "meta_info": meta(k, k == n)}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def _models(self, request: Request) -> Response:
        await self._take(request)
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model",
                                                         "owned_by": "fake"}]})

    async def _loads(self, request: Request) -> Response:
        return JSONResponse({"loads": [{"dp_rank": 0, "num_used_tokens": 0, "num_total_tokens": 0,
                                        "max_total_num_tokens": 1_000_000,
                                        "num_waiting_reqs": self.waiting_requests}]})


def main() -> None:  # pragma: no cover - manual use
    import argparse

    import uvicorn

    ap = argparse.ArgumentParser(description="Fake OpenAI-compatible server for trying the gateway.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--reply-tokens", type=int, default=8, help="words per reply (the "
                    "x-fake-tokens header overrides it per request)")
    ap.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between streamed "
                    "chunks (0.02: an engine decoding 50 tokens/s); plain replies come at once")
    args = ap.parse_args()
    uvicorn.run(FakeOpenAI(reply_tokens=args.reply_tokens, chunk_delay_s=args.chunk_delay,
                           record=False).app,
                host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":  # pragma: no cover
    main()
