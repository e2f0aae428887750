"""Per-workflow derived columns of ``calls`` and the ``tool_calls`` table.

Recomputed for the workflows an ingest touched (a later file may add calls to an old workflow,
which shifts positions and neighbours), with window functions and ASOF joins:

* position: ``call_index = row_number() over (workflow order by t_arrival, request_id) - 1``;
* neighbours: ``lag``/``lead`` over the same window;
* the gap after a call: ``gap_after_s = t_arrival(next call with t_arrival >= t_finish) - t_finish``
  (an ASOF join), the time the program spent in tools (or thinking) before calling again;
* tool latency: explicit ``tool_calls`` timings when logged; otherwise the gap to the next call of
  the same workflow *and agent* (log-format §2), split evenly over the tools the response named.
"""
from __future__ import annotations

import duckdb
import pandas as pd

from profiler.store import DERIVED_CALL_COLUMNS


def refresh(con: duckdb.DuckDBPyConnection, touched: pd.DataFrame | None = None) -> None:
    """Recompute derived columns and tool rows for ``touched`` workflows (None = all)."""
    if touched is None:
        touched = con.execute("SELECT DISTINCT workflow_type_id, workflow_id FROM calls").df()
    if touched.empty:
        return
    con.register("_touched_df", touched[["workflow_type_id", "workflow_id"]])
    con.execute("CREATE OR REPLACE TEMP TABLE touched AS SELECT * FROM _touched_df")
    con.unregister("_touched_df")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE wcalls AS
        SELECT request_id, workflow_type_id, workflow_id, agent_id, t_arrival, t_first_token,
               t_finish, output_tokens, tool_calls, tool_names
        FROM calls SEMI JOIN touched USING (workflow_type_id, workflow_id)
    """)
    con.execute("""
        CREATE OR REPLACE TEMP TABLE derived AS
        WITH o AS (
          SELECT request_id, workflow_type_id, workflow_id, agent_id, t_finish,
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
          FROM wcalls
          WINDOW wf AS (PARTITION BY workflow_type_id, workflow_id ORDER BY t_arrival, request_id),
                 wa AS (PARTITION BY workflow_type_id, workflow_id, agent_id ORDER BY t_arrival, request_id)
        )
        SELECT o.*, n.t_arrival - o.t_finish AS gap_after_s
        FROM o ASOF LEFT JOIN wcalls n
          ON o.workflow_type_id = n.workflow_type_id AND o.workflow_id = n.workflow_id
         AND n.t_arrival >= o.t_finish
    """)
    sets = ", ".join(f'"{c}" = d."{c}"' for c in DERIVED_CALL_COLUMNS)
    con.execute(f"UPDATE calls SET {sets} FROM derived d WHERE calls.request_id = d.request_id")

    con.execute("""
        DELETE FROM tool_calls t USING touched u
        WHERE t.workflow_type_id = u.workflow_type_id AND t.workflow_id = u.workflow_id
    """)
    con.execute("""
        INSERT INTO tool_calls
        WITH agent_gap AS (   -- gap to the next call of the same workflow and agent
          SELECT c.request_id, n.t_arrival AS next_same_agent_arrival
          FROM wcalls c ASOF LEFT JOIN wcalls n
            ON c.workflow_type_id = n.workflow_type_id AND c.workflow_id = n.workflow_id
           AND c.agent_id = n.agent_id AND n.t_arrival >= c.t_finish
        ),
        explicit AS (
          SELECT request_id, workflow_type_id, workflow_id, agent_id, t_finish,
            unnest(json_extract(tool_calls, '$[*]')) AS e,
            generate_subscripts(json_extract(tool_calls, '$[*]'), 1) - 1 AS tool_index
          FROM wcalls WHERE tool_calls IS NOT NULL
        ),
        named_only AS (   -- tool names from a gateway response, no timings
          SELECT request_id, workflow_type_id, workflow_id, agent_id, t_finish,
            unnest(tool_names) AS tool_name, generate_subscripts(tool_names, 1) - 1 AS tool_index
          FROM wcalls WHERE tool_calls IS NULL AND len(tool_names) > 0
        ),
        items AS (
          SELECT request_id, workflow_type_id, workflow_id, agent_id, t_finish, tool_index,
            e->>'$.name' AS tool_name,
            TRY_CAST(e->>'$.t_start' AS DOUBLE) AS t_start, TRY_CAST(e->>'$.t_end' AS DOUBLE) AS t_end,
            coalesce(e->>'$.status', 'ok') AS status
          FROM explicit
          UNION ALL
          SELECT request_id, workflow_type_id, workflow_id, agent_id, t_finish, tool_index, tool_name,
            NULL, NULL, 'ok'
          FROM named_only
        ),
        untimed AS (
          SELECT i.*, g.next_same_agent_arrival,
            count(*) FILTER (WHERE t_start IS NULL OR t_end IS NULL) OVER (PARTITION BY i.request_id) AS n_untimed
          FROM items i JOIN agent_gap g USING (request_id)
        )
        SELECT request_id, workflow_type_id, workflow_id, agent_id, tool_index::INTEGER, tool_name,
          CASE WHEN t_start IS NOT NULL AND t_end IS NOT NULL THEN t_start ELSE t_finish END,
          CASE WHEN t_start IS NOT NULL AND t_end IS NOT NULL THEN t_end
               ELSE t_finish + (next_same_agent_arrival - t_finish) / n_untimed END,
          CASE WHEN t_start IS NOT NULL AND t_end IS NOT NULL THEN t_end - t_start
               ELSE (next_same_agent_arrival - t_finish) / n_untimed END,
          status,
          CASE WHEN t_start IS NOT NULL AND t_end IS NOT NULL THEN 'explicit' ELSE 'gap' END
        FROM untimed
    """)
    for t in ("touched", "wcalls", "derived"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
