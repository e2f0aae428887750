"""Split logs by workflow into train and test folders (``profiler split``).

A workflow goes to *train* when ``md5(seed:workflow_id)`` mod 10 000 < ``train`` × 10 000: the
assignment is deterministic, independent of file order, and keeps every call of a workflow on the
same side (no leakage of a session across the split). The workflow id is read where the ingester
reads it (:func:`profiler.record_sql.json_paths`: flat records and every gateway placement of
``app_metadata``). Records are copied verbatim (JSONL lines; Parquet/CSV rows as JSON); a record
with no readable workflow id stays with train, where the fit will quarantine it. Lines and files
over the ingest limits (:class:`profiler.ingest.Limits`) are left out, as the fit would leave them.

``order="time"`` splits by time instead: within each workflow type, workflows are ranked by
their start (the earliest ``t_arrival`` of their records; ties by workflow id) and the first
``train`` share goes to train, the rest to test — a model fit on the past and scored on the
future, as it is deployed. The cut is per type so that a log whose applications ran in different
periods (one type's runs all before another's) still tests every type on its own future, not on a
cold start. A workflow whose start cannot be read (no numeric ``t_arrival``) sorts last (test).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from profiler import ingest
from profiler.record_sql import NON_BLANK, json_paths
from profiler.store import connect, sql_string


def split_logs(paths: Sequence[str | Path], out: str | Path, train: float = 0.7,
               seed: int = 0, order: str = "hash") -> dict[str, int]:
    """Write ``out/train/logs.jsonl`` and ``out/test/logs.jsonl``; returns record counts.
    ``order``: ``"hash"`` (seeded, by workflow id) or ``"time"`` (past → train, future → test)."""
    if not 0.0 < train < 1.0:
        raise ValueError(f"--train must be in (0, 1), got {train}")
    if order not in ("hash", "time"):
        raise ValueError(f"split order must be 'hash' or 'time', got {order!r}")
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
    t_arrival = ", ".join(f"TRY_CAST(text::JSON->>{sql_string(p)} AS DOUBLE)" for p in json_paths("t_arrival"))
    workflow_type = ", ".join(f"text::JSON->>{sql_string(p)}" for p in json_paths("workflow_type_id"))
    con.execute(f"""
        CREATE TEMP TABLE tagged AS
        SELECT file, line, text, wf, CASE WHEN wf IS NOT NULL THEN t END AS t, wt
        FROM (SELECT file, line, text,
                CASE WHEN json_valid(text) THEN coalesce({workflow_id}) END AS wf,
                CASE WHEN json_valid(text) THEN coalesce({t_arrival}) END AS t,
                CASE WHEN json_valid(text) THEN coalesce({workflow_type}) END AS wt
              FROM staging WHERE {NON_BLANK})""")
    if order == "time":
        con.execute("""
            CREATE TEMP TABLE ranked AS
            SELECT wf, row_number() OVER (PARTITION BY min(wt) ORDER BY min(t) NULLS LAST, wf) - 1 AS r,
              count(*) OVER (PARTITION BY min(wt)) AS n
            FROM tagged WHERE wf IS NOT NULL GROUP BY wf""")
        side = f"CASE WHEN r < round(n * {float(train)}) THEN 'train' ELSE 'test' END"
        con.execute(f"""CREATE TEMP TABLE assigned AS
            SELECT file, line, text, coalesce({side}, 'train') AS side FROM tagged LEFT JOIN ranked USING (wf)""")
    else:
        con.execute(f"""
            CREATE TEMP TABLE assigned AS
            SELECT file, line, text,
              CASE WHEN wf IS NULL THEN 'train'
                   WHEN md5_number({int(seed)} || ':' || wf) % 10000 < {int(round(train * 10000))} THEN 'train'
                   ELSE 'test' END AS side
            FROM tagged""")
    counts = {}
    for side in ("train", "test"):
        target = out / side / "logs.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        rows = con.execute("SELECT text FROM assigned WHERE side = ? ORDER BY file, line", [side]).fetchall()
        target.write_text("".join(r[0] + "\n" for r in rows))
        counts[side] = len(rows)
    con.close()
    return counts
