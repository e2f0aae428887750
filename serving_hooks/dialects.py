"""Engine dialects: one annotation rendered as each serving engine's own hint fields.

Every engine now has a place for per-request workflow hints and none has a source for them; the
gateway is that source. The prediction is made once (the annotation contract
:class:`predictors.contract.Annotation`); a *dialect* is only a rendering of it: ``sglang``
(top-level ``priority`` and flat ``custom_params``), ``vllm`` (``priority`` negated, since lower
runs first there, and ``vllm_xargs``), ``dynamo`` (``nvext.agent_hints`` and the agent identity
in the upstream's spelling, chosen by ``--dynamo-api``, :data:`DYNAMO_APIS`: ``session``,
``trajectory`` or ``agent_context``) and ``headers`` (``X-Agentprof-*``, body unchanged).

How annotation fields become hint values is decided in **one** place, :func:`hint_values` (a
:class:`HintValues`: ``priority``, ``osl``, ``ttl_s``, ``speculative_prefill``,
``strict_priority``, ``session_end``); every renderer reads only that, so a new dialect cannot
drift from the others. Renderers are pure: ``render(dialect, values, body, endpoint) -> (patch,
headers)``, ``patch`` mapping top-level body keys to new values (client values of the same dicts
merged, ours win).

The field-by-field table with each engine's source, Dynamo's three identity spellings, how each
hint value is derived and the end of session per dialect: docs/dialects.md ("Dialect rendering
(serving_hooks/dialects.py)").
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from predictors.contract import Annotation, header_fields

#: Dialects ``profiler gateway --dialect`` accepts.
DIALECTS = ("sglang", "vllm", "dynamo", "headers")
#: Priority order a dialect's engine uses by default ("high_first": larger runs first).
DEFAULT_PRIORITY_ORDER = {"sglang": "high_first", "vllm": "low_first", "dynamo": "high_first",
                          "headers": "high_first"}
#: Prefix of the header dialect's headers.
HEADER_PREFIX = "X-Agentprof-"
#: ``p_end`` below which the session is expected to continue (speculative prefill pays off).
CONTINUE_P_END = 0.5
#: Dynamo's session headers (ai-dynamo/dynamo PR #10896).
DYNAMO_SESSION_ID_HEADER = "X-Dynamo-Session-ID"
DYNAMO_SESSION_FINAL_HEADER = "X-Dynamo-Session-Final"
#: The spellings of Dynamo's agent identity ``--dynamo-api`` accepts, newest first (docs/dialects.md),
#: each with its ``(chain, parent chain, final)`` header names (None: the body spelling).
DYNAMO_APIS: dict[str, tuple[str, str, str] | None] = {
    "session": (DYNAMO_SESSION_ID_HEADER, "X-Dynamo-Parent-Session-ID", DYNAMO_SESSION_FINAL_HEADER),
    "trajectory": ("x-dynamo-trajectory-id", "x-dynamo-parent-trajectory-id",
                   "x-dynamo-trajectory-final"),
    "agent_context": None,
}
#: Identity sources (``serving_hooks.identity``) whose headers Dynamo maps to its session itself
#: (``agents.rs``: Claude Code, Codex, OpenCode): for them only the final flag is added.
DYNAMO_NATIVE_SOURCES = ("claude_code", "codex", "opencode")
#: Dynamo's ``AgentHints.priority`` is an i32: a larger priority is clamped to its range.
I32 = 2**31
#: Dynamo's ``strict_priority`` tier of each latency class (docs/dialects.md).
STRICT_PRIORITY = {"interactive": 1, "batch": 0}


@dataclass(frozen=True)
class HintValues:
    """The engine-neutral hint values of one call (docs/dialects.md)."""

    known: bool
    flat: dict[str, Any]
    priority: int | None
    osl: int | None
    ttl_s: int | None
    speculative_prefill: bool | None
    session_end: bool = False
    #: the annotation the values come from (its class names the header fields)
    annotation: Annotation | None = None
    #: Dynamo's router tier from the latency class (:data:`STRICT_PRIORITY`)
    strict_priority: int | None = None
    #: the agent chain as the client named it (``app_metadata.program_id``, read from Dynamo's
    #: identity), its parent, and whether the client flagged the chain's last call
    program_id: str | None = None
    parent_program_id: str | None = None
    program_final: bool = False


def hint_values(annotation: Annotation | Mapping[str, Any],
                app_metadata: Mapping[str, Any] | None = None) -> HintValues:
    """The one mapping from annotation fields to hint values (docs/dialects.md)."""
    ann = Annotation.from_dict(annotation, app_metadata)   # the contract object itself: no parse
    flat = ann.flat(app_metadata)
    osl = None
    if ann.known:
        if ann.output_len_mean is not None:
            osl = max(0, round(ann.output_len_mean))
        elif ann.predicted_output_len is not None:
            osl = round((ann.output_lo + ann.output_hi) / 2)
    ttl = ann.keep_alive_ttl_s if ann.keep_alive_ttl_s is not None else ann.retain_s
    ttl_s = int(math.ceil(ttl)) if ann.known and ttl is not None and ttl > 0 else None
    spec = None
    if ann.known:
        spec = ann.p_end < CONTINUE_P_END if ann.p_end is not None else ann.next_agent is not None
    meta = app_metadata if isinstance(app_metadata, Mapping) else {}
    ids = {k: meta[k] if isinstance(meta.get(k), str) and meta[k] else None
           for k in ("program_id", "parent_program_id")}
    return HintValues(known=ann.known, flat=flat, priority=ann.sglang_priority() if ann.known else None,
                      osl=osl, ttl_s=ttl_s, speculative_prefill=spec,
                      session_end=ann.session_end is True, annotation=ann,
                      strict_priority=STRICT_PRIORITY.get(ann.latency_class) if ann.known else None,
                      program_final=meta.get("program_final") is True, **ids)


def engine_priority(priority: int | None, order: str) -> int | None:
    """Our priority (larger first) in an engine's order (``low_first`` negates it)."""
    if priority is None:
        return None
    if order not in ("high_first", "low_first"):
        raise ValueError(f"priority order {order!r}: expected high_first or low_first")
    return -priority if order == "low_first" else priority


