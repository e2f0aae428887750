"""SQL that turns raw log text into typed call rows or quarantine reasons.

Every record, whatever file format it came from, is first staged as one JSON text per line
(``staging(file, line, text)``). This module builds the single set-based query that

1. parses the text (``json_valid``),
2. maps both record shapes of the log contract onto the same fields
   (flat record, §1; gateway record with ``request``/``response``, §2),
3. checks every field (missing, wrong type, impossible value) and names the *first* problem,
4. yields typed columns for the valid rows.

The field table :data:`FIELDS` is the single source of truth for where each field lives in each
shape and what makes it valid.
"""
from __future__ import annotations

from dataclasses import dataclass

#: Top-level keys of a flat record that the contract defines (anything else goes to ``extra``).
FLAT_KEYS = (
    "request_id", "workflow_type_id", "workflow_id", "agent_id", "t_arrival", "t_finish",
    "input_tokens", "output_tokens", "model", "t_first_token", "cached_tokens",
    "parent_request_ids", "tool_calls", "messages", "response_text", "status",
)
#: Top-level keys of a gateway record that the contract defines.
GATEWAY_KEYS = ("request_id", "t_arrival", "t_first_token", "t_finish", "request", "response",
                "status", "tool_calls")

_META = ("coalesce(j->'$.request.extra_body.app_metadata', j->'$.request.app_metadata', "
         "j->'$.app_metadata')")


@dataclass(frozen=True)
class Field:
    """One contract field: where it lives (flat, gateway) and its kind.

    kind: ``id`` (non-empty string or integer), ``time`` (number, epoch s), ``count`` (integer >= 0),
    ``text`` (string), ``str_list`` (array of strings), ``tool_list`` (array of objects with a
    string ``name``), ``json`` (any JSON value).
    """

    name: str
    flat: str
    gateway: str
    kind: str
    required: bool = False


FIELDS: tuple[Field, ...] = (
    Field("request_id", "j->'$.request_id'", "j->'$.request_id'", "id", True),
    Field("workflow_type_id", "j->'$.workflow_type_id'", f"{_META}->'$.workflow_type_id'", "id", True),
    Field("workflow_id", "j->'$.workflow_id'", f"{_META}->'$.workflow_id'", "id", True),
    Field("agent_id", "j->'$.agent_id'", f"{_META}->'$.agent_id'", "id", True),
    Field("t_arrival", "j->'$.t_arrival'", "j->'$.t_arrival'", "time", True),
    Field("t_finish", "j->'$.t_finish'", "j->'$.t_finish'", "time", True),
    Field("input_tokens", "j->'$.input_tokens'", "j->'$.response.usage.prompt_tokens'", "count", True),
    Field("output_tokens", "j->'$.output_tokens'", "j->'$.response.usage.completion_tokens'", "count", True),
    Field("t_first_token", "j->'$.t_first_token'", "j->'$.t_first_token'", "time"),
    Field("cached_tokens", "j->'$.cached_tokens'",
          "j->'$.response.usage.prompt_tokens_details.cached_tokens'", "count"),
    Field("model", "j->'$.model'", "coalesce(j->'$.request.model', j->'$.response.model')", "text"),
    Field("status", "j->'$.status'", "j->'$.status'", "text"),
    Field("parent_request_ids", "j->'$.parent_request_ids'",
          f"coalesce(j->'$.parent_request_ids', {_META}->'$.parent_request_ids')", "str_list"),
    Field("tool_calls", "j->'$.tool_calls'", "j->'$.tool_calls'", "tool_list"),
    Field("messages", "j->'$.messages'", "j->'$.request.messages'", "json"),
    Field("response_text", "j->'$.response_text'",
          "coalesce(j->'$.response.choices[0].message.content', j->'$.response.choices[0].text')",
          "text"),
)

_NUMERIC_TYPES = "('BIGINT', 'UBIGINT', 'DOUBLE')"


def _unwrap(col: str) -> str:
    """CSV cells hold nested values as JSON text: parse a string that is itself JSON."""
    return (f"CASE WHEN json_type({col}) = 'VARCHAR' AND json_valid({col}->>'$') "
            f"AND left(ltrim({col}->>'$'), 1) IN ('[', '{{') THEN ({col}->>'$')::JSON ELSE {col} END")


def _is_missing(col: str) -> str:
    return f"({col} IS NULL OR json_type({col}) = 'NULL' OR ({col}->>'$') = '')"


