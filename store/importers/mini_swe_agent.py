"""mini-SWE-agent trajectories (``<instance>.traj.json``) -> flat records.

A mini-SWE-agent trajectory (SWE-agent/mini-swe-agent ``docs/usage/output_files.md``;
``trajectory_format`` ``mini-swe-agent-1`` and, from v2.0, ``mini-swe-agent-1.1``) is one JSON
document ``{"info": {"model_stats": {"instance_cost", "api_calls"}, "config": {...},
"mini_version", "exit_status", "submission"}, "messages": [...], "trajectory_format",
"instance_id"}``. ``messages`` are OpenAI chat messages plus an ``extra`` object; an assistant
message made by a model carries the raw LiteLLM response in ``extra.response``: ``{"id",
"created": <epoch s>, "model", "choices", "usage": {"prompt_tokens", "completion_tokens",
"prompt_tokens_details": {"cached_tokens"}, "completion_tokens_details": {"reasoning_tokens"}}}``.

One flat record per assistant message with ``extra.response.usage``:

=================================================  ==========================================
source                                             flat record field
=================================================  ==========================================
``usage.prompt_tokens`` / ``completion_tokens``    ``input_tokens`` / ``output_tokens``
``usage.prompt_tokens_details.cached_tokens``      ``cached_tokens``
``usage.completion_tokens_details.reasoning_tokens``  ``reasoning_tokens``
``response.created`` (1 s resolution)              ``t_arrival`` = ``t_finish``, flagged
                                                   ``timing = "created_only"``: the gaps between
                                                   calls are real, call durations unknown
``extra.timestamp`` of the message, when written   ``t_finish`` (then the call has a duration)
``response.model`` (else ``info.config.model``)    ``model``
first word of the message's bash block             ``action`` (the tool; no tool timing exists)
(``extra.actions[0].command`` in v2)
preceding messages / the content                   ``messages`` / ``response_text``
``instance_id`` (else the file name)               ``workflow_id``; agent ``main``
=================================================  ==========================================

A trajectory whose messages carry no ``usage`` (a model class that does not keep the response)
gives no calls and the report says so; a message without ``created`` is placed in order only.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from store.importers._common import (
    TIMING_ONE_STAMP,
    ErrorHandler,
    ImportFormatError,
    count_field,
    first_word,
    load_json_document,
    report,
)

NAME = "mini-swe-agent"
SUMMARY = "mini-SWE-agent .traj.json trajectories (per-message usage and created)"
FILE_PATTERNS = ("*.traj.json",)
DEFAULT_WORKFLOW_TYPE = "mini_swe_agent"
BASH_BLOCK = re.compile(r"```(?:bash|sh)?\s*\n(.*?)\n```", re.DOTALL)


def _command_of(msg: dict) -> str | None:
    extra = msg.get("extra") if isinstance(msg.get("extra"), dict) else {}
    actions = extra.get("actions")
    if isinstance(actions, list) and actions and isinstance(actions[0], dict):
        return str(actions[0].get("command") or "") or None
    content = msg.get("content")
    if isinstance(content, str) and (m := BASH_BLOCK.search(content)):
        return m.group(1)
    return None


def _epoch(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


def _chat(messages: list) -> list[dict]:
    return [{"role": m.get("role"), "content": m.get("content")} for m in messages
            if isinstance(m, dict) and isinstance(m.get("content"), str)]


def read_file(path: Path, *, workflow_type: str | None = None, with_text: bool = True,
              on_error: ErrorHandler | None = None, **_: Any) -> Iterator[dict]:
    """Flat records for one mini-SWE-agent trajectory (see the module docstring)."""
    try:
        doc = load_json_document(path)
        if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
            raise ImportFormatError(str(path), None, "not a mini-SWE-agent trajectory: expected a JSON object "
                                    "with a \"messages\" list", "messages")
    except ImportFormatError as err:
        report(on_error, err)
        return
    info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
    name = path.name.removesuffix(".json").removesuffix(".traj")
    workflow_id = str(doc.get("instance_id") or name)
    config_model = ((info.get("config") or {}).get("model") or {}).get("model_name") \
        if isinstance(info.get("config"), dict) else None
    messages = doc["messages"]
    n_assistant = 0
    k = 0
    for index, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") != "assistant":
            continue
        n_assistant += 1
        field = f"messages[{index}].extra.response.usage"
        extra = msg.get("extra") if isinstance(msg.get("extra"), dict) else {}
        response = extra.get("response") if isinstance(extra.get("response"), dict) else {}
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else None
        if usage is None:
            continue
        n_in, n_out = count_field(usage.get("prompt_tokens")), count_field(usage.get("completion_tokens"))
        if n_in is None or n_out is None:
            report(on_error, ImportFormatError(str(path), None, "prompt_tokens / completion_tokens missing or "
                                               "not a non-negative integer; call skipped", field))
            continue
        created, stamp = _epoch(response.get("created")), _epoch(extra.get("timestamp"))
        if created is None:
            report(on_error, ImportFormatError(str(path), None, "no response.created time; call skipped",
                                               f"messages[{index}].extra.response.created"))
            continue
        k += 1
        rec: dict[str, Any] = {
            "request_id": f"{workflow_id}#{k}", "workflow_type_id": workflow_type or DEFAULT_WORKFLOW_TYPE,
            "workflow_id": workflow_id, "agent_id": "main",
            "t_arrival": created, "t_finish": stamp if stamp is not None and stamp >= created else created,
            "input_tokens": n_in, "output_tokens": n_out,
        }
        if rec["t_finish"] == created:
            rec["timing"] = TIMING_ONE_STAMP
        details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
        if (cached := count_field(details.get("cached_tokens"))) is not None:
            rec["cached_tokens"] = cached
        out_details = usage.get("completion_tokens_details")
        if isinstance(out_details, dict) and (r := count_field(out_details.get("reasoning_tokens"))) is not None:
            rec["reasoning_tokens"] = r
        if (model := response.get("model") or config_model):
            rec["model"] = str(model)
        if (command := _command_of(msg)) and (tool := first_word(command)):
            rec["action"] = tool
        if with_text:
            rec["messages"] = _chat(messages[:index])
            if isinstance(msg.get("content"), str):
                rec["response_text"] = msg["content"]
        rec.update({"source_format": NAME, "import_source": f"{path}#messages[{index}]"})
        yield rec
    if k == 0 and n_assistant:
        report(on_error, ImportFormatError(str(path), None, f"{n_assistant} assistant messages but none "
                                           "carries extra.response.usage (per-call token counts); nothing "
                                           "to import", "messages[].extra.response.usage"))