def _merged(body: Mapping[str, Any], key: str, ours: Mapping[str, Any]) -> dict[str, Any]:
    """The client's dict at ``body[key]`` (if any) with ``ours`` on top."""
    theirs = body.get(key)
    return {**theirs, **ours} if isinstance(theirs, Mapping) else dict(ours)


def render_sglang(v: HintValues, body: Mapping[str, Any], endpoint: str,
                  order: str = "high_first") -> tuple[dict, dict]:
    patch: dict[str, Any] = {}
    prio = engine_priority(v.priority, order)
    if prio is not None:
        patch["priority"] = prio
    if endpoint == "generate":   # GenerateReqInput: custom_params live in sampling_params
        sp = body.get("sampling_params")
        sp = dict(sp) if isinstance(sp, Mapping) else {}
        sp["custom_params"] = _merged(sp, "custom_params", v.flat)
        patch["sampling_params"] = sp
    else:
        patch["custom_params"] = _merged(body, "custom_params", v.flat)
    return patch, {}


def xargs(flat: Mapping[str, Any]) -> dict[str, str | int | float]:
    """The flat form as vLLM's ``vllm_xargs`` accepts it: no None, booleans as 0/1."""
    out: dict[str, str | int | float] = {}
    for k, val in flat.items():
        if val is None:
            continue
        out[k] = int(val) if isinstance(val, bool) else val
    return out


def render_vllm(v: HintValues, body: Mapping[str, Any], endpoint: str,
                order: str = "low_first") -> tuple[dict, dict]:
    patch: dict[str, Any] = {}
    prio = engine_priority(v.priority, order)
    if prio is not None:
        patch["priority"] = prio
    patch["vllm_xargs"] = _merged(body, "vllm_xargs", xargs(v.flat))
    return patch, {}


