"""Split logs by workflow: train and test folders (``profiler split``), or K folds
(``profiler eval --cv K``).

Both read the workflow id where the ingester reads it (:func:`store.record_sql.json_paths`: flat
records and every gateway placement of ``app_metadata``) and place a workflow by
``md5(seed:workflow_id)``: deterministic, independent of file order, and every call of a workflow
on the same side (no leakage of a session across the split).

* :func:`split_logs`: a workflow goes to *train* when ``md5_number(seed:workflow_id)`` mod 10 000
  < ``train`` × 10 000; a record with no readable workflow id stays with train, where the fit
  will quarantine it.
* :func:`write_folds`: the distinct workflow ids, ordered by ``md5(seed:workflow_id)``, are dealt
  round-robin into K folds (sizes differ by at most one workflow); a record with no readable
  workflow id belongs to no fold and is named.

Records are copied verbatim (JSONL lines; Parquet/CSV rows as JSON). Lines and files over the
ingest limits (:class:`store.ingest.Limits`) are left out, as the fit would leave them.
Rows already in memory are split by :func:`store.folds.group_folds`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import duckdb

from store import ingest
from store.record_sql import NON_BLANK, json_paths
from store.duckdb_store import connect, sql_string


def _tagged(paths: Sequence[str | Path]) -> tuple[duckdb.DuckDBPyConnection, int]:
    """An in-memory store whose temp table ``tagged(file, line, text, wf)`` holds every non-blank
    record of the log files under ``paths`` with its workflow id (NULL when unreadable); and the
    number of files found."""
    con = connect(None, read_only=False)
    con.execute(f"CREATE TEMP TABLE staging {ingest.STAGING_COLUMNS}")
    limits = ingest.Limits.from_env()
    n_files = 0
    for path, fmt in ingest.discover(paths):
        n_files += 1
        if path.stat().st_size:
            _, problem, lines = ingest.scan_file(path, fmt, limits)
            if problem is None:  # over a size limit: left out here as the fit would leave it out
                ingest._stage_file(con, path, fmt, limits=limits, expected_lines=lines)
    workflow_id = ", ".join(f"text::JSON->>{sql_string(p)}" for p in json_paths("workflow_id"))
    con.execute(f"""
        CREATE TEMP TABLE tagged AS
        SELECT file, line, text, CASE WHEN json_valid(text) THEN coalesce({workflow_id}) END AS wf
        FROM staging WHERE {NON_BLANK}""")
    return con, n_files


def _write(con: duckdb.DuckDBPyConnection, target: Path, where: str, params: list) -> int:
    """Write the texts of ``assigned`` rows matching ``where`` to ``target`` (in file, line order)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    rows = con.execute(f"SELECT text FROM assigned WHERE {where} ORDER BY file, line", params).fetchall()
    target.write_text("".join(r[0] + "\n" for r in rows))
    return len(rows)


def split_logs(paths: Sequence[str | Path], out: str | Path, train: float = 0.7,
               seed: int = 0) -> dict[str, int]:
    """Write ``out/train/logs.jsonl`` and ``out/test/logs.jsonl``; returns record counts."""
    if not 0.0 < train < 1.0:
        raise ValueError(f"--train must be in (0, 1), got {train}")
    out = Path(out)
    con, _ = _tagged(paths)
    try:
        con.execute(f"""
            CREATE TEMP TABLE assigned AS
            SELECT file, line, text,
              CASE WHEN wf IS NULL THEN 'train'
                   WHEN md5_number({int(seed)} || ':' || wf) % 10000 < {int(round(train * 10000))} THEN 'train'
                   ELSE 'test' END AS side
            FROM tagged""")
        return {side: _write(con, out / side / "logs.jsonl", "side = ?", [side]) for side in ("train", "test")}
    finally:
        con.close()


def write_folds(paths: Sequence[str | Path], out: str | Path, k: int, seed: int = 0,
                unassigned: list[str] | None = None) -> list[dict[str, Any]]:
    """Write ``out/fold<i>/{train,test}/logs.jsonl`` for i < k; returns per-fold counts.

    Records with no readable workflow id go to no fold; ``"file:line"`` of each is appended to
    ``unassigned`` when given. Raises ``ValueError`` when k < 2 or the logs hold fewer than k
    workflows."""
    if k < 2:
        raise ValueError(f"--cv needs K >= 2 folds, got {k}")
    out = Path(out)
    con, n_files = _tagged(paths)
    try:
        if not n_files:
            raise ValueError(f"no log files found in {', '.join(map(str, paths))}")
        con.execute("""
            CREATE TEMP TABLE folds AS
            SELECT wf, (row_number() OVER (ORDER BY md5(? || ':' || wf), wf) - 1) % ? AS fold
            FROM (SELECT DISTINCT wf FROM tagged WHERE wf IS NOT NULL)""", [str(int(seed)), k])
        n_wf = con.execute("SELECT count(*) FROM folds").fetchone()[0]
        if n_wf < k:
            raise ValueError(f"the logs hold {n_wf} workflow(s), fewer than the {k} folds asked for: "
                             f"use --cv {max(n_wf, 2)} or fewer" if n_wf >= 2 else
                             f"the logs hold {n_wf} workflow(s): cross-validation by workflow needs at least 2")
        if unassigned is not None:
            unassigned.extend(f"{f}:{ln}" for f, ln in con.execute(
                "SELECT file, line FROM tagged WHERE wf IS NULL ORDER BY file, line").fetchall())
        con.execute("CREATE TEMP TABLE assigned AS SELECT t.file, t.line, t.text, f.fold "
                    "FROM tagged t JOIN folds f USING (wf)")
        counts = []
        for i in range(k):
            row: dict[str, Any] = {"fold": i}
            for side, cond in (("train", "fold <> ?"), ("test", "fold = ?")):
                row[f"{side}_records"] = _write(con, out / f"fold{i}" / side / "logs.jsonl", cond, [i])
            row["test_workflows"] = int(con.execute("SELECT count(*) FROM folds WHERE fold = ?", [i]).fetchone()[0])
            row["train_workflows"] = int(n_wf - row["test_workflows"])
            counts.append(row)
        return counts
    finally:
        con.close()
