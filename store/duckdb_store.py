"""The DuckDB trace store: schema and connection.

The store is a user-facing artifact: a single DuckDB file (by default
``<profile root>/store.duckdb``) with four tables anyone can query by hand::

    duckdb profile/store.duckdb "SELECT agent_id, avg(output_tokens) FROM calls GROUP BY 1"

``calls``           one row per valid LLM call, with columns derived per workflow
                    (position, neighbours, the tool/think gap after the call).
``tool_calls``      one row per tool execution between two calls.
``quarantine``      every record that could not be loaded, with file, line, field and reason.
``ingested_files``  every file read, with its content hash (re-reading an unchanged file is a no-op).

Each ingest batch is one transaction (:mod:`store.ingest`): a crash or a full disk leaves the
store as before the batch or as after it. See docs/store.md.

Column documentation lives in :data:`TABLE_DOCS` and is also attached to the tables as DuckDB
``COMMENT ON COLUMN`` so that ``duckdb_columns()`` shows it.
"""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import duckdb

from store import faults

#: Environment variable capping DuckDB's memory (e.g. ``4GB``); past it DuckDB spills to disk.
#: Unset: a quarter of the machine's RAM (DuckDB's own default, 80 %, leaves too little for the
#: Python side of a fit on very large logs; capped, the 1M-call fit measured no slower).
MEMORY_LIMIT_ENV = "PROFILER_DUCKDB_MEMORY_LIMIT"


def default_memory_limit() -> str:
    """``PROFILER_DUCKDB_MEMORY_LIMIT`` or a quarter of physical RAM (at least 1 GB)."""
    if os.environ.get(MEMORY_LIMIT_ENV):
        return os.environ[MEMORY_LIMIT_ENV]
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "4GB"
    return f"{max(1, ram // 4 // 2**30)}GB"

