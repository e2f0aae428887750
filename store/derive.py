"""Per-workflow derived columns of ``calls`` and the ``tool_calls`` table.

New calls are stored together with their derived columns. When a batch adds calls to a workflow
already in the store (a later log file continues a session), that workflow's stored calls are
taken out and re-inserted with the batch, so positions and neighbours are recomputed over the
whole workflow. The caller runs this inside its transaction (:func:`store.ingest.ingest`
opens one per batch): the delete and the re-insert commit together or not at all. Everything is window functions and ASOF joins:

* position: ``call_index = row_number() over (workflow order by t_arrival, request_id) - 1``;
* neighbours: ``lag``/``lead`` over the same window;
* the gap after a call: ``gap_after_s = t_arrival(next call with t_arrival >= t_finish) - t_finish``
  (an ASOF join), the time the program spent in tools (or thinking) before calling again; a call
  logged with one time (``t_finish = t_arrival``) takes the next call in the workflow's order,
  never itself;
* tool latency: explicit ``tool_calls`` timings when logged; otherwise the gap to the next call of
  the same workflow *and agent* (log-format §2), split evenly over the tools the response named.
"""
from __future__ import annotations

import duckdb

from store.duckdb_store import BASE_CALL_COLUMNS, DERIVED_CALL_COLUMNS, execute, sql_columns

_BASE = sql_columns(BASE_CALL_COLUMNS)
#: Typed shape of one explicit tool execution (the JSON ``tool_calls`` column parsed).
TOOL_LIST_TYPE = '[{"name": "VARCHAR", "t_start": "DOUBLE", "t_end": "DOUBLE", "status": "VARCHAR"}]'


def insert_calls(con: duckdb.DuckDBPyConnection, new_rows_sql: str, has_tool_list: bool = False,
                 materialize: bool = True) -> None:
    """Insert the calls selected by ``new_rows_sql`` (the base columns of ``calls``) with derived
    columns, and recompute derived columns and tool rows of every workflow they touch.

    ``has_tool_list``: the query also yields ``tool_list``, the ``tool_calls`` JSON already
    parsed to :data:`TOOL_LIST_TYPE` (the ingester has it; saves parsing it again).
    ``materialize=False``: the rows are read through a view of ``new_rows_sql`` instead of being
    copied into a temp table first — for a query that is cheap to run several times (the
    ingester's: its parsed rows less the few judged duplicates). Each step reads only the
    columns it needs, and the wide rows (texts, lists) are copied once, into ``calls``.

    The rows the steps below read are the view ``new_calls``: the batch's calls, and when the
    batch continues workflows already stored, those workflows' stored calls (copied out to the
    temp table ``continued`` before they are deleted)."""
    tool_list = "tool_list" if has_tool_list else f"json_transform(tool_calls, '{TOOL_LIST_TYPE}') AS tool_list"
    batch = f"SELECT {_BASE}, {tool_list} FROM ({new_rows_sql})"
    if materialize:
        execute(con, f"CREATE OR REPLACE TEMP TABLE batch_calls AS {batch}")
        batch = "SELECT * FROM batch_calls"
    execute(con, f"CREATE OR REPLACE TEMP VIEW new_calls AS {batch}")
    execute(con, "CREATE OR REPLACE TEMP TABLE touched AS "
                "SELECT DISTINCT workflow_type_id, workflow_id FROM new_calls")
    stored = execute(con, "SELECT count(*) FROM calls SEMI JOIN touched USING (workflow_type_id, workflow_id)"
                         ).fetchone()[0]
    if stored:  # continue old workflows: take their calls out, recompute them with the new ones
        execute(con, f"CREATE OR REPLACE TEMP TABLE continued AS SELECT {_BASE}, "
                    f"json_transform(tool_calls, '{TOOL_LIST_TYPE}') AS tool_list "
                    f"FROM calls SEMI JOIN touched USING (workflow_type_id, workflow_id)")
        execute(con, f"CREATE OR REPLACE TEMP VIEW new_calls AS {batch} UNION ALL SELECT * FROM continued")
        execute(con, "DELETE FROM calls t USING touched u "
                    "WHERE t.workflow_type_id = u.workflow_type_id AND t.workflow_id = u.workflow_id")
        execute(con, "DELETE FROM tool_calls t USING touched u "
                    "WHERE t.workflow_type_id = u.workflow_type_id AND t.workflow_id = u.workflow_id")
    derived = sql_columns(DERIVED_CALL_COLUMNS)
    # Windows over a narrow projection (sorting the wide rows with prompts would cost more),
    # joined back to the full rows on insert.
    execute(con, """
        CREATE OR REPLACE TEMP TABLE derived AS
        WITH o AS (
          SELECT request_id, workflow_type_id, workflow_id, t_arrival, t_finish,
            lead(t_arrival) OVER wf AS next_arrival,
            t_finish - t_arrival AS latency_s,
            t_first_token - t_arrival AS ttft_s,
            (row_number() OVER wf - 1)::INTEGER AS call_index,
            (count(*) OVER (PARTITION BY workflow_type_id, workflow_id))::INTEGER AS workflow_calls,
            (row_number() OVER wa - 1)::INTEGER AS agent_call_index,
            lag(output_tokens) OVER wa AS prev_agent_output_tokens,
            lag(request_id) OVER wf AS prev_request_id,
            lead(request_id) OVER wf AS next_request_id,
            lag(agent_id) OVER wf AS prev_agent_id,
            lead(agent_id) OVER wf AS next_agent_id
          FROM (SELECT request_id, workflow_type_id, workflow_id, agent_id, t_arrival,
                       t_first_token, t_finish, output_tokens FROM new_calls)
          WINDOW wf AS (PARTITION BY workflow_type_id, workflow_id ORDER BY t_arrival, request_id),
                 wa AS (PARTITION BY workflow_type_id, workflow_id, agent_id ORDER BY t_arrival, request_id)
        )
        SELECT o.* EXCLUDE (workflow_type_id, workflow_id, t_arrival, t_finish, next_arrival),
          -- a zero-latency call (t_finish = t_arrival: logs with one time per call) is its own
          -- ASOF match; its next call is simply the next one in the workflow's order
          CASE WHEN o.t_finish <= o.t_arrival THEN o.next_arrival ELSE n.t_arrival END - o.t_finish AS gap_after_s
        FROM o ASOF LEFT JOIN (SELECT workflow_type_id, workflow_id, t_arrival FROM new_calls) n
          ON o.workflow_type_id = n.workflow_type_id AND o.workflow_id = n.workflow_id
         AND n.t_arrival >= o.t_finish
    """)
    execute(con, f"INSERT INTO calls ({_BASE}, {derived}) "
                f"SELECT n.* EXCLUDE (tool_list), d.* EXCLUDE (request_id) FROM new_calls n JOIN derived d USING (request_id)")
    _insert_tool_calls(con)
    execute(con, "DROP VIEW new_calls")
    for t in ("touched", "derived", "batch_calls", "continued"):
        execute(con, f"DROP TABLE IF EXISTS {t}")