def render_dynamo(v: HintValues, body: Mapping[str, Any], endpoint: str,
                  order: str = "high_first", api: str = "session",
                  native_identity: bool = False) -> tuple[dict, dict]:
    """``nvext.agent_hints`` and the identity / final flag in the ``api`` spelling (docs/dialects.md);
    ``native_identity``: the request names its chain in agent headers Dynamo maps itself, so
    (header spellings) only the final flag is added and Dynamo's own mapping names the session."""
    if api not in DYNAMO_APIS:
        raise ValueError(f"dynamo api {api!r}: expected one of {', '.join(DYNAMO_APIS)}")
    hints: dict[str, Any] = {}
    prio = engine_priority(v.priority, order)
    if prio is not None:                             # AgentHints.priority is an i32
        hints["priority"] = max(-I32, min(I32 - 1, prio))
    if v.strict_priority is not None:
        hints["strict_priority"] = v.strict_priority
    if v.osl is not None:
        hints["osl"] = v.osl
    if v.speculative_prefill is not None:
        hints["speculative_prefill"] = v.speculative_prefill
    nvext = body.get("nvext")
    nvext = dict(nvext) if isinstance(nvext, Mapping) else {}
    merged = _merged(nvext, "agent_hints", hints)
    merged.pop("latency_sensitivity", None)          # deprecated in Dynamo: never forwarded
    nvext["agent_hints"] = merged
    wf = v.flat.get("wf_id")
    chain = v.program_id or (str(wf) if wf is not None else None)
    final = v.session_end or v.program_final
    headers: dict[str, str] = {}
    names = DYNAMO_APIS[api]
    if names is not None:                            # session / trajectory: headers only
        nvext.pop("agent_context", None)             # refused by these versions (read already)
        nvext.pop("session_control", None)
        if chain is not None:
            own, parent, final_name = names
            if not native_identity:
                headers[own] = chain
                if v.parent_program_id is not None:
                    headers[parent] = v.parent_program_id
            if final:
                headers[final_name] = "true"
    elif chain is not None:                          # agent_context (Dynamo <= v1.2)
        ctx = {"workflow_type_id": v.flat.get("wf_type"), "workflow_id": wf, "program_id": chain,
               "parent_program_id": v.parent_program_id}
        nvext["agent_context"] = _merged(nvext, "agent_context",
                                         {k: str(x) for k, x in ctx.items() if x is not None})
        control: dict[str, Any] | None = None
        if final:
            control = {"session_id": chain, "action": "close"}
        elif v.speculative_prefill:                  # a return is predicted: keep it sticky
            control = {"session_id": chain}
            age = v.annotation.session_age_s if v.annotation is not None else None
            if not age:                              # the session's first call
                control.update(action="open", timeout=max(1, v.ttl_s or 300))
        if control is not None:
            nvext["session_control"] = control
    return {"nvext": nvext}, headers


def _header_value(val: Any) -> str:
    if isinstance(val, bool):
        return "1" if val else "0"
    if isinstance(val, float):
        return f"{val:.6g}"
    return str(val)


#: Header dialect: header suffix -> key of the flat form, generated from the contract's field
#: declarations (:func:`predictors.contract.header_fields`; plus the derived values below).
HEADER_FIELDS = header_fields(Annotation)


def render_headers(v: HintValues, body: Mapping[str, Any], endpoint: str,
                   order: str = "high_first") -> tuple[dict, dict]:
    names = header_fields(type(v.annotation)) if v.annotation is not None else HEADER_FIELDS
    headers = {HEADER_PREFIX + name: _header_value(v.flat.get(key))
               for name, key in names if v.flat.get(key) is not None}
    prio = engine_priority(v.priority, order)
    for name, val in (("Priority", prio), ("Osl", v.osl), ("Kv-Ttl-S", v.ttl_s),
                      ("Speculative-Prefill", v.speculative_prefill)):
        if val is not None:
            headers[HEADER_PREFIX + name] = _header_value(val)
    return {}, headers


RENDERERS = {"sglang": render_sglang, "vllm": render_vllm, "dynamo": render_dynamo,
             "headers": render_headers}


def render(dialect: str, values: HintValues, body: Mapping[str, Any], endpoint: str = "chat",
           priority_order: str | None = None, dynamo_api: str = "session",
           identity_source: str | None = None) -> tuple[dict, dict]:
    """``(body patch, extra headers)`` of ``values`` in ``dialect`` for one request ``body`` sent
    to ``endpoint`` (``chat``, ``completions``, ``responses`` or ``generate``); ``dynamo_api``:
    the spelling of Dynamo's identity the dynamo dialect speaks (:data:`DYNAMO_APIS`);
    ``identity_source``: where the gateway found the call's identity (``serving_hooks.identity``)."""
    if dialect not in RENDERERS:
        raise ValueError(f"dialect {dialect!r}: expected one of {', '.join(DIALECTS)}")
    order = priority_order or DEFAULT_PRIORITY_ORDER[dialect]
    if dialect == "dynamo":
        return render_dynamo(values, body, endpoint, order, dynamo_api,
                             identity_source in DYNAMO_NATIVE_SOURCES)
    return RENDERERS[dialect](values, body, endpoint, order)


