"""Load request logs into the DuckDB store.

Pipeline (all heavy lifting is DuckDB; Python only walks the folder tree):

1. **discover** log files under the given paths (``.jsonl``, ``.jsonl.gz``, ``.ndjson``,
   ``.parquet``, ``.csv``, ``.csv.gz``); skip files whose content hash is already in
   ``ingested_files``.
2. **stage** every record as one JSON text with its file and line: JSONL through DuckDB's CSV
   reader in single-column mode (one line = one value, line numbers kept), Parquet and CSV rows
   turned into JSON with ``to_json``. A file DuckDB cannot read to the end (a truncated gzip) is
   re-read line by line in Python so that every complete record before the damage is kept.
3. **validate** with one set-based query (:mod:`profiler.record_sql`): invalid records go to
   ``quarantine`` with file, line, field and reason.
4. **deduplicate** by ``request_id``: a record identical to one already seen is skipped; one with
   the same id and different content is quarantined ("conflicting duplicate"), the first kept.
5. **derive** per-workflow columns and the ``tool_calls`` table for the workflows touched
   (:mod:`profiler.derive`).
"""
from __future__ import annotations

import gzip
import hashlib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import duckdb
import pandas as pd

from profiler import derive, record_sql
from profiler.store import BASE_CALL_COLUMNS, sql_string

#: File name suffix -> format name.
SUFFIX_FORMATS: dict[str, str] = {
    ".jsonl.gz": "jsonl.gz",
    ".ndjson.gz": "jsonl.gz",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".csv.gz": "csv",
    ".csv": "csv",
}
#: Columns of a staging table: every record as one text with its file and 1-based line.
STAGING_COLUMNS = "(file VARCHAR, line BIGINT, text VARCHAR)"
#: Longest JSONL line accepted (prompts with whole repositories in them get long).
MAX_LINE_BYTES = 256 * 1024 * 1024


class IngestError(Exception):
    """Raised in strict mode when records were quarantined, or when no input files exist."""


@dataclass
class FileReport:
    path: str
    format: str
    rows_read: int = 0
    rows_loaded: int = 0
    rows_duplicate: int = 0
    rows_quarantined: int = 0
    skipped: bool = False  # already ingested (same content hash)


@dataclass
class IngestReport:
    files: list[FileReport] = field(default_factory=list)
    first_reasons: list[str] = field(default_factory=list)  # "file:line: reason", up to 10

    @property
    def loaded(self) -> int:
        return sum(f.rows_loaded for f in self.files)

    @property
    def quarantined(self) -> int:
        return sum(f.rows_quarantined for f in self.files)

    @property
    def duplicates(self) -> int:
        return sum(f.rows_duplicate for f in self.files)

    @property
    def skipped_files(self) -> int:
        return sum(f.skipped for f in self.files)

    def summary(self) -> str:
        return (f"{len(self.files)} files ({self.skipped_files} unchanged, skipped): "
                f"{self.loaded} calls loaded, {self.duplicates} duplicates skipped, "
                f"{self.quarantined} records quarantined")


def reason_line(file: str, line: int | None, reason: str) -> str:
    """One entry of :attr:`IngestReport.first_reasons`: ``file:line: reason`` (line ``-`` for a
    whole-file problem)."""
    return f"{file}:{line if line is not None else '-'}: {reason}"


def file_format(path: Path) -> str | None:
    """Format name for a log file, or None when the suffix is not a log format we read."""
    name = path.name.lower()
    for suffix, fmt in SUFFIX_FORMATS.items():
        if name.endswith(suffix):
            return fmt
    return None


def discover(paths: Iterable[str | Path]) -> list[tuple[Path, str]]:
    """Every log file under ``paths`` (files or folder trees), sorted, with its format."""
    found: dict[Path, str] = {}
    for p in map(Path, paths):
        if not p.exists():
            raise IngestError(f"{p}: no such file or folder")
        candidates = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())
        for q in candidates:
            if any(part.startswith(".") for part in q.relative_to(p if p.is_dir() else p.parent).parts):
                continue  # hidden files and folders (.git, editor swap files)
            fmt = file_format(q)
            if fmt is None:
                if q == p:
                    raise IngestError(f"{q}: not a log file (expected one of {', '.join(SUFFIX_FORMATS)})")
                continue
            found[q.resolve()] = fmt
    return sorted(found.items())