def _insert_tool_calls(con: duckdb.DuckDBPyConnection) -> None:
    """``tool_calls`` rows for the calls in ``new_calls``.

    A tool's time comes from the log when it has ``t_start`` and ``t_end``; otherwise from the gap
    to the next call of the same workflow and agent, split evenly over the call's ``n_untimed``
    tools. ``n_untimed`` is counted on the call's own list, and that gap (a window and an ASOF
    join) is computed only for the (workflow, agent) pairs that have an untimed tool: logs with
    every tool timed skip it (a million-call ingest: 3.0 s of CPU -> 0.65 s)."""
    execute(con, """
        INSERT INTO tool_calls
        WITH named AS (   -- calls whose response named tools
          SELECT request_id, workflow_type_id, workflow_id, agent_id, t_arrival, t_finish, tool_calls,
            tool_list, tool_names,
            CASE WHEN tool_calls IS NOT NULL
                 THEN len(list_filter(tool_list, lambda e: e.t_start IS NULL OR e.t_end IS NULL))
                 ELSE len(tool_names) END AS n_untimed
          FROM new_calls WHERE len(tool_names) > 0
        ),
        need AS (   -- calls with an untimed tool: the gap to the agent's next call times them
          SELECT request_id, workflow_type_id, workflow_id, agent_id, t_arrival, t_finish
          FROM named WHERE n_untimed > 0
        ),
        agent_rows AS (   -- every call of those (workflow, agent) pairs
          SELECT request_id, workflow_type_id, workflow_id, agent_id, t_arrival FROM new_calls
          SEMI JOIN need USING (workflow_type_id, workflow_id, agent_id)
        ),
        agent_next AS (
          SELECT request_id, lead(t_arrival) OVER (PARTITION BY workflow_type_id, workflow_id, agent_id
                                                   ORDER BY t_arrival, request_id) AS next_arrival
          FROM agent_rows
        ),
        agent_gap AS (   -- gap to the next call of the same workflow and agent
          SELECT c.request_id,
            CASE WHEN c.t_finish <= c.t_arrival THEN c.next_arrival ELSE n.t_arrival END AS next_same_agent_arrival
          FROM (need JOIN agent_next USING (request_id)) c
          ASOF LEFT JOIN agent_rows n
            ON c.workflow_type_id = n.workflow_type_id AND c.workflow_id = n.workflow_id
           AND c.agent_id = n.agent_id AND n.t_arrival >= c.t_finish
        ),
        explicit AS (
          SELECT request_id, workflow_type_id, workflow_id, agent_id, t_finish, n_untimed,
            unnest(tool_list) AS e, generate_subscripts(tool_list, 1) - 1 AS tool_index
          FROM named WHERE tool_calls IS NOT NULL
        ),
        items AS (
          SELECT request_id, workflow_type_id, workflow_id, agent_id, t_finish, n_untimed, tool_index,
            e.name AS tool_name, e.t_start, e.t_end, coalesce(e.status, 'ok') AS status
          FROM explicit
          UNION ALL   -- tool names from a gateway response, no timings
          SELECT request_id, workflow_type_id, workflow_id, agent_id, t_finish, n_untimed,
            generate_subscripts(tool_names, 1) - 1, unnest(tool_names), NULL, NULL, 'ok'
          FROM named WHERE tool_calls IS NULL
        ),
        timed AS (
          SELECT i.*, g.next_same_agent_arrival, (t_start IS NOT NULL AND t_end IS NOT NULL) AS has_timing
          FROM items i LEFT JOIN agent_gap g USING (request_id)
        )
        SELECT request_id, workflow_type_id, workflow_id, agent_id, tool_index::INTEGER, tool_name,
          CASE WHEN has_timing THEN t_start ELSE t_finish END,
          CASE WHEN has_timing THEN t_end ELSE t_finish + (next_same_agent_arrival - t_finish) / n_untimed END,
          CASE WHEN has_timing THEN t_end - t_start ELSE (next_same_agent_arrival - t_finish) / n_untimed END,
          status,
          CASE WHEN has_timing THEN 'explicit' ELSE 'gap' END
        FROM timed
    """)