def _wrong_type(f: Field, col: str) -> str:
    """SQL condition: the present value has the wrong type for the field's kind."""
    num = f"(json_type({col}) IN {_NUMERIC_TYPES} OR (json_type({col}) = 'VARCHAR' AND TRY_CAST({col}->>'$' AS DOUBLE) IS NOT NULL))"
    if f.kind == "id":
        return f"json_type({col}) NOT IN ('VARCHAR', 'BIGINT', 'UBIGINT')"
    if f.kind == "time":
        return f"NOT {num} OR NOT isfinite(TRY_CAST({col}->>'$' AS DOUBLE))"
    if f.kind == "count":
        return f"NOT {num} OR TRY_CAST({col}->>'$' AS DOUBLE) <> round(TRY_CAST({col}->>'$' AS DOUBLE))"
    if f.kind == "text":
        return f"json_type({col}) <> 'VARCHAR'"
    if f.kind == "str_list":
        return (f"json_type({col}) <> 'ARRAY' OR list_bool_or(list_transform(json_extract({col}, '$[*]'), "
                f"lambda e: json_type(e) NOT IN ('VARCHAR', 'BIGINT', 'UBIGINT')))")
    if f.kind == "tool_list":
        return (f"json_type({col}) <> 'ARRAY' OR list_bool_or(list_transform(json_extract({col}, '$[*]'), "
                f"lambda e: json_type(e) <> 'OBJECT' OR json_type(e, '$.name') IS DISTINCT FROM 'VARCHAR' "
                f"OR (json_exists(e, '$.t_start') AND json_type(e, '$.t_start') NOT IN {_NUMERIC_TYPES}) "
                f"OR (json_exists(e, '$.t_end') AND json_type(e, '$.t_end') NOT IN {_NUMERIC_TYPES})))")
    return "false"


_KIND_DESC = {
    "id": "a string", "time": "a number (epoch seconds)", "count": "a non-negative integer",
    "text": "a string", "str_list": "a list of strings",
    "tool_list": 'a list of {"name": str, "t_start": float, "t_end": float} objects', "json": "JSON",
}


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def checks() -> list[tuple[str, str, str]]:
    """Ordered ``(condition, field, reason_sql)``; the first true condition names the problem."""
    out: list[tuple[str, str, str]] = [
        ("NOT is_json", "NULL", "'invalid JSON'"),
        ("json_type(j) <> 'OBJECT'", "NULL", "'record is not a JSON object but ' || json_type(j)"),
    ]
    for f in FIELDS:
        col = f"v_{f.name}"
        if f.required:
            where = "in the record" if f.flat == f.gateway else "(flat: top level; gateway: see log-format §2)"
            out.append((_is_missing(col), _sql_str(f.name),
                        _sql_str(f"missing required field '{f.name}' {where}")))
        if f.kind != "json":
            out.append((f"NOT {_is_missing(col)} AND ({_wrong_type(f, col)})", _sql_str(f.name),
                        f"'wrong type for ' || {_sql_str(f.name)} || ': expected {_KIND_DESC[f.kind]}, got ' "
                        f"|| json_type({col}) || ' ' || left({col}::VARCHAR, 60)"))
    for name in ("input_tokens", "output_tokens", "cached_tokens"):
        out.append((f"TRY_CAST(v_{name}->>'$' AS DOUBLE) < 0", _sql_str(name),
                    f"'negative tokens: {name} = ' || (v_{name}->>'$')"))
    out.append(("TRY_CAST(v_t_finish->>'$' AS DOUBLE) < TRY_CAST(v_t_arrival->>'$' AS DOUBLE)",
                "'t_finish'",
                "'t_finish < t_arrival (' || (v_t_finish->>'$') || ' < ' || (v_t_arrival->>'$') || ')'"))
    out.append(("NOT v_status_ok", "'status'", "'status must be ok or error, got ' || (v_status->>'$')"))
    return out