#: Column name -> (SQL type, meaning) for every table of the store.
TABLE_DOCS: dict[str, dict[str, tuple[str, str]]] = {
    "calls": {
        "request_id": ("VARCHAR", "unique id of the call"),
        "workflow_type_id": ("VARCHAR", "the application, e.g. coding_assistant"),
        "workflow_id": ("VARCHAR", "one execution (session) of the application"),
        "agent_id": ("VARCHAR", "the role that made the call"),
        "model": ("VARCHAR", "served model name (nullable)"),
        "t_arrival": ("DOUBLE", "request reached the gateway, epoch seconds"),
        "t_first_token": ("DOUBLE", "first output token, epoch seconds (nullable)"),
        "t_finish": ("DOUBLE", "last output token, epoch seconds"),
        "input_tokens": ("BIGINT", "prompt tokens"),
        "output_tokens": ("BIGINT", "completion tokens"),
        "cached_tokens": ("BIGINT", "prompt tokens served from a prefix cache (nullable)"),
        "status": ("VARCHAR", "'ok' or 'error'"),
        "parent_request_ids": ("VARCHAR[]", "calls whose output feeds this one; NULL = previous call"),
        "tool_calls": ("JSON", "explicit tool executions after this call, as logged (nullable)"),
        "tool_names": ("VARCHAR[]", "names of the tools run after this call ([] when none)"),
        "messages": ("JSON", "the prompt as OpenAI chat messages (nullable)"),
        "response_text": ("VARCHAR", "the generated text (nullable)"),
        "extra": ("JSON", "fields of the record outside the contract, kept verbatim (nullable)"),
        "record_shape": ("VARCHAR", "'flat' or 'gateway' (log-format sections 1 and 2)"),
        "source_file": ("VARCHAR", "file the record was read from"),
        "source_line": ("BIGINT", "1-based line (JSONL/CSV data line) or row (Parquet) in that file"),
        "content_hash": ("VARCHAR", "md5 of the identifying content; detects conflicting duplicates"),
        # derived per workflow after every ingest
        "latency_s": ("DOUBLE", "t_finish - t_arrival"),
        "ttft_s": ("DOUBLE", "t_first_token - t_arrival (nullable)"),
        "call_index": ("INTEGER", "0-based position in its workflow, ordered by (t_arrival, request_id)"),
        "workflow_calls": ("INTEGER", "number of calls in its workflow"),
        "agent_call_index": ("INTEGER", "0-based position among the same agent's calls in the workflow"),
        "prev_agent_output_tokens": ("BIGINT", "output_tokens of this agent's previous call in the workflow"),
        "prev_request_id": ("VARCHAR", "previous call of the workflow (by call_index)"),
        "next_request_id": ("VARCHAR", "next call of the workflow (by call_index)"),
        "prev_agent_id": ("VARCHAR", "agent of the previous call"),
        "next_agent_id": ("VARCHAR", "agent of the next call"),
        "gap_after_s": (
            "DOUBLE",
            "first later call of the workflow arriving at/after t_finish, minus t_finish: the tool "
            "and think time after this call (NULL for the last call)",
        ),
    },
    "tool_calls": {
        "request_id": ("VARCHAR", "the call whose response started the tool"),
        "workflow_type_id": ("VARCHAR", ""),
        "workflow_id": ("VARCHAR", ""),
        "agent_id": ("VARCHAR", ""),
        "tool_index": ("INTEGER", "0-based order of the tool within that call's tools"),
        "tool_name": ("VARCHAR", "tool name"),
        "t_start": ("DOUBLE", "epoch seconds"),
        "t_end": ("DOUBLE", "epoch seconds"),
        "latency_s": ("DOUBLE", "t_end - t_start"),
        "status": ("VARCHAR", "'ok' or 'error'"),
        "timing_source": (
            "VARCHAR",
            "'explicit' (timings logged) or 'gap' (gap to the next call of the same workflow and "
            "agent, split evenly over the tools that response named)",
        ),
    },
    "quarantine": {
        "file": ("VARCHAR", "file the bad record came from"),
        "line": ("BIGINT", "1-based line/row; NULL for whole-file problems"),
        "field": ("VARCHAR", "offending field (nullable)"),
        "reason": ("VARCHAR", "why the record was not loaded"),
        "raw": ("VARCHAR", "the record's text, first 2000 characters"),
        "ingested_at": ("TIMESTAMP", "when the load ran"),
    },
    "ingested_files": {
        "path": ("VARCHAR", "absolute path of the file"),
        "sha256": ("VARCHAR", "content hash; a file with a known hash is skipped"),
        "size_bytes": ("BIGINT", ""),
        "format": ("VARCHAR", "jsonl, jsonl.gz, parquet or csv"),
        "rows_read": ("BIGINT", "records seen (blank lines excluded)"),
        "rows_loaded": ("BIGINT", "new calls stored"),
        "rows_duplicate": ("BIGINT", "records identical to a stored call (skipped)"),
        "rows_quarantined": ("BIGINT", "records sent to quarantine"),
        "ingested_at": ("TIMESTAMP", "when the load ran"),
    },
}

#: Columns of ``calls`` that the ingester writes (the rest are derived).
BASE_CALL_COLUMNS: list[str] = list(TABLE_DOCS["calls"])[: list(TABLE_DOCS["calls"]).index("latency_s")]
DERIVED_CALL_COLUMNS: list[str] = [c for c in TABLE_DOCS["calls"] if c not in BASE_CALL_COLUMNS]


def sql_string(value: str | Path) -> str:
    """``value`` as a SQL string literal (single quotes doubled), for paths and names that
    DuckDB takes only as literals (``read_parquet('…')``, ``ATTACH``, ``COMMENT ON``)."""
    return "'" + str(value).replace("'", "''") + "'"


def sql_columns(names: Iterable[str]) -> str:
    """``"a", "b", …``: column names quoted for a SQL column list."""
    return ", ".join(f'"{name}"' for name in names)


