"""SQL that turns raw log text into typed call rows or quarantine reasons.

Every record, whatever file format it came from, is first staged as one JSON text per line
(``staging(file, line, text)``). This module builds the single set-based query that

1. parses each text **once** (twice for gateway records): ``json_transform`` into a struct
   holding every field of the record's shape as its raw JSON text; presence, type and value are
   then checked and converted with cheap string operations and casts;
2. maps both record shapes of the log contract onto the same fields (flat record, §1; gateway
   record with ``request``/``response``, §2);
3. checks every field (missing, wrong type, impossible value) and names the *first* problem;
4. yields typed columns for the valid rows.

Numbers must be finite; token counts lie in 0 … :data:`MAX_TOKENS`, times in
:data:`MIN_EPOCH_S` … :data:`MAX_EPOCH_S`. Keys outside the contract are kept in ``extra``
whatever their spelling (read by JSON Pointer, RFC 6901: ``~`` → ``~0``, ``/`` → ``~1``; no
JSONPath quoting to get wrong for keys like ``""`` or ``a\"b``).

:data:`FIELDS` is the single source of truth for where each field lives in each shape and what
makes it valid. (Parsing once matters: per-value JSON functions cost ~1 µs each, i.e. a second
per million records per function call.)
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from store.derive import TOOL_LIST_TYPE
from store.duckdb_store import sql_string

#: Top-level keys of a flat record that the contract defines (anything else goes to ``extra``).
FLAT_KEYS = (
    "request_id", "workflow_type_id", "workflow_id", "agent_id", "t_arrival", "t_finish",
    "input_tokens", "output_tokens", "model", "t_first_token", "cached_tokens",
    "parent_request_ids", "tool_calls", "messages", "response_text", "status",
)
#: Top-level keys of a gateway record that the contract defines.
GATEWAY_KEYS = ("request_id", "t_arrival", "t_first_token", "t_finish", "request", "response",
                "status", "tool_calls", "app_metadata")

#: Ceiling of every token count (input, output, cached): a record above it is quarantined.
#: 10^9 tokens is ~1,000 times the longest context any model serves; a larger value is a logging
#: bug (and one >= 2^63 cannot even be stored as BIGINT).
MAX_TOKENS = 10**9
#: Range of every time (t_arrival, t_first_token, t_finish, tool t_start/t_end), epoch seconds:
#: 0 … 10^10 (year 2286). Milliseconds (1.7e12 today) fall outside and are quarantined.
MIN_EPOCH_S, MAX_EPOCH_S = 0.0, 1e10
#: Longest plausible call (t_finish − t_arrival), seconds: one day. Longer is not a measurement
#: but two clocks or units mixed (issue 35: t_arrival 12 and t_finish now, a 56-year call, was
#: accepted); the real sets' longest call is 108 s.
MAX_CALL_S = 86_400.0

_KIND_DESC = {
    "id": "a string", "time": "a number (epoch seconds)", "count": "a non-negative integer",
    "text": "a string", "str_list": "a list of strings",
    "tool_list": 'a list of {"name": str, "t_start": float, "t_end": float} objects', "json": "JSON",
}


@dataclass(frozen=True)
class Field:
    """One contract field: its JSON paths in the flat and gateway shapes, and its kind.

    kind: ``id`` (non-empty string or number), ``time`` (number, epoch s), ``count`` (integer ≥ 0),
    ``text`` (string), ``str_list`` (array of strings), ``tool_list`` (array of objects with a
    string ``name``), ``json`` (any JSON value). Gateway paths are tried in order.
    """

    name: str
    flat: tuple[str, ...]
    gateway: tuple[str, ...]
    kind: str
    required: bool = False


_META = (("request", "extra_body", "app_metadata"), ("request", "app_metadata"), ("app_metadata",))


def _meta(key: str) -> tuple[tuple[str, ...], ...]:
    return tuple(m + (key,) for m in _META)


FIELDS: tuple[Field, ...] = (
    Field("request_id", (("request_id",),), (("request_id",),), "id", True),
    Field("workflow_type_id", (("workflow_type_id",),), _meta("workflow_type_id"), "id", True),
    Field("workflow_id", (("workflow_id",),), _meta("workflow_id"), "id", True),
    Field("agent_id", (("agent_id",),), _meta("agent_id"), "id", True),
    Field("t_arrival", (("t_arrival",),), (("t_arrival",),), "time", True),
    Field("t_finish", (("t_finish",),), (("t_finish",),), "time", True),
    Field("input_tokens", (("input_tokens",),), (("response", "usage", "prompt_tokens"),), "count", True),
    Field("output_tokens", (("output_tokens",),), (("response", "usage", "completion_tokens"),), "count", True),
    Field("t_first_token", (("t_first_token",),), (("t_first_token",),), "time"),
    Field("cached_tokens", (("cached_tokens",),),
          (("response", "usage", "prompt_tokens_details", "cached_tokens"),), "count"),
    Field("model", (("model",),), (("request", "model"), ("response", "model")), "text"),
    Field("status", (("status",),), (("status",),), "text"),
    Field("parent_request_ids", (("parent_request_ids",),),
          (("parent_request_ids",),) + _meta("parent_request_ids"), "str_list"),
    Field("tool_calls", (("tool_calls",),), (("tool_calls",),), "tool_list"),
    Field("messages", (("messages",),), (("request", "messages"),), "json"),
    Field("response_text", (("response_text",),),
          (("response", "choices", "[0]", "message", "content"), ("response", "choices", "[0]", "text")),
          "text"),
)
#: SQL: the staged ``text`` is a record, not a blank line (the cheap first-character test
#: settles almost every line without trimming).
NON_BLANK = "text IS NOT NULL AND (left(text, 1) NOT IN (' ', '\t', '\r', '') OR trim(text) <> '')"


def json_paths(name: str) -> list[str]:
    """JSONPaths where field ``name`` may sit in a record: its flat path, then its gateway
    paths in the order they are tried."""
    f = next(f for f in FIELDS if f.name == name)
    return ["$" + "".join("[0]" if key == "[0]" else f".{key}" for key in path)
            for path in f.flat + f.gateway]


#: Extra gateway paths read for derived columns.
GATEWAY_TOOL_NAMES = ("response", "choices", "[0]", "message", "tool_calls")
#: Where a gateway record's ``app_metadata.stage`` may sit: kept in ``extra`` as ``stage``, as
#: the flat record's optional ``stage`` is (the client's step label: docs/log-format.md).
GATEWAY_STAGE = _meta("stage")


def _structure(shape: str) -> dict:
    """The json_transform structure holding every path of one record shape ("flat" or
    "gateway"), each leaf as raw JSON text. The flat structure also reads ``request`` (whose
    presence marks a gateway record); the larger gateway one is only parsed for those."""
    root: dict = {"request": "JSON"} if shape == "flat" else {}
    paths = [(f, p) for f in FIELDS for p in (f.flat if shape == "flat" else f.gateway)]
    if shape == "gateway":
        paths.append((Field("_tools", (), (), "json"), GATEWAY_TOOL_NAMES))
        paths.extend((Field("_stage", (), (), "json"), p) for p in GATEWAY_STAGE)
    for f, path in paths:
        node = root
        for i, key in enumerate(path):
            last = i == len(path) - 1
            if key == "[0]":
                continue
            nxt_is_list = i + 1 < len(path) and path[i + 1] == "[0]"
            if last:
                node.setdefault(key, "JSON")
            else:
                child = node.setdefault(key, [{}] if nxt_is_list else {})
                node = child[0] if isinstance(child, list) else child
    return root


def _access(struct: str, path: tuple[str, ...]) -> str:
    expr = struct
    for key in path:
        expr += "[1]" if key == "[0]" else f'."{key}"'
    return expr


def _pick(f: Field) -> str:
    """SQL picking the field's raw JSON from the flat (``fs``) or gateway (``gs``) struct."""
    def first(struct: str, paths: tuple[tuple[str, ...], ...]) -> str:
        exprs = [_access(struct, p) for p in paths]
        return exprs[0] if len(exprs) == 1 else f"coalesce({', '.join(exprs)})"
    return f"CASE WHEN is_gateway THEN {first('gs', f.gateway)} ELSE {first('fs', f.flat)} END"


