"""Follow an OpenAI-style Server-Sent-Events stream without changing it.

The gateway passes the upstream's stream to the client as it arrives; on the side it feeds the
same bytes to :class:`StreamFollower`, which cuts them into events (``data: {...}`` blocks ending
in a blank line), parses each JSON chunk and rebuilds what a non-streamed response would have
held: the generated text, the tool calls (their ``function.arguments`` arrive in fragments,
merged by ``index``), ``usage``, and the time of the first generated token.

``feed`` returns the complete events (raw bytes, exactly as received, delimiter included) so a
caller that must drop one event — the usage-only chunk the gateway asked for on the client's
behalf — can forward the others byte for byte. An event that cannot be parsed or does not have
the expected shape (``choices`` not a list, a ``delta`` that is a string, …) is returned with
``data=None`` and counted in ``malformed``: it is never fatal to the stream.

This runs once per relayed event, so it is kept cheap: the usual one-line ``data: {...}`` event
is cut without splitting lines, parsed by orjson (the standard library's lenient parser only for
what orjson refuses, e.g. ``NaN``: ``lenient`` then says the result needs the exact encoder).
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

import orjson

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


@dataclass
class StreamEvent:
    raw: bytes                # the event's bytes as received, including its terminating blank line
    data: dict | None         # the parsed JSON of its data lines (None for [DONE], comments, junk)
    done: bool = False        # the ``data: [DONE]`` sentinel

    @property
    def usage_only(self) -> bool:
        """A chunk carrying only usage (``choices: []``), as sent for ``include_usage``."""
        return bool(self.data) and self.data.get("usage") is not None and not self.data.get("choices")


@dataclass
class StreamFollower:
    """Accumulates a chat/completions stream into a response-shaped dict (see module doc)."""

    t_first_token: float | None = None
    text_parts: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict] = field(default_factory=dict)
    usage: dict | None = None
    model: str | None = None
    response_id: str | None = None
    finish_reason: str | None = None
    content_chunks: int = 0
    saw_done: bool = False
    malformed: int = 0        # events that could not be parsed or absorbed (passed on as they are)
    lenient: bool = False     # some event needed the lenient parser (NaN, Infinity, huge numbers)
    _buffer: bytes = b""

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        """Consume bytes; return the events completed by them, in order."""
        buf = self._buffer + chunk if self._buffer else chunk
        events: list[StreamEvent] = []
        start = 0
        for m in _EVENT_END.finditer(buf):
            events.append(self._parse(buf[start: m.end()]))
            start = m.end()
        self._buffer = buf[start:] if start else buf
        return events

    def flush(self) -> list[StreamEvent]:
        """Events left in the buffer at end of stream (a final event without a blank line)."""
        if not self._buffer:
            return []
        raw, self._buffer = self._buffer, b""
        return [self._parse(raw)]

    def _parse(self, raw: bytes) -> StreamEvent:
        body = raw.rstrip(b"\r\n")
        if body.startswith(b"data:") and b"\n" not in body and b"\r" not in body:
            payload = body[5:].lstrip()          # the usual event: one data line
        else:
            data_lines = [line[5:].lstrip() for line in raw.splitlines() if line.startswith(b"data:")]
            if not data_lines:
                return StreamEvent(raw, None)
            payload = b"\n".join(data_lines)
        if payload.strip() == b"[DONE]":
            self.saw_done = True
            return StreamEvent(raw, None, done=True)
        try:
            try:
                data = orjson.loads(payload)
            except orjson.JSONDecodeError:
                data = json.loads(payload)       # NaN, Infinity, 1e400, lone surrogates
                self.lenient = True
            if not isinstance(data, dict):
                raise ValueError("an SSE chunk that is not a JSON object")
            self._absorb(data)
        except Exception:  # junk, too deep, or the wrong shape: pass it on, remember nothing
            self.malformed += 1
            return StreamEvent(raw, None)
        return StreamEvent(raw, data)

    def _absorb(self, data: dict) -> None:
        self.model = self.model or data.get("model")
        self.response_id = self.response_id or data.get("id")
        if data.get("usage"):
            self.usage = data["usage"]
        choices = data.get("choices")
        if choices is None:
            choices = []
        if not isinstance(choices, list):
            raise ValueError("choices is not a list")
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # n > 1: the log keeps the first choice, as ingest reads choices[0]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            text = delta.get("content") if delta else choice.get("text")
            produced = False
            if text:
                self.text_parts.append(text)
                produced = True
            for tc in delta.get("tool_calls") or ():
                produced = True
                slot = self.tool_calls.setdefault(int(tc.get("index", 0)),
                                                  {"id": None, "type": "function",
                                                   "function": {"name": "", "arguments": ""}})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
            if produced:
                self.content_chunks += 1
                if self.t_first_token is None:
                    self.t_first_token = time.time()

    def response(self, chat: bool = True) -> dict:
        """The accumulated stream as a non-streamed response body (choices[0] + usage)."""
        text = "".join(self.text_parts)
        if chat:
            message: dict = {"role": "assistant", "content": text}
            if self.tool_calls:
                message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
            choice = {"index": 0, "message": message, "finish_reason": self.finish_reason}
        else:
            choice = {"index": 0, "text": text, "finish_reason": self.finish_reason}
        out = {"id": self.response_id, "model": self.model, "choices": [choice]}
        if self.usage is not None:
            out["usage"] = self.usage
        return out
