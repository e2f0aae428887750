"""OpenHands V1 (the software agent SDK) -> flat records.

The SDK (OpenHands/software-agent-sdk, ``openhands-sdk/openhands/sdk/event/``) records a
conversation as typed events, each ``{"kind", "id", "timestamp", "source", ...}``:

* ``ActionEvent`` (``source: agent``): a tool call the model made — ``tool_name``,
  ``tool_call_id``, ``llm_response_id`` (the LLM response that produced it), ``action``;
* ``ObservationEvent`` / ``AgentErrorEvent`` / ``UserRejectObservation``: the tool's result —
  ``action_id`` (the ``ActionEvent``'s id) and/or ``tool_call_id``;
* ``MessageEvent``: a chat message (the agent's, with ``llm_response_id`` when a model wrote it).

Per-call token counts live in the conversation's stats, one ``Metrics`` per LLM usage
(``ConversationStats.usage_to_metrics``: ``{"agent": {"token_usages": [{"prompt_tokens",
"completion_tokens", "cache_read_tokens", "response_id"}], "response_latencies": [{"latency",
"response_id"}], ...}}``), as in V0's ``metrics``. Two containers are read:

* a **persisted conversation folder**: ``base_state.json`` (with ``stats.usage_to_metrics``)
  and ``events/event-NNNNN-<id>.json``, one event per file (``Conversation(persistence_dir=...)``);
* an **evaluation ``output.jsonl``** line whose ``history`` holds V1 events (``kind``) and whose
  ``metrics`` is one ``Metrics``.

One flat record per ``token_usages`` entry whose ``response_id`` some event names:
``t_finish`` = the first such event's timestamp, ``t_arrival`` = ``t_finish - latency``; each
action of the response with a result becomes a ``tool_calls`` entry (``tool_name``, from the
action's to the result's timestamp, ``error`` for ``AgentErrorEvent``); ``agent_id`` = the usage
id (``agent``; a ``condenser`` LLM has its own). Calls no event points to cannot be placed in
time and are reported.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from store.importers._common import (
    ErrorHandler,
    ImportFormatError,
    count_field,
    iso_to_epoch,
    load_json_document,
    report,
)
from store.importers.openhands_time import choose_zone

DEFAULT_WORKFLOW_TYPE = "openhands"
RESULT_KINDS = ("ObservationEvent", "AgentErrorEvent", "UserRejectObservation")


def is_v1_output(out: Any) -> bool:
    """Whether an ``output.jsonl`` entry holds V1 SDK events (``kind``) in its history."""
    history = out.get("history") if isinstance(out, dict) else None
    return isinstance(history, list) and any(isinstance(e, dict) and "kind" in e for e in history[:5])


def _usages(metrics_by_usage: dict[str, Any]) -> Iterator[tuple[str, int, dict, dict[str, float]]]:
    for usage_id, m in metrics_by_usage.items():
        if not isinstance(m, dict):
            continue
        latencies = {r.get("response_id"): r.get("latency") for r in m.get("response_latencies") or []
                     if isinstance(r, dict)}
        for k, u in enumerate(m.get("token_usages") or []):
            if isinstance(u, dict):
                yield str(usage_id), k, u, latencies


def records(events: list[dict], metrics_by_usage: dict[str, Any], workflow_id: str, where: str, tz,
            workflow_type: str | None, with_text: bool, on_error: ErrorHandler | None,
            line: int | None = None, default_model: str | None = None) -> Iterator[dict]:
    """Flat records of one V1 conversation (its events and its ``usage_to_metrics``)."""
    def fail(reason: str, field: str) -> ImportFormatError:
        return ImportFormatError(where, line, reason, field)

    times: dict[Any, float] = {}
    for e in events:
        try:
            times[e.get("id")] = iso_to_epoch(str(e["timestamp"]), tz)
        except (KeyError, ValueError) as exc:
            report(on_error, fail(f"event {e.get('id')}: unreadable timestamp ({exc})", "timestamp"))
    timed = sorted((e for e in events if e.get("id") in times), key=lambda e: times[e.get("id")])
    by_response: dict[str, list[dict]] = {}
    for e in timed:
        if e.get("llm_response_id") and e.get("kind") in ("ActionEvent", "MessageEvent"):
            by_response.setdefault(str(e["llm_response_id"]), []).append(e)
    result_of: dict[str, dict] = {}
    for e in timed:
        if e.get("kind") in RESULT_KINDS:
            for key in (e.get("action_id"), e.get("tool_call_id")):
                if key:
                    result_of.setdefault(str(key), e)
    n_usages = 0
    for usage_id, k, usage, latencies in _usages(metrics_by_usage):
        n_usages += 1
        field = f"usage_to_metrics.{usage_id}.token_usages[{k}]"
        rid = usage.get("response_id")
        produced = by_response.get(str(rid)) if rid else None
        if not produced:
            report(on_error, fail(f"response {rid}: no event was produced by it, so its time is unknown; "
                                  "call skipped", field))
            continue
        n_in, n_out = count_field(usage.get("prompt_tokens")), count_field(usage.get("completion_tokens"))
        latency = latencies.get(rid)
        if n_in is None or n_out is None:
            report(on_error, fail(f"response {rid}: bad or missing token count", field))
            continue
        if not isinstance(latency, (int, float)) or isinstance(latency, bool):
            report(on_error, fail(f"response {rid}: no response_latencies entry, so its start is unknown",
                                  f"usage_to_metrics.{usage_id}.response_latencies"))
            continue
        t_finish = times[produced[0].get("id")]
        rec: dict[str, Any] = {
            "request_id": f"{workflow_id}/{rid}", "workflow_type_id": workflow_type or DEFAULT_WORKFLOW_TYPE,
            "workflow_id": workflow_id, "agent_id": usage_id,
            "t_arrival": t_finish - float(latency), "t_finish": t_finish, "input_tokens": n_in, "output_tokens": n_out,
        }
        if (cached := count_field(usage.get("cache_read_tokens"))) is not None:
            rec["cached_tokens"] = cached
        if (model := usage.get("model") or default_model):
            rec["model"] = str(model)
        tools = []
        for a in produced:
            if a.get("kind") != "ActionEvent":
                continue
            res = result_of.get(str(a.get("id"))) or result_of.get(str(a.get("tool_call_id") or ""))
            if res is None:
                continue
            tools.append({"name": str(a.get("tool_name") or "tool"), "t_start": times[a.get("id")],
                          "t_end": max(times[res.get("id")], times[a.get("id")]),
                          "status": "error" if res.get("kind") != "ObservationEvent" else "ok"})
        if tools:
            rec["tool_calls"] = tools
        if with_text:
            thought = produced[0].get("thought")
            if isinstance(thought, list):
                rec["response_text"] = "\n".join(str(t.get("text", "")) for t in thought if isinstance(t, dict))
        rec.update({"actions": [a.get("tool_name") or a.get("kind") for a in produced], "source_format": "openhands",
                    "openhands_version": 1, "import_source": f"{where}:{line}" if line else where})
        yield rec
    if n_usages == 0:
        report(on_error, fail(f"{len(events)} events but no token_usages in the conversation's metrics: no call "
                              "can be sized", "usage_to_metrics"))


def output_records(out: dict, path: Path, line: int, tz, workflow_type: str | None, with_text: bool,
                   on_error: ErrorHandler | None) -> Iterator[dict]:
    """Records of one V1 evaluation ``output.jsonl`` entry."""
    if not out.get("instance_id"):
        raise ImportFormatError(str(path), line, "not an OpenHands EvalOutput: no instance_id", "instance_id")
    metrics = out.get("metrics")
    if not isinstance(metrics, dict):
        raise ImportFormatError(str(path), line, "no metrics: no per-call token usage", "metrics")
    usage = metrics.get("usage_to_metrics") if isinstance(metrics.get("usage_to_metrics"), dict) else {"agent": metrics}
    workflow_id = f"{path.parent.name}/{out['instance_id']}" if path.parent.name else str(out["instance_id"])
    model = ((out.get("metadata") or {}).get("llm_config") or {}).get("model")
    yield from records([e for e in out["history"] if isinstance(e, dict)], usage, workflow_id, str(path), tz,
                       workflow_type, with_text, on_error, line, model)


def read_conversation(path: Path, *, workflow_type: str | None = None, timezone: str | None = None,
                      with_text: bool = True, on_error: ErrorHandler | None = None) -> Iterator[dict]:
    """Records of a persisted SDK conversation: ``base_state.json`` and its ``events/`` folder."""
    try:
        state = load_json_document(path)
    except ImportFormatError as err:
        report(on_error, err)
        return
    events: list[dict] = []
    folder = path.parent / "events"
    for f in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            e = json.loads(f.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            report(on_error, ImportFormatError(str(f), None, f"not valid JSON ({exc})"))
            continue
        if isinstance(e, dict):
            events.append(e)
    if not events:
        report(on_error, ImportFormatError(str(path), None, f"no events/*.json beside it ({folder}): nothing "
                                           "to place in time", "events"))
        return
    stats = state.get("stats") if isinstance(state, dict) else None
    usage = stats.get("usage_to_metrics") if isinstance(stats, dict) else None
    if not isinstance(usage, dict):
        report(on_error, ImportFormatError(str(path), None, "no stats.usage_to_metrics: this conversation kept "
                                           "no per-call token usage", "stats.usage_to_metrics"))
        return
    any_naive = any(isinstance(e.get("timestamp"), str) and "+" not in e["timestamp"][10:]
                    and not e["timestamp"].endswith("Z") for e in events)
    tz = choose_zone(path, timezone, [], any_naive, on_error)
    workflow_id = str(state.get("id") or path.parent.name)
    model = ((state.get("agent") or {}).get("llm") or {}).get("model") if isinstance(state.get("agent"), dict) else None
    yield from records(events, usage, workflow_id, str(path), tz, workflow_type, with_text, on_error, None, model)
