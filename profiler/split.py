"""Split logs by workflow into train and test folders (``profiler split``).

A workflow goes to *train* when ``md5(seed:workflow_id)`` mod 10 000 < ``train`` × 10 000: the
assignment is deterministic, independent of file order, and keeps every call of a workflow on the
same side (no leakage of a session across the split). The workflow id is read where the ingester
reads it (:func:`profiler.record_sql.json_paths`: flat records and every gateway placement of
``app_metadata``). Records are copied verbatim (JSONL lines; Parquet/CSV rows as JSON); a record
with no readable workflow id stays with train, where the fit will quarantine it. Lines and files
over the ingest limits (:class:`profiler.ingest.Limits`) are left out, as the fit would leave them.

``by="time"`` splits in time instead (train on the past, test on the future): workflows are
ordered by their first call's ``t_arrival`` (ties by id) and the first ``train`` share of them is
train — a profile is then scored on sessions that started after every session it was fit on,
as a deployed profile is. Every workflow needs a readable ``t_arrival`` then.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import duckdb

from profiler import ingest
from profiler.record_sql import NON_BLANK, json_paths
from profiler.store import connect, sql_string


def split_logs(paths: Sequence[str | Path], out: str | Path, train: float = 0.7,
               seed: int = 0, by: str = "hash") -> dict[str, int]:
    """Write ``out/train/logs.jsonl`` and ``out/test/logs.jsonl``; returns record counts.
    ``by``: ``"hash"`` (the seeded hash of the workflow id) or ``"time"`` (the earliest-starting
    ``train`` share of workflows is train; ``seed`` unused)."""
    if not 0.0 < train < 1.0:
        raise ValueError(f"--train must be in (0, 1), got {train}")
    if by not in ("hash", "time"):
        raise ValueError(f"--by {by!r}: use hash or time")
    out = Path(out)
    con = connect(None, read_only=False)
    con.execute(f"CREATE TEMP TABLE staging {ingest.STAGING_COLUMNS}")
    limits = ingest.Limits.from_env()
    for path, fmt in ingest.discover(paths):
        if path.stat().st_size:
            _, problem, lines = ingest.scan_file(path, fmt, limits)
            if problem is None:  # over a size limit: left out here as the fit would leave it out
                ingest._stage_file(con, path, fmt, limits=limits, expected_lines=lines)
    workflow_id = ", ".join(f"text::JSON->>{sql_string(p)}" for p in json_paths("workflow_id"))
    if by == "time":
        _assign_by_time(con, workflow_id, train)
    else:
        con.execute(f"""
        CREATE TEMP TABLE assigned AS
        SELECT file, line, text,
          CASE WHEN wf IS NULL THEN 'train'
               WHEN md5_number({int(seed)} || ':' || wf) % 10000 < {int(round(train * 10000))} THEN 'train'
               ELSE 'test' END AS side
        FROM (
          SELECT file, line, text,
            CASE WHEN json_valid(text) THEN coalesce({workflow_id}) END AS wf
          FROM staging WHERE {NON_BLANK})
        """)
    counts = {}
    for side in ("train", "test"):
        target = out / side / "logs.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        rows = con.execute("SELECT text FROM assigned WHERE side = ? ORDER BY file, line", [side]).fetchall()
        target.write_text("".join(r[0] + "\n" for r in rows))
        counts[side] = len(rows)
    con.close()
    return counts


def _assign_by_time(con: duckdb.DuckDBPyConnection, workflow_id: str, train: float) -> None:
    """``assigned`` by start time: the first ``round(train · n)`` of the ``n`` workflows ordered
    by their earliest ``t_arrival`` (epoch seconds or an ISO time; ties by id) are train."""
    raw = ", ".join(f"text::JSON->>{sql_string(p)}" for p in json_paths("t_arrival"))
    con.execute(f"""
        CREATE TEMP TABLE parsed AS
        SELECT file, line, text, wf,
          coalesce(TRY_CAST(t_raw AS DOUBLE), epoch(TRY_CAST(t_raw AS TIMESTAMPTZ))) AS t
        FROM (
          SELECT file, line, text,
            CASE WHEN json_valid(text) THEN coalesce({workflow_id}) END AS wf,
            CASE WHEN json_valid(text) THEN coalesce({raw}) END AS t_raw
          FROM staging WHERE {NON_BLANK})
    """)
    missing = con.execute("SELECT wf FROM parsed WHERE wf IS NOT NULL GROUP BY wf "
                          "HAVING min(t) IS NULL ORDER BY wf LIMIT 1").fetchone()
    if missing is not None:
        raise ValueError(f"workflow {missing[0]!r} has no readable t_arrival: --by time needs one "
                         "per workflow (use --by hash)")
    n = con.execute("SELECT count(DISTINCT wf) FROM parsed").fetchone()[0]
    con.execute(f"""
        CREATE TEMP TABLE assigned AS
        WITH starts AS (
          SELECT wf, row_number() OVER (ORDER BY min(t), wf) AS k FROM parsed
          WHERE wf IS NOT NULL GROUP BY wf)
        SELECT file, line, text,
          CASE WHEN p.wf IS NULL OR s.k <= {int(round(train * n))} THEN 'train' ELSE 'test' END AS side
        FROM parsed p LEFT JOIN starts s ON p.wf = s.wf
    """)