def _typed(f: Field) -> str:
    """SQL converting the raw JSON text ``r_<name>`` to the field's type with string operations
    (no second JSON parse): strings are unquoted (unescaped by the JSON parser only when they
    contain a backslash), numbers cast, numeric strings accepted ("12" → 12.0)."""
    r = f"r_{f.name}"
    unquoted = f"CASE WHEN contains({r}, '\\') THEN {r}::JSON->>'$' ELSE {r}[2:-2] END"
    if f.kind in ("id", "text"):
        return (f"CASE WHEN left({r}, 1) = '\"' THEN {unquoted} "
                f"WHEN TRY_CAST({r} AS DOUBLE) IS NOT NULL THEN {r} END")
    if f.kind in ("time", "count"):
        return f"coalesce(TRY_CAST({r} AS DOUBLE), CASE WHEN left({r}, 1) = '\"' THEN TRY_CAST({r}[2:-2] AS DOUBLE) END)"
    return r


def _missing(name: str) -> str:
    return f"(r_{name} IS NULL OR r_{name} = '\"\"')"


def _wrong_type(f: Field) -> str:
    """SQL: the present value has the wrong type for the field's kind (raw text r_, typed t_)."""
    r, t = f"r_{f.name}", f"t_{f.name}"
    if f.kind == "id":
        return f"left({r}, 1) IN ('{{', '[', 't', 'f')"
    if f.kind == "time":
        return f"{t} IS NULL OR {r} IN ('true', 'false')"
    if f.kind == "count":
        return f"{t} IS NULL OR {r} IN ('true', 'false') OR (isfinite({t}) AND {t} <> round({t}))"
    if f.kind == "text":
        return f"left({r}, 1) <> '\"'"
    if f.kind == "str_list":
        return (f"left(u_{f.name}, 1) <> '[' OR list_bool_or(list_transform(parents, "
                f"lambda e: left(e, 1) IN ('{{', '[')))")
    if f.kind == "tool_list":
        return (f"left(u_{f.name}, 1) <> '[' OR tools IS NULL OR list_bool_or(list_transform(tools, "
                f"lambda e: e IS NULL OR e.name IS NULL))")
    return "false"


