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

``order="time"`` (:func:`split_logs`) splits by time instead: within each workflow type, workflows
are ranked by their start (the earliest ``t_arrival`` of their records; ties by workflow id) and the
first ``train`` share goes to train, the rest to test — a model fit on the past and scored on the
future, as it is deployed. The cut is per type so that a log whose applications ran in different
periods (one type's runs all before another's) still tests every type on its own future, not on a
cold start. A workflow whose start cannot be read (no numeric ``t_arrival``) sorts last (test).

**Grouped folds** (``group_by``, ``profiler eval --cv K --group-by FIELD``): when several
workflows are trials of one task (the same SWE-bench instance run twice, one instance localized and
repaired), a fold by workflow puts one trial in train and another in test, and the score
flatters. With ``group_by`` the unit dealt into folds is the *group*: the record field ``FIELD``
(a log-format field, else a top-level or ``app_metadata`` key of the record), cut by
``group_pattern`` when given (a regular expression; its first capture group, else its whole match,
is the group: ``--group-by workflow_id --group-pattern '[^/]+$'`` groups ``bs1/django-1`` with
``bs4/django-1``). A workflow without a value is its own group. Every workflow of a group lands in
one fold; folds differ by at most one group.

Records are copied verbatim (JSONL lines; Parquet/CSV rows as JSON). Lines and files over the
ingest limits (:class:`store.ingest.Limits`) are left out, as the fit would leave them.
Rows already in memory are split by :func:`store.folds.group_folds`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import duckdb

from store import ingest
from store.record_sql import FIELDS, NON_BLANK, json_paths
from store.duckdb_store import TABLE_DOCS, connect, sql_string


def group_sql(group_by: str, group_pattern: str | None = None) -> str:
    """SQL over a staged record's ``text``: the group value of ``group_by`` (see the module
    docstring), NULL when the record has none. Raises ``ValueError`` on a bad field or pattern."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", group_by):
        raise ValueError(f"--group-by takes a field name (letters, digits, _), got {group_by!r}")
    paths = (json_paths(group_by) if any(f.name == group_by for f in FIELDS)
             else [f"$.{group_by}", f"$.app_metadata.{group_by}"])
    value = "coalesce(" + ", ".join(f"text::JSON->>{sql_string(p)}" for p in paths) + ")"
    if group_pattern is None:
        return value
    try:
        capture = 1 if re.compile(group_pattern).groups else 0
    except re.error as exc:
        raise ValueError(f"--group-pattern {group_pattern!r} is not a regular expression: {exc}") from None
    return f"nullif(regexp_extract({value}, {sql_string(group_pattern)}, {capture}), '')"


def call_group_sql(group_by: str, group_pattern: str | None = None) -> str:
    """SQL over the store's ``calls`` table: the group of a call for grouped selection folds
    (``profiler fit --group-by FIELD [--group-pattern RE]``): the column ``FIELD`` of ``calls``, else
    the record's field ``FIELD`` kept in ``extra``; with ``group_pattern`` its first capture group
    (else its whole match), as in :func:`group_sql`. A call without one is its own workflow's
    group. Raises ``ValueError`` on a bad field or pattern."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", group_by):
        raise ValueError(f"--group-by takes a field name (letters, digits, _), got {group_by!r}")
    value = (f"CAST({group_by} AS VARCHAR)" if group_by in TABLE_DOCS["calls"]
             else f"json_extract_string(extra, {sql_string('$.' + group_by)})")
    if group_pattern is not None:
        try:
            capture = 1 if re.compile(group_pattern).groups else 0
        except re.error as exc:
            raise ValueError(f"--group-pattern {group_pattern!r} is not a regular expression: {exc}") from None
        value = f"nullif(regexp_extract({value}, {sql_string(group_pattern)}, {capture}), '')"
    return f"coalesce({value}, 'workflow:' || workflow_type_id || '/' || workflow_id)"


