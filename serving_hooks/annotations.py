"""From sys_annotations to the bytes the upstream receives.

Three jobs, each a pure function:

* :func:`find_app_metadata` — where the client put ``app_metadata``: at the top level of the
  request body (what the OpenAI Python SDK sends for ``extra_body={"app_metadata": ...}``: it
  merges ``extra_body`` into the JSON body) or nested under a literal ``extra_body`` key (clients
  that send the field as is).
* :func:`flatten_for_sglang` — SGLang drops undeclared request fields, so the scheduler only sees
  ``priority`` (int) and ``custom_params`` (a flat dict of scalars, read by the plugin as
  ``req.sampling_params.custom_params``). This is the one place that maps sys_annotations onto
  that flat dict (CONTRACTS §5).
* :func:`forward_body` — the request body sent upstream. When the only change is adding new
  top-level keys, they are spliced in right after the opening ``{`` of the client's bytes, so
  every byte the client sent is forwarded unchanged (and a 100 kB prompt is not re-encoded).
  Only when a key must be changed in place (nested ``extra_body``, an existing key, metadata
  stripped) is the body re-serialized.
"""
from __future__ import annotations

import json
from typing import Any

#: Keys of the flat ``custom_params`` dict, in order (CONTRACTS §5). Missing values are None.
CUSTOM_PARAM_KEYS = ("wf_type", "wf_id", "agent", "known", "pred_out_lo", "pred_out_hi", "priority",
                     "exp_remaining_calls", "exp_remaining_s", "next_agent", "next_agent_p",
                     "tool_p95_s", "retain_s", "profile_version", "p_end", "session_age_s",
                     "pred_out_mean", "keep_alive_ttl_s")


def find_app_metadata(body: Any) -> tuple[dict | None, str | None]:
    """``(app_metadata, where)`` with where ``"top"`` or ``"extra_body"``; ``(None, None)`` if absent."""
    if not isinstance(body, dict):
        return None, None
    meta = body.get("app_metadata")
    if isinstance(meta, dict):
        return meta, "top"
    extra = body.get("extra_body")
    if isinstance(extra, dict) and isinstance(extra.get("app_metadata"), dict):
        return extra["app_metadata"], "extra_body"
    return None, None


def _first(seq: Any, key: str) -> Any:
    if isinstance(seq, list) and seq and isinstance(seq[0], dict):
        return seq[0].get(key)
    return None


def flatten_for_sglang(sys_annotations: dict, app_metadata: dict | None = None) -> dict:
    """The flat ``custom_params`` dict of scalars for SGLang (CONTRACTS §5).

    ``wf_type``/``wf_id``/``agent`` come from the ids the predictor echoes in sys_annotations
    (``workflow_type_id``, ``workflow_id``, ``agent_id``), else from ``app_metadata``.
    ``tool_p95_s`` is the p95 of the agent's most frequent tool (the first entry of
    ``tool_latency``, which the predictor orders by frequency); ``retain_s`` is the predictor's
    keep-alive TTL hint for that tool (the profile's ``ttl_s``), which the keep/drop policy bounds;
    ``p_end`` (probability no call follows, from the automaton) drives early drops and
    ``session_age_s`` the workflow-level aging of the priority in the scheduler;
    ``pred_out_mean`` (the agent's mean output length) times the plugin's prefetch;
    ``keep_alive_ttl_s`` is the idle-gap TTL (finish → the session's next call, scaled by the
    session's own gaps), which the keep/drop policy prefers over ``retain_s``. Every key of
    :data:`CUSTOM_PARAM_KEYS` is present (None = unknown).
    """
    ann = sys_annotations or {}
    meta = app_metadata or {}
    band = ann.get("predicted_output_len") or (None, None)
    tools = ann.get("tool_latency") or {}
    first_tool = next(iter(tools.values()), None) if isinstance(tools, dict) else None
    next_agents = ann.get("next_agents")
    flat = {
        "wf_type": ann.get("workflow_type_id", meta.get("workflow_type_id")),
        "wf_id": ann.get("workflow_id", meta.get("workflow_id")),
        "agent": ann.get("agent_id", meta.get("agent_id")),
        "known": bool(ann.get("known", False)),
        "pred_out_lo": band[0],
        "pred_out_hi": band[1],
        "priority": ann.get("priority"),
        "exp_remaining_calls": ann.get("expected_remaining_calls"),
        "exp_remaining_s": ann.get("expected_remaining_s"),
        "next_agent": _first(next_agents, "agent_id"),
        "next_agent_p": _first(next_agents, "p"),
        "tool_p95_s": first_tool.get("p95_s") if isinstance(first_tool, dict) else None,
        "retain_s": ann.get("retain_s"),
        "profile_version": ann.get("profile_version"),
        "p_end": ann.get("p_end"),
        "session_age_s": ann.get("session_age_s"),
        "pred_out_mean": ann.get("output_len_mean"),
        "keep_alive_ttl_s": ann.get("keep_alive_ttl_s"),
    }
    for key in ("wf_type", "wf_id", "agent"):
        if flat[key] is not None and not isinstance(flat[key], str):
            flat[key] = str(flat[key])
    return flat


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()  # never NaN/Infinity


def forward_body(raw: bytes, body: dict, where: str | None, sys_annotations: dict | None, *,
                 sglang_fields: bool = False, strip_metadata: bool = False,
                 request_stream_usage: bool = False) -> bytes:
    """The body to send upstream (see module doc).

    ``sys_annotations`` None means "not annotated" (fail-open): the annotation keys are not added.
    ``sglang_fields`` adds ``priority`` (when the annotations carry one) and ``custom_params``;
    ``strip_metadata`` removes ``app_metadata`` and does not add ``sys_annotations`` (for
    upstreams that reject unknown fields); ``request_stream_usage`` sets
    ``stream_options.include_usage`` so a streamed response reports token counts.
    """
    add: dict[str, Any] = {}
    replace: dict[str, Any] = {}
    if sys_annotations is not None and not strip_metadata:
        if where == "extra_body":
            extra = dict(body["extra_body"])
            extra["sys_annotations"] = sys_annotations
            replace["extra_body"] = extra
        else:
            add["sys_annotations"] = sys_annotations
    if sys_annotations is not None and sglang_fields:
        if sys_annotations.get("priority") is not None:
            add["priority"] = int(sys_annotations["priority"])
        flat = flatten_for_sglang(sys_annotations, find_app_metadata(body)[0])
        client_params = body.get("custom_params")
        add["custom_params"] = {**client_params, **flat} if isinstance(client_params, dict) else flat
    if request_stream_usage:
        options = body.get("stream_options")
        add["stream_options"] = {**options, "include_usage": True} if isinstance(options, dict) \
            else {"include_usage": True}
    for key in list(add):
        if key in body:
            replace[key] = add.pop(key)
    if strip_metadata and (where is not None):
        if where == "top":
            replace["app_metadata"] = None
        else:
            extra = dict(replace.get("extra_body", body["extra_body"]))
            extra.pop("app_metadata", None)
            replace["extra_body"] = extra
    if not add and not replace:
        return raw
    if not replace and body:
        start = len(raw) - len(raw.lstrip())
        if raw[start:start + 1] == b"{":
            spliced = b"".join(_dumps(k) + b":" + _dumps(v) + b"," for k, v in add.items())
            return raw[: start + 1] + spliced + raw[start + 1:]
    out = dict(body)
    for key, value in replace.items():
        if key == "app_metadata" and value is None:
            out.pop(key, None)
        else:
            out[key] = value
    out.update(add)
    return _dumps(out)