def checks() -> list[tuple[str, str, str]]:
    """Ordered ``(condition, field, reason_sql)``; the first true condition names the problem."""
    out: list[tuple[str, str, str]] = [
        ("NOT is_json", "NULL", "'invalid JSON'"),
        ("NOT is_object", "NULL", "'record is not a JSON object'"),
    ]
    for f in FIELDS:
        if f.required:
            where = "" if f.flat == f.gateway else " (flat: top level; gateway: see log-format §2)"
            out.append((_missing(f.name), sql_string(f.name),
                        sql_string(f"missing required field '{f.name}'{where}")))
        if f.kind != "json":
            out.append((f"NOT {_missing(f.name)} AND ({_wrong_type(f)})", sql_string(f.name),
                        f"'wrong type for {f.name}: expected {_KIND_DESC[f.kind]}, got ' || left(r_{f.name}, 60)"))
    for f in FIELDS:
        if f.kind in ("time", "count"):
            out.append((f"NOT isfinite(t_{f.name})", sql_string(f.name),
                        f"'not a finite number: {f.name} = ' || left(r_{f.name}, 60)"))
    for name in ("input_tokens", "output_tokens", "cached_tokens"):
        out.append((f"t_{name} < 0", sql_string(name), f"'negative tokens: {name} = ' || r_{name}"))
        out.append((f"t_{name} > {MAX_TOKENS}", sql_string(name),
                    f"'out of range: {name} = ' || left(r_{name}, 60) || ' (ceiling {MAX_TOKENS:,} tokens)'"))
    for f in FIELDS:
        if f.kind == "time":
            out.append((f"t_{f.name} < {MIN_EPOCH_S} OR t_{f.name} > {MAX_EPOCH_S}", sql_string(f.name),
                        f"'out of range: {f.name} = ' || left(r_{f.name}, 60) || "
                        f"' (epoch seconds {MIN_EPOCH_S:g} to {MAX_EPOCH_S:g}; milliseconds?)'"))
    out.append((f"list_bool_or(list_transform(tools, lambda e: NOT (coalesce(isfinite(e.t_start), true) "
                f"AND coalesce(isfinite(e.t_end), true)) OR e.t_start < {MIN_EPOCH_S} OR e.t_start > {MAX_EPOCH_S} "
                f"OR e.t_end < {MIN_EPOCH_S} OR e.t_end > {MAX_EPOCH_S}))", "'tool_calls'",
                f"'out of range: a tool t_start/t_end is not a finite time in epoch seconds "
                f"{MIN_EPOCH_S:g} to {MAX_EPOCH_S:g}'"))
    out.append(("t_t_finish < t_t_arrival", "'t_finish'",
                "'t_finish < t_arrival (' || r_t_finish || ' < ' || r_t_arrival || ')'"))
    out.append((f"t_t_finish - t_t_arrival > {MAX_CALL_S}", "'t_finish'",
                "'implausible duration: t_finish - t_arrival = ' || printf('%.4g', t_t_finish - t_t_arrival) || "
                f"' s (' || r_t_finish || ' - ' || r_t_arrival || '; ceiling {MAX_CALL_S:,.0f} s: two clocks or "
                "units mixed?)'"))
    # a tool that ended before it started was stored at a negative latency and silently left out
    # of the tool fits (issue 35): the record says which tool
    bad_tool = "list_filter(tools, lambda e: e.t_end < e.t_start)[1]"
    out.append(("list_bool_or(list_transform(tools, lambda e: e.t_end < e.t_start))", "'tool_calls'",
                f"'tool ' || coalesce({bad_tool}.name, '?') || ': t_end < t_start (' || {bad_tool}.t_end || "
                f"' < ' || {bad_tool}.t_start || ')'"))
    # issue 24: a first token before the call arrived (TTFT -1.76e9 s when t_first_token was 0
    # or in another clock) or after it finished, and more cached than prompt tokens, are not
    # measurements: they were accepted and skewed every timing and cache statistic
    out.append(("t_t_first_token < t_t_arrival", "'t_first_token'",
                "'t_first_token < t_arrival (' || r_t_first_token || ' < ' || r_t_arrival || ')'"))
    out.append(("t_t_first_token > t_t_finish", "'t_first_token'",
                "'t_first_token > t_finish (' || r_t_first_token || ' > ' || r_t_finish || ')'"))
    out.append(("t_cached_tokens > t_input_tokens", "'cached_tokens'",
                "'cached_tokens > input_tokens (' || r_cached_tokens || ' > ' || r_input_tokens || ')'"))
    out.append(("t_status IS NOT NULL AND lower(t_status) NOT IN ('ok', 'error')", "'status'",
                "'status must be ok or error, got ' || r_status"))
    return out


