"""The annotated endpoints and how each one's answer reads as a completed call.

The gateway annotates four request kinds the same way; what differs is where an answer keeps its
token counts, text and tool calls. :func:`as_chat_response` reads each shape into the chat shape
(``usage.prompt_tokens/completion_tokens``, ``choices[0].message``) the gateway logs and observes.

==============  ========================  ============================================================
path            kind (``ENDPOINTS``)       answer
==============  ========================  ============================================================
/v1/chat/…      chat                      OpenAI chat completion (or its SSE chunks)
/v1/completions completions               OpenAI text completion
/v1/responses   responses                 OpenAI Responses: ``usage.input_tokens/output_tokens``,
                                          ``output[]`` items (``message`` → ``output_text`` parts,
                                          ``function_call`` → a tool call); streamed, the final
                                          ``response.completed`` event carries the whole response
/generate       generate                  SGLang native: ``text`` and ``meta_info.prompt_tokens /
                                          completion_tokens``; streamed, each ``data:`` chunk holds
                                          the text so far and ``meta_info`` (the last one counts)
==============  ========================  ============================================================
"""
from __future__ import annotations

from typing import Any

#: Annotated request paths and their kind.
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions",
             "/v1/responses": "responses", "/generate": "generate"}


def endpoint_of(path: str) -> str | None:
    """The kind of an annotated path (None: not annotated)."""
    return ENDPOINTS.get(path)


def _responses_text_and_tools(resp: dict) -> tuple[str, list[dict]]:
    texts, tools = [], []
    for item in resp.get("output") or ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") == "output_text":
                    texts.append(part.get("text") or "")
        elif item.get("type") == "function_call":
            tools.append({"type": "function", "function": {"name": item.get("name"),
                                                          "arguments": item.get("arguments", "")}})
    return "".join(texts), tools


def as_chat_response(kind: str, response: Any) -> dict | None:
    """``response`` (the upstream's parsed answer) in the chat shape; None when it is not one."""
    if kind == "generate" and isinstance(response, list):   # a batch: the first one counts
        response = response[0] if response else None
    if not isinstance(response, dict):
        return None
    if kind in ("chat", "completions"):
        return response
    if kind == "responses":
        if response.get("type") == "response.completed":   # a stream's final event
            response = response.get("response") or {}
        usage = response.get("usage") or {}
        text, tools = _responses_text_and_tools(response)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if tools:
            message["tool_calls"] = tools
        out: dict[str, Any] = {"id": response.get("id"), "model": response.get("model"),
                               "choices": [{"index": 0, "message": message}]}
        if "input_tokens" in usage or "output_tokens" in usage:
            out["usage"] = {"prompt_tokens": usage.get("input_tokens"),
                            "completion_tokens": usage.get("output_tokens")}
        return out
    if kind == "generate":
        meta = response.get("meta_info") or {}
        out = {"id": meta.get("id"), "choices": [{"index": 0, "message": {
            "role": "assistant", "content": response.get("text")}}]}
        if "completion_tokens" in meta:
            out["usage"] = {"prompt_tokens": meta.get("prompt_tokens"),
                            "completion_tokens": meta.get("completion_tokens")}
        return out
    return None


def stream_final(kind: str, data: dict | None, last: dict | None) -> tuple[dict | None, bool]:
    """Track a ``responses``/``generate`` stream: ``(last useful event, complete)``."""
    if not isinstance(data, dict):
        return last, False
    if kind == "responses":
        if data.get("type") == "response.completed":
            return data, True
        return last, False
    if kind == "generate" and "meta_info" in data:
        finished = (data.get("meta_info") or {}).get("finish_reason") is not None
        return data, finished
    return last, False