def _create_table_sql(table: str) -> str:
    cols = ",\n  ".join(f'"{name}" {sql_type}' for name, (sql_type, _) in TABLE_DOCS[table].items())
    return f"CREATE TABLE IF NOT EXISTS {table} (\n  {cols}\n)"


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create the four tables (and their column comments) when missing."""
    for table, columns in TABLE_DOCS.items():
        existed = con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND schema_name = 'main'",
            [table],
        ).fetchone()[0]
        con.execute(_create_table_sql(table))
        if not existed:
            for name, (_, doc) in columns.items():
                if doc:
                    con.execute(f"COMMENT ON COLUMN {table}.\"{name}\" IS {sql_string(doc)}")


class StoreError(Exception):
    """The store cannot be used: locked by another process, read-only, or the disk is full.

    The message is one line meant for the user (the CLI prints it instead of a traceback)."""


#: errno values that mean "cannot write here" -> the words used in messages.
_OS_PROBLEMS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EFBIG: "the file-size limit is reached (ulimit -f)",
}


def one_line_error(exc: BaseException, path: str | Path | None = None) -> str | None:
    """A one-line message for a store or file-system failure the user must fix (lock conflict,
    read-only store or folder, full disk, file-size limit), or None when ``exc`` is something else (a bug: let
    it raise with its traceback)."""
    where = f" ({path})" if path is not None else ""
    if isinstance(exc, StoreError):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno in _OS_PROBLEMS:
        target = exc.filename or path
        return (f"{target}: {_OS_PROBLEMS[exc.errno]}" if target else
                f"{_OS_PROBLEMS[exc.errno]}{where}") + " (nothing was half-written)"
    if not isinstance(exc, duckdb.Error):
        return None
    text = str(exc)
    lock = re.search(r"Conflicting lock is held in (.*?) \(PID (\d+)\)", text)
    if lock or "Could not set lock" in text:
        pid = f" (PID {lock.group(2)})" if lock else ""
        return (f"the store{where} is in use by another process{pid}: wait for it to finish, "
                f"or use another --db")
    for needle, words in (("No space left", "the disk is full"), ("Disk quota", "the disk quota is exhausted"),
                          ("Read-only file system", "the file system is read-only"),
                          ("read-only mode", "it is open read-only"),
                          ("Permission denied", "permission denied"),
                          ("File too large", "the file-size limit is reached (ulimit -f)")):
        if needle in text:
            return f"cannot write the store{where}: {words} (it keeps its last committed state)"
    if "database has been invalidated" in text:
        return (f"the store{where} hit a fatal error earlier in this run (often a full disk) and was "
                f"rolled back: free space and run again")
    return None


def execute(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None = None,
            ) -> duckdb.DuckDBPyConnection:
    """``con.execute(sql, params)`` after a :func:`store.faults.point` (crash-safety tests
    inject a kill or a full disk before any statement of an ingest)."""
    faults.point("sql: " + " ".join(sql.split()[:4]))
    return con.execute(sql, params) if params is not None else con.execute(sql)


def connect(path: str | Path | None, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) the store at ``path``; ``None`` gives an in-memory store.

    DuckDB's memory is capped at :func:`default_memory_limit` (it spills to disk past it).
    A store locked by another process, a read-only store or folder, or a full disk raise
    :class:`StoreError` with a one-line message."""
    if path is None:
        con = duckdb.connect()
    else:
        path = Path(path)
        if read_only and not path.exists():
            raise FileNotFoundError(f"no DuckDB store at {path}")
        try:
            if not read_only:
                path.parent.mkdir(parents=True, exist_ok=True)
            con = duckdb.connect(str(path), read_only=read_only)
        except (OSError, duckdb.Error) as exc:
            message = one_line_error(exc, path)
            if message is None:
                raise
            raise StoreError(message) from exc
    con.execute("SET memory_limit = ?", [default_memory_limit()])
    if not read_only:
        try:
            ensure_schema(con)
        except (OSError, duckdb.Error) as exc:
            con.close()
            message = one_line_error(exc, path)
            if message is None:
                raise
            raise StoreError(message) from exc
    return con


def store_counts(con: duckdb.DuckDBPyConnection, schema: str | None = None) -> dict[str, int]:
    """Calls, workflows, workflow types, tool executions and quarantined records in the store
    (``schema``: the name the store is attached under, e.g. ``"store"``; None: the main database)."""
    q = f"{schema}." if schema else ""
    calls, workflows, types = con.execute(
        "SELECT count(*), count(DISTINCT (workflow_type_id, workflow_id)), count(DISTINCT workflow_type_id) "
        f"FROM {q}calls").fetchone()
    return {"calls": int(calls), "workflows": int(workflows), "workflow_types": int(types),
            "tool_calls": int(con.execute(f"SELECT count(*) FROM {q}tool_calls").fetchone()[0]),
            "quarantined": int(con.execute(f"SELECT count(*) FROM {q}quarantine").fetchone()[0])}