def parse_sql(staging: str = "staging") -> str:
    """The query over ``staging(file, line, text)`` producing one row per non-blank record.

    Output columns: file, line, reason (NULL when valid), field, raw (the text of invalid
    records, first 2000 characters), and the typed contract
    columns of :data:`store.duckdb_store.BASE_CALL_COLUMNS` (meaningful only when reason IS NULL).
    """
    flat_spec = sql_string(json.dumps(_structure("flat")))
    gateway_spec = sql_string(json.dumps(_structure("gateway")))
    picks = ",\n    ".join(f"({_pick(f)})::VARCHAR AS r_{f.name}" for f in FIELDS)
    typed = ",\n    ".join(f"{_typed(f)} AS t_{f.name}" for f in FIELDS)
    # CSV cells carry nested values as JSON text inside a string: unwrap those.
    unwrap = ",\n    ".join(
        f"CASE WHEN left(r_{f.name}, 1) = '\"' AND left(r_{f.name}::JSON->>'$', 1) IN ('[', '{{') "
        f"AND json_valid(r_{f.name}::JSON->>'$') THEN r_{f.name}::JSON->>'$' ELSE r_{f.name} END AS u_{f.name}"
        for f in FIELDS if f.kind in ("str_list", "tool_list", "json"))
    # The checks are evaluated once, into the number of the first that fails (``problem``); the
    # reason and the field are looked up by that number (two CASEs over the conditions
    # evaluated them twice: ~0.5 s of CPU per million records).
    numbered = list(enumerate(checks(), start=1))
    problem = "CASE " + " ".join(f"WHEN {c} THEN {i}" for i, (c, _, _) in numbered) + " END"
    reason = "CASE problem " + " ".join(f"WHEN {i} THEN {r}" for i, (_, _, r) in numbered) + " END"
    field = "CASE problem " + " ".join(f"WHEN {i} THEN {fld}" for i, (_, fld, _) in numbered) + " END"
    known = ", ".join(sql_string(k) for k in sorted(set(FLAT_KEYS)))
    gw_known = ", ".join(sql_string(k) for k in sorted(set(GATEWAY_KEYS)))
    tool_names_gw = f"({_access('gs', GATEWAY_TOOL_NAMES)})::VARCHAR"
    stage_raw = f"(coalesce({', '.join(_access('gs', p) for p in GATEWAY_STAGE)}))::VARCHAR"
    stage_gw = (f"CASE WHEN is_gateway AND left({stage_raw}, 1) = '\"' "
                f"AND {stage_raw} <> '\"\"' THEN {stage_raw}::JSON->>'$' END")
    return f"""
WITH p AS (
  SELECT file, line, text,
    CASE WHEN left(ltrim(text), 1) = '{{' THEN try(json_transform(text, {flat_spec})) END AS fs
  FROM {staging}
  WHERE {NON_BLANK}
), g AS (
  SELECT *,
    fs IS NOT NULL AS is_object,
    -- a CASE, not OR: json_valid parses the whole text again, and only the few records that
    -- are not JSON objects need it (as an OR it cost ~0.3 s of CPU per million records)
    CASE WHEN fs IS NOT NULL THEN true ELSE json_valid(text) END AS is_json,
    coalesce(fs.request IS NOT NULL, false) AS is_gateway
  FROM p
), v AS (
  SELECT file, line, text, is_json, is_object, is_gateway, fs,
    CASE WHEN is_gateway THEN json_transform(text, {gateway_spec}) END AS gs,
  FROM g
), vv AS (
  SELECT file, line, text, is_json, is_object, is_gateway, gs,
    {picks}
  FROM v
), t AS (
  SELECT *,
    {typed}
  FROM vv
), u AS (
  SELECT *,
    {unwrap}
  FROM t
), w AS (
  SELECT *,
    CASE WHEN left(u_parent_request_ids, 1) = '[' THEN json_extract_string(u_parent_request_ids, '$[*]') END AS parents,
    CASE WHEN left(u_tool_calls, 1) = '[' THEN json_transform(u_tool_calls, {sql_string(TOOL_LIST_TYPE)}) END AS tools
  FROM u
), q AS (
  SELECT *, {problem} AS problem,
    CASE WHEN is_object THEN list_filter(json_keys(text), lambda k: k NOT IN ({known})
      AND (NOT is_gateway OR k NOT IN ({gw_known}))) END AS extra_keys
  FROM w
), r AS (
  SELECT *, {reason} AS reason, {field} AS field,
    CASE WHEN len(extra_keys) > 0 THEN to_json(map_from_entries(list_zip(extra_keys,
        list_transform(extra_keys, lambda k: json_extract(text,
          '/' || replace(replace(k, '~', '~0'), '/', '~1'))))))
    END AS extra_flat
  FROM q
)
SELECT file, line, reason, field,
  CASE WHEN reason IS NOT NULL THEN left(text, 2000) END AS raw,
  t_request_id AS request_id,
  t_workflow_type_id AS workflow_type_id,
  t_workflow_id AS workflow_id,
  t_agent_id AS agent_id,
  t_model AS model,
  t_t_arrival AS t_arrival,
  t_t_first_token AS t_first_token,
  t_t_finish AS t_finish,
  TRY_CAST(t_input_tokens AS BIGINT) AS input_tokens,
  TRY_CAST(t_output_tokens AS BIGINT) AS output_tokens,
  TRY_CAST(t_cached_tokens AS BIGINT) AS cached_tokens,
  coalesce(lower(t_status), 'ok') AS status,
  parents AS parent_request_ids,
  tools AS tool_list,
  CASE WHEN len(tools) > 0 THEN u_tool_calls::JSON END AS tool_calls,
  coalesce(
    list_transform(tools, lambda e: e.name),
    CASE WHEN is_gateway THEN json_extract_string({tool_names_gw}, '$[*].function.name') END,
    []::VARCHAR[]) AS tool_names,
  u_messages::JSON AS messages,
  t_response_text AS response_text,
  CASE WHEN {stage_gw} IS NOT NULL
       THEN json_merge_patch(coalesce(extra_flat, '{{}}'), json_object('stage', {stage_gw}))
       ELSE extra_flat END AS extra,
  CASE WHEN is_gateway THEN 'gateway' ELSE 'flat' END AS record_shape,
  md5(concat_ws('|', t_workflow_type_id, t_workflow_id, t_agent_id, t_t_arrival, t_t_finish,
      t_input_tokens, t_output_tokens)) AS content_hash
FROM r
"""