def parse_sql(staging: str = "staging") -> str:
    """The query over ``staging(file, line, text)`` producing one row per non-blank record.

    Output columns: file, line, text, reason (NULL when valid), field, and the typed contract
    columns of :data:`profiler.store.BASE_CALL_COLUMNS` (meaningful only when reason IS NULL).
    """
    picks = ",\n      ".join(
        f"CASE WHEN is_gateway THEN {_unwrap(f.gateway) if f.kind in ('str_list', 'tool_list', 'json') else f.gateway} "
        f"ELSE {_unwrap(f.flat) if f.kind in ('str_list', 'tool_list', 'json') else f.flat} END AS v_{f.name}"
        for f in FIELDS
    )
    case = "CASE " + " ".join(f"WHEN {c} THEN {r}" for c, _, r in checks()) + " END"
    field_case = "CASE " + " ".join(f"WHEN {c} THEN {fld}" for c, fld, _ in checks()) + " END"
    flat_keys = ", ".join(_sql_str(k) for k in FLAT_KEYS)
    gw_keys = ", ".join(_sql_str(k) for k in GATEWAY_KEYS)
    return f"""
WITH s AS (
  SELECT file, line, text, json_valid(text) AS is_json
  FROM {staging} WHERE text IS NOT NULL AND trim(text) <> ''
), p AS (
  SELECT *, CASE WHEN is_json THEN text::JSON END AS j FROM s
), g AS (
  SELECT *, coalesce(json_type(j) = 'OBJECT' AND json_exists(j, '$.request'), false) AS is_gateway FROM p
), v AS (
  SELECT file, line, text, is_json, is_gateway, j,
      {picks}
  FROM g
), c AS (
  SELECT *, (v_status IS NULL OR json_type(v_status) = 'NULL' OR lower(v_status->>'$') IN ('ok', 'error')) AS v_status_ok
  FROM v
), r AS (
  SELECT *, {case} AS reason, {field_case} AS field,
    CASE WHEN json_type(j) = 'OBJECT' THEN list_filter(json_keys(j), lambda k: k NOT IN ({flat_keys})
      AND (NOT is_gateway OR k NOT IN ({gw_keys}))) ELSE [] END AS extra_keys
  FROM c
)
SELECT file, line, text, reason, field,
  v_request_id->>'$' AS request_id,
  v_workflow_type_id->>'$' AS workflow_type_id,
  v_workflow_id->>'$' AS workflow_id,
  v_agent_id->>'$' AS agent_id,
  v_model->>'$' AS model,
  TRY_CAST(v_t_arrival->>'$' AS DOUBLE) AS t_arrival,
  TRY_CAST(v_t_first_token->>'$' AS DOUBLE) AS t_first_token,
  TRY_CAST(v_t_finish->>'$' AS DOUBLE) AS t_finish,
  TRY_CAST(TRY_CAST(v_input_tokens->>'$' AS DOUBLE) AS BIGINT) AS input_tokens,
  TRY_CAST(TRY_CAST(v_output_tokens->>'$' AS DOUBLE) AS BIGINT) AS output_tokens,
  TRY_CAST(TRY_CAST(v_cached_tokens->>'$' AS DOUBLE) AS BIGINT) AS cached_tokens,
  coalesce(lower(v_status->>'$'), 'ok') AS status,
  CASE WHEN json_type(v_parent_request_ids) = 'ARRAY' THEN json_extract_string(v_parent_request_ids, '$[*]') END AS parent_request_ids,
  CASE WHEN json_type(v_tool_calls) = 'ARRAY' AND json_array_length(v_tool_calls) > 0 THEN v_tool_calls END AS tool_calls,
  coalesce(
    CASE WHEN json_type(v_tool_calls) = 'ARRAY' THEN json_extract_string(v_tool_calls, '$[*].name') END,
    CASE WHEN is_gateway THEN json_extract_string(j, '$.response.choices[0].message.tool_calls[*].function.name') END,
    []::VARCHAR[]) AS tool_names,
  CASE WHEN json_type(v_messages) NOT IN ('NULL') THEN v_messages END AS messages,
  v_response_text->>'$' AS response_text,
  CASE WHEN len(extra_keys) > 0 THEN to_json(map_from_entries(list_transform(extra_keys,
      lambda k: struct_pack(k := k, v := json_extract(j, '$."' || replace(k, '"', '\\"') || '"')))))
  END AS extra,
  CASE WHEN is_gateway THEN 'gateway' ELSE 'flat' END AS record_shape,
  md5(concat_ws('|', v_workflow_type_id->>'$', v_workflow_id->>'$', v_agent_id->>'$',
      TRY_CAST(v_t_arrival->>'$' AS DOUBLE), TRY_CAST(v_t_finish->>'$' AS DOUBLE),
      v_input_tokens->>'$', v_output_tokens->>'$')) AS content_hash
FROM r
"""