def _tagged(paths: Sequence[str | Path], group: str = "NULL") -> tuple[duckdb.DuckDBPyConnection, int]:
    """An in-memory store whose temp table ``tagged(file, line, text, wf, t, wt, grp)`` holds every
    non-blank record of the log files under ``paths`` with its workflow id (NULL when unreadable),
    arrival time (epoch seconds; ISO times converted), workflow type and group (the SQL ``group``, :func:`group_sql`); and the number of
    files found."""
    con = connect(None, read_only=False)
    con.execute(f"CREATE TEMP TABLE staging {ingest.STAGING_COLUMNS}")
    limits = ingest.Limits.from_env()
    n_files = 0
    files, links = ingest.discover_all(paths)
    if not files and links:
        raise ValueError(f"no log files read in {', '.join(map(str, paths))}: {len(links)} symbolic "
                         f"link(s) lead outside the folder and are not followed (e.g. {links[0][0]} -> "
                         f"{links[0][1]}); copy the files in or name them directly")
    for path, fmt in files:
        n_files += 1
        if path.stat().st_size:
            _, problem, lines = ingest.scan_file(path, fmt, limits)
            if problem is None:  # over a size limit: left out here as the fit would leave it out
                ingest._stage_file(con, path, fmt, limits=limits, expected_lines=lines)
    workflow_id = ", ".join(f"text::JSON->>{sql_string(p)}" for p in json_paths("workflow_id"))
    # epoch seconds, or an ISO-8601 time read as epoch seconds
    t_arrival = ", ".join(f"TRY_CAST(text::JSON->>{sql_string(p)} AS DOUBLE), "
                          f"epoch(TRY_CAST(text::JSON->>{sql_string(p)} AS TIMESTAMPTZ))" for p in json_paths("t_arrival"))
    workflow_type = ", ".join(f"text::JSON->>{sql_string(p)}" for p in json_paths("workflow_type_id"))
    con.execute(f"""
        CREATE TEMP TABLE tagged AS
        SELECT file, line, text, wf, CASE WHEN wf IS NOT NULL THEN t END AS t, wt, grp
        FROM (SELECT file, line, text,
                CASE WHEN json_valid(text) THEN coalesce({workflow_id}) END AS wf,
                CASE WHEN json_valid(text) THEN coalesce({t_arrival}) END AS t,
                CASE WHEN json_valid(text) THEN coalesce({workflow_type}) END AS wt,
                CASE WHEN json_valid(text) THEN {group} END AS grp
              FROM staging WHERE {NON_BLANK})""")
    return con, n_files


def _write(con: duckdb.DuckDBPyConnection, target: Path, where: str, params: list) -> int:
    """Write the texts of ``assigned`` rows matching ``where`` to ``target`` (in file, line order)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    rows = con.execute(f"SELECT text FROM assigned WHERE {where} ORDER BY file, line", params).fetchall()
    target.write_text("".join(r[0] + "\n" for r in rows))
    return len(rows)


def split_logs(paths: Sequence[str | Path], out: str | Path, train: float = 0.7,
               seed: int = 0, order: str = "hash") -> dict[str, int]:
    """Write ``out/train/logs.jsonl`` and ``out/test/logs.jsonl``; returns record counts.
    ``order``: ``"hash"`` (seeded, by workflow id) or ``"time"`` (past → train, future → test)."""
    if not 0.0 < train < 1.0:
        raise ValueError(f"--train must be in (0, 1), got {train}")
    if order not in ("hash", "time"):
        raise ValueError(f"split order must be 'hash' or 'time', got {order!r}")
    out = Path(out)
    con, _ = _tagged(paths)
    try:
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
        return {side: _write(con, out / side / "logs.jsonl", "side = ?", [side]) for side in ("train", "test")}
    finally:
        con.close()


def write_folds(paths: Sequence[str | Path], out: str | Path, k: int, seed: int = 0,
                unassigned: list[str] | None = None, group_by: str | None = None,
                group_pattern: str | None = None) -> list[dict[str, Any]]:
    """Write ``out/fold<i>/{train,test}/logs.jsonl`` for i < k; returns per-fold counts.

    Records with no readable workflow id go to no fold; ``"file:line"`` of each is appended to
    ``unassigned`` when given. ``group_by``/``group_pattern``: grouped folds (module docstring).
    Raises ``ValueError`` when k < 2 or the logs hold fewer than k workflows (groups)."""
    if k < 2:
        raise ValueError(f"--cv needs K >= 2 folds, got {k}")
    group = group_sql(group_by, group_pattern) if group_by else "NULL"
    out = Path(out)
    con, n_files = _tagged(paths, group)
    try:
        if not n_files:
            raise ValueError(f"no log files found in {', '.join(map(str, paths))}")
        con.execute("""
            CREATE TEMP TABLE groups AS
            SELECT wf, coalesce(min(grp), wf) AS g FROM tagged WHERE wf IS NOT NULL GROUP BY wf""")
        con.execute("""
            CREATE TEMP TABLE folds AS
            SELECT wf, fold FROM groups JOIN (
              SELECT g, (row_number() OVER (ORDER BY md5(? || ':' || g), g) - 1) % ? AS fold
              FROM (SELECT DISTINCT g FROM groups)) USING (g)""", [str(int(seed)), k])
        n_wf = con.execute("SELECT count(*) FROM folds").fetchone()[0]
        n_groups = con.execute("SELECT count(DISTINCT g) FROM groups").fetchone()[0]
        if group_by and n_groups < k and n_wf >= k:
            raise ValueError(f"the logs hold {n_groups} group(s) of --group-by {group_by}, fewer than the {k} "
                             f"folds asked for: use --cv {max(n_groups, 2)} or fewer")
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