def sha256_of(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _stage_jsonl_python(con: duckdb.DuckDBPyConnection, path: Path, fmt: str, table: str) -> str | None:
    """Line-by-line fallback for files DuckDB could not read to the end.

    Keeps every line read before the damage; returns a description of the damage (or None).
    """
    opener = gzip.open if fmt == "jsonl.gz" else open
    lines: list[str] = []
    damage = None
    try:
        with opener(path, "rb") as fh:
            for raw in fh:
                lines.append(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
    except (EOFError, OSError, zlib.error) as exc:
        damage = f"file is damaged after line {len(lines)} ({type(exc).__name__}: {exc}); " \
                 f"the {len(lines)} lines before it were read"
    if lines:
        df = pd.DataFrame({"file": str(path), "line": range(1, len(lines) + 1), "text": lines})
        con.register("_fallback_lines", df)
        con.execute(f"INSERT INTO {table} SELECT file, line, text FROM _fallback_lines")
        con.unregister("_fallback_lines")
    return damage


def _stage_file(con: duckdb.DuckDBPyConnection, path: Path, fmt: str, table: str = "staging") -> str | None:
    """Append the file's records to ``table`` (file, line, text); returns a whole-file problem or None."""
    src = sql_string(path)
    if fmt in ("jsonl", "jsonl.gz"):
        try:
            con.execute(f"""
                INSERT INTO {table}
                SELECT {src}, row_number() OVER (), line_text
                FROM read_csv({src}, columns={{'line_text': 'VARCHAR'}}, header=false, delim='\\x1f',
                              quote='', escape='', auto_detect=false, strict_mode=false,
                              null_padding=false, max_line_size={MAX_LINE_BYTES})
            """)
            return None
        except duckdb.Error:
            con.execute(f"DELETE FROM {table} WHERE file = {src}")
            return _stage_jsonl_python(con, path, fmt, table)
    try:
        if fmt == "parquet":
            con.execute(f"INSERT INTO {table} SELECT {src}, row_number() OVER (), to_json(t)::VARCHAR "
                        f"FROM read_parquet({src}) t")
        else:  # csv: first line is the header, so data line n is file line n + 1
            con.execute(f"INSERT INTO {table} SELECT {src}, row_number() OVER () + 1, to_json(t)::VARCHAR "
                        f"FROM read_csv({src}, all_varchar=true, header=true) t")
    except duckdb.Error as exc:
        con.execute(f"DELETE FROM {table} WHERE file = {src}")
        return f"unreadable {fmt} file: {str(exc).splitlines()[0]}"
    return None


def ingest(
    con: duckdb.DuckDBPyConnection,
    paths: Sequence[str | Path],
    *,
    strict: bool = False,
    progress: bool = False,
) -> IngestReport:
    """Load every log file under ``paths`` into the store behind ``con``.

    Returns an :class:`IngestReport`; with ``strict`` raises :class:`IngestError` (after loading
    the valid records) when any record was quarantined.
    """
    files = discover(paths)
    if not files:
        raise IngestError("no log files found under " + ", ".join(map(str, paths))
                          + f" (looked for {', '.join(SUFFIX_FORMATS)})")
    report = IngestReport()
    known = {r[0] for r in con.execute("SELECT sha256 FROM ingested_files").fetchall()}
    con.execute(f"CREATE OR REPLACE TEMP TABLE staging {STAGING_COLUMNS}")
    con.execute("CREATE OR REPLACE TEMP TABLE file_problems (file VARCHAR, reason VARCHAR)")
    todo: list[tuple[Path, str, str, FileReport]] = []

    from rich.progress import Progress  # local: keeps `import profiler` light

    with Progress(transient=True, disable=not progress) as bar:
        task = bar.add_task("reading logs", total=len(files))
        for path, fmt in files:
            fr = FileReport(str(path), fmt)
            report.files.append(fr)
            digest = sha256_of(path)
            if digest in known:
                fr.skipped = True
            else:
                known.add(digest)
                if path.stat().st_size == 0:
                    problem = "empty file: no records"
                else:  # staged alone first, so the emptiness check never scans other files
                    con.execute(f"CREATE OR REPLACE TEMP TABLE staging_file {STAGING_COLUMNS}")
                    problem = _stage_file(con, path, fmt, "staging_file")
                    if problem is None and not con.execute(
                            f"SELECT 1 FROM staging_file WHERE {record_sql.NON_BLANK} LIMIT 1").fetchall():
                        problem = "empty file: no records"
                    con.execute("INSERT INTO staging SELECT * FROM staging_file")
                    con.execute("DROP TABLE staging_file")
                if problem:
                    con.execute("INSERT INTO file_problems VALUES (?, ?)", [str(path), problem])
                todo.append((path, fmt, digest, fr))
            bar.advance(task)

    if todo:
        _load_staged(con, report, todo)
    con.execute("DROP TABLE IF EXISTS staging")
    if strict and report.quarantined:
        raise IngestError(
            f"{report.quarantined} records quarantined (strict mode); first reasons:\n  "
            + "\n  ".join(report.first_reasons))
    return report


def _load_staged(con: duckdb.DuckDBPyConnection, report: IngestReport,
                 todo: list[tuple[Path, str, str, FileReport]]) -> None:
    """Validate, deduplicate and store everything in ``staging``; fill the file reports."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE parsed AS {record_sql.parse_sql('staging')}")
    # Duplicates: within this batch (first occurrence by file, line wins) and against the store.
    con.execute("""
        CREATE OR REPLACE TEMP TABLE judged AS
        WITH ranked AS (
          SELECT file, line, request_id, content_hash,
            row_number() OVER w AS rn,
            first_value(content_hash) OVER w AS first_hash,
            first_value(file || ':' || line) OVER w AS first_at
          FROM parsed WHERE reason IS NULL
          WINDOW w AS (PARTITION BY request_id ORDER BY file, line)
        )
        SELECT r.file, r.line, r.request_id, r.first_at,
          CASE
            WHEN c.request_id IS NOT NULL AND c.content_hash = r.content_hash THEN 'duplicate'
            WHEN c.request_id IS NOT NULL THEN 'conflict_store'
            WHEN rn > 1 AND r.content_hash = first_hash THEN 'duplicate'
            WHEN rn > 1 THEN 'conflict_batch'
            ELSE 'new'
          END AS verdict,
          c.source_file || ':' || c.source_line AS stored_at
        FROM ranked r LEFT JOIN calls c USING (request_id)
    """)
    con.execute("""
        INSERT INTO quarantine
        SELECT file, line, field, reason, raw, now() FROM parsed WHERE reason IS NOT NULL
        UNION ALL
        SELECT j.file, j.line, 'request_id',
          'conflicting duplicate request_id ' || j.request_id || ': different content from the record at '
            || CASE WHEN verdict = 'conflict_store' THEN stored_at || ' (already stored)' ELSE first_at END,
          left(s.text, 2000), now()
        FROM judged j JOIN staging s USING (file, line) WHERE verdict IN ('conflict_store', 'conflict_batch')
        UNION ALL
        SELECT file, NULL, NULL, reason, NULL, now() FROM file_problems
    """)
    select_cols = ", ".join(
        {"source_file": "p.file AS source_file", "source_line": "p.line AS source_line"}.get(c, f'p."{c}"')
        for c in BASE_CALL_COLUMNS)
    derive.insert_calls(con, f"SELECT {select_cols}, p.tool_list FROM parsed p JOIN judged j USING (file, line) "
                             f"WHERE j.verdict = 'new'", has_tool_list=True)

    stats = {row[0]: row[1:] for row in con.execute("""
        WITH per_file AS (
          SELECT file,
            count(*) AS rows_read,
            count(*) FILTER (WHERE reason IS NULL AND verdict = 'new') AS loaded,
            count(*) FILTER (WHERE reason IS NULL AND verdict = 'duplicate') AS dup,
            count(*) FILTER (WHERE reason IS NOT NULL OR verdict LIKE 'conflict%') AS bad
          FROM parsed LEFT JOIN judged USING (file, line)
          GROUP BY file
        )
        SELECT file, rows_read, loaded, dup, bad FROM per_file
    """).fetchall()}
    problems = dict(con.execute("SELECT file, reason FROM file_problems").fetchall())
    for path, fmt, digest, fr in todo:
        read, loaded, dup, bad = stats.get(str(path), (0, 0, 0, 0))
        fr.rows_read, fr.rows_loaded, fr.rows_duplicate = int(read), int(loaded), int(dup)
        fr.rows_quarantined = int(bad) + (1 if str(path) in problems else 0)
        con.execute("INSERT INTO ingested_files VALUES (?, ?, ?, ?, ?, ?, ?, ?, now())",
                    [str(path), digest, path.stat().st_size, fmt, fr.rows_read, fr.rows_loaded,
                     fr.rows_duplicate, fr.rows_quarantined])
    report.first_reasons = [
        reason_line(file, line, reason) for file, line, reason in con.execute("""
            SELECT file, line, reason FROM (
              SELECT file, NULL::BIGINT AS line, reason FROM file_problems
              UNION ALL SELECT file, line, reason FROM parsed WHERE reason IS NOT NULL
              UNION ALL SELECT file, line, 'conflicting duplicate request_id ' || request_id
                FROM judged WHERE verdict LIKE 'conflict%')
            ORDER BY file, line NULLS FIRST LIMIT 10""").fetchall()]

    for t in ("parsed", "judged", "file_problems"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