#: Where, in each dialect, a client body could steer the engine's scheduler or KV cache itself:
#: key paths from the body's top level (also looked up inside ``extra_body``, where the OpenAI
#: SDK's callers put engine fields). The gateway removes them from every client body unless
#: ``--allow-client-scheduler-fields``, so only the profile's prediction sets them: a call
#: without ``app_metadata`` cannot raise its own priority through any dialect's field.
#:
#: * SGLang: ``priority`` (chat, completions, responses, ``/generate``); ``custom_params``
#:   (chat/completions), and ``sampling_params.custom_params`` on ``/generate`` — what the
#:   plugin reads as ``req.sampling_params.custom_params`` (``sampling_params`` may be a list
#:   there: a batch);
#: * vLLM: ``priority`` and ``vllm_xargs`` (read by custom extensions);
#: * Dynamo: ``nvext.agent_hints`` (``priority``, ``osl``, ``speculative_prefill``: all of them
#:   scheduling or router inputs) and ``nvext.cache_control`` (the KV ``ttl``); other ``nvext``
#:   keys are kept;
#: * headers: the client's own ``X-Agentprof-*`` headers (removed by the gateway's header copy).
CLIENT_SCHEDULER_PATHS: tuple[tuple[str, ...], ...] = (
    ("priority",), ("custom_params",), ("sampling_params", "custom_params"), ("vllm_xargs",),
    ("nvext", "agent_hints"), ("nvext", "cache_control"),
)
#: The keys of :data:`CLIENT_SCHEDULER_PATHS` that end a path (for a byte scan of a body that
#: is not JSON: any of them as a key token counts).
CLIENT_SCHEDULER_KEYS = tuple(sorted({path[-1] for path in CLIENT_SCHEDULER_PATHS}))


def _without_path(obj: Any, path: tuple[str, ...]) -> tuple[Any, bool]:
    """``obj`` without the key ``path`` (copied only along the way, when something goes), and
    whether it went. A list on the way (``/generate``'s batch ``sampling_params``) is walked."""
    if isinstance(obj, list):
        parts = [_without_path(item, path) for item in obj]
        if not any(gone for _, gone in parts):
            return obj, False
        return [item for item, _ in parts], True
    if not isinstance(obj, dict) or path[0] not in obj:
        return obj, False
    if len(path) == 1:
        return {k: v for k, v in obj.items() if k != path[0]}, True
    inner, gone = _without_path(obj[path[0]], path[1:])
    return ({**obj, path[0]: inner}, True) if gone else (obj, False)


def strip_client_scheduler_fields(body: dict) -> dict | None:
    """``body`` without every :data:`CLIENT_SCHEDULER_PATHS` field a client set (top level and
    inside ``extra_body``), or None when it set none. The input is not modified."""
    out, any_gone = body, False
    for path in CLIENT_SCHEDULER_PATHS:
        for full in (path, ("extra_body", *path)):
            out, gone = _without_path(out, full)
            any_gone = any_gone or gone
    return out if any_gone else None


@dataclass(frozen=True)
class UpstreamSpec:
    """One ``--upstream URL[,dialect=NAME][,priority=high_first|low_first][,pool=MODEL]`` value.

    ``pool`` names the model the upstream serves (multi-model workflows): requests whose
    ``model`` field names it go only to that pool's upstreams (``policies.pools``)."""

    url: str
    dialect: str | None = None
    priority_order: str | None = None
    pool: str | None = None


def parse_upstreams(values: list[str]) -> list[UpstreamSpec]:
    """All ``--upstream`` values: each may hold several URLs separated by commas or spaces, each
    URL followed by its own ``key=value`` options (``http://a:1,dialect=vllm,http://b:2``)."""
    groups: list[list[str]] = []
    for value in values:
        for token in value.replace(" ", ",").split(","):
            token = token.strip()
            if not token:
                continue
            if "=" in token and "://" not in token:
                if not groups:
                    raise ValueError(f"--upstream {value!r}: option {token!r} before any URL")
                groups[-1].append(token)
            else:
                groups.append([token])
    return [parse_upstream(",".join(g)) for g in groups]


def parse_upstream(value: str) -> UpstreamSpec:
    """Parse ``URL[,dialect=vllm][,priority=low_first][,pool=MODEL]`` (one-line error on a bad
    option)."""
    url, *opts = [p.strip() for p in value.split(",")]
    dialect = order = pool = None
    for opt in opts:
        key, sep, val = opt.partition("=")
        if not sep:
            raise ValueError(f"--upstream {value!r}: option {opt!r} is not key=value")
        if key == "dialect":
            if val not in DIALECTS:
                raise ValueError(f"--upstream {value!r}: dialect {val!r}: expected one of "
                                 f"{', '.join(DIALECTS)}")
            dialect = val
        elif key == "priority":
            if val not in ("high_first", "low_first"):
                raise ValueError(f"--upstream {value!r}: priority {val!r}: expected high_first "
                                 "or low_first")
            order = val
        elif key == "pool":
            if not val:
                raise ValueError(f"--upstream {value!r}: pool= needs the model name the upstream serves")
            pool = val
        else:
            raise ValueError(f"--upstream {value!r}: unknown option {key!r} (dialect, priority, pool)")
    return UpstreamSpec(url, dialect, order, pool)
