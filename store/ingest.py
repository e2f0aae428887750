"""Load request logs into the DuckDB store: discover, stage, validate, deduplicate, derive.

Every heavy step is DuckDB's (Python only walks the folder tree): files whose content hash is
already stored are skipped, each record is staged with its file and line, one set-based query
(:mod:`store.record_sql`) sends invalid records to ``quarantine`` with file, line, field and
reason, duplicates by ``request_id`` are skipped or quarantined, and per-workflow columns are
derived (:mod:`store.derive`). One call of :func:`ingest` is one transaction, so a crash, a kill
or a full disk leaves the store as it was; input limits come from ``PROFILER_MAX_*`` variables
(:class:`Limits`). The pipeline, the transaction and the limits in full: docs/store.md,
"The ingest pipeline (store/ingest.py)".
"""
from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable, Sequence

import duckdb
import pandas as pd

from store import derive, faults, record_sql
from store.duckdb_store import BASE_CALL_COLUMNS, StoreError, execute, one_line_error, sql_string

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
MiB, GiB = 2**20, 2**30


@dataclass(frozen=True)
class Limits:
    """Input limits of one ingest (see the module docstring for the environment variables).

    ``max_line_bytes``: a longer line is quarantined alone. ``max_file_bytes``: a file whose
    (decompressed) content is larger is quarantined whole. ``max_gzip_ratio``: a ``.gz`` file
    decompressing to more than ``max(gzip_ratio_floor_bytes, ratio × compressed size)`` is
    quarantined whole (a gzip bomb: 2 MB that expand to gigabytes)."""

    max_line_bytes: int = 64 * MiB
    max_file_bytes: int = 16 * GiB
    max_gzip_ratio: float = 100.0
    gzip_ratio_floor_bytes: int = 64 * MiB

    @classmethod
    def from_env(cls) -> "Limits":
        """Defaults, overridden by ``PROFILER_MAX_LINE_BYTES``, ``PROFILER_MAX_FILE_BYTES`` and
        ``PROFILER_MAX_GZIP_RATIO`` when set."""
        def get(name: str, default: float, kind: type) -> float:
            raw = os.environ.get(name)
            if not raw:
                return default
            try:
                value = kind(float(raw))
            except ValueError:
                raise IngestError(f"{name}={raw!r} is not a number") from None
            if value <= 0:
                raise IngestError(f"{name} must be positive, got {raw}")
            return value
        d = cls()
        return cls(int(get("PROFILER_MAX_LINE_BYTES", d.max_line_bytes, int)),
                   int(get("PROFILER_MAX_FILE_BYTES", d.max_file_bytes, int)),
                   float(get("PROFILER_MAX_GZIP_RATIO", d.max_gzip_ratio, float)),
                   d.gzip_ratio_floor_bytes)


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


def discover_all(paths: Iterable[str | Path]) -> tuple[list[tuple[Path, str]], list[tuple[Path, Path]]]:
    """Every log file under ``paths`` (files or folder trees), sorted, with its format; and the
    symbolic links under a folder that lead outside it, as ``(link, target)`` (not followed).

    A link whose target stays inside the folder is read (once: files are keyed by their real
    path). A path named directly is read even when it is a link: the user chose it."""
    found: dict[Path, str] = {}
    outside: list[tuple[Path, Path]] = []
    for p in map(Path, paths):
        if not p.exists():
            raise IngestError(f"{p}: no such file or folder")
        if not p.is_dir():
            fmt = file_format(p)
            if fmt is None:
                raise IngestError(f"{p}: not a log file (expected one of {', '.join(SUFFIX_FORMATS)})")
            found[p.resolve()] = fmt
            continue
        root = p.resolve()
        for folder, dirs, names in os.walk(p, followlinks=False):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # hidden folders (.git)
            for name in [d for d in dirs if os.path.islink(os.path.join(folder, d))] + sorted(names):
                q = Path(folder) / name
                if name.startswith("."):
                    continue  # hidden files (editor swap files)
                if q.is_symlink():
                    target = q.resolve()
                    if not target.is_relative_to(root):
                        if q.is_dir() or file_format(q) is not None:
                            outside.append((q, target))
                        continue
                    if q.is_dir():
                        continue  # inside the folder: walked where it really is
                fmt = file_format(q)
                if fmt is not None and q.is_file():
                    found[q.resolve()] = fmt
    return sorted(found.items()), sorted(set(outside))


def discover(paths: Iterable[str | Path]) -> list[tuple[Path, str]]:
    """Every log file under ``paths`` (files or folder trees), sorted, with its format
    (links leading outside a folder are left out: :func:`discover_all`)."""
    return discover_all(paths)[0]


def sha256_of(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _gzip_size_problem(fh: BinaryIO, compressed: int, limits: Limits, digest: "hashlib._Hash",
                       ) -> tuple[str | None, int | None]:
    """Hash the gzip file ``fh`` into ``digest`` while counting its decompressed size and lines (in
    1 MiB pieces, never holding more); ``(the limit it passes or None, number of lines or None
    when unknown)``. Damage is not judged here (staging keeps what comes before it)."""
    allowed = min(limits.max_file_bytes, max(limits.gzip_ratio_floor_bytes, int(limits.max_gzip_ratio * compressed)))
    total, newlines, last, problem, dec = 0, 0, b"\n", None, zlib.decompressobj(31)
    while chunk := fh.read(MiB):
        digest.update(chunk)
        data = chunk
        while problem is None and dec is not None and data:
            try:
                out = dec.decompress(data, MiB)
            except zlib.error:
                dec = None
                break
            total += len(out)
            newlines += out.count(b"\n")
            last = out[-1:] or last
            data = dec.unconsumed_tail
            if dec.eof:  # next gzip member (concatenated .gz files)
                data, dec = dec.unused_data, (zlib.decompressobj(31) if dec.unused_data else dec)
            if total > allowed:
                which = ("PROFILER_MAX_FILE_BYTES" if allowed == limits.max_file_bytes
                         else "PROFILER_MAX_GZIP_RATIO")
                problem = (f"decompresses to more than {allowed:,} bytes from {compressed:,} "
                           f"(limit; raise {which} to read it)")
    complete = dec is not None and dec.eof and problem is None
    return problem, (newlines + (last != b"\n") if complete else None)


def scan_file(path: Path, fmt: str, limits: Limits) -> tuple[str, str | None, int | None]:
    """Content hash of ``path``, the size limit it breaks (or None), and its number of lines
    (JSONL; None when unknown) — one streaming pass. The line count checks that DuckDB's reader
    returned every line: it skips a line longer than its buffer without a word."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        if path.name.lower().endswith(".gz"):
            problem, lines = _gzip_size_problem(fh, size, limits, digest)
            while chunk := fh.read(MiB):
                digest.update(chunk)
            return digest.hexdigest(), problem, lines
        if size > limits.max_file_bytes:
            return sha256_of(path), (f"file is {size:,} bytes, over the limit {limits.max_file_bytes:,} "
                                     f"(raise PROFILER_MAX_FILE_BYTES to read it)"), None
        newlines, last = 0, b"\n"
        count = fmt == "jsonl"
        while chunk := fh.read(4 * MiB):
            digest.update(chunk)
            if count:
                newlines += chunk.count(b"\n")
            last = chunk[-1:]
    return digest.hexdigest(), None, (newlines + (last != b"\n") if count else None)


def _fallback_lines(fh: BinaryIO, limit: int) -> Iterable[tuple[int, str | None, int]]:
    """``(line number, text, length)`` for every line of ``fh``; text None for a line longer
    than ``limit`` bytes, which is skipped without being held in memory."""
    n = 0
    while True:
        raw = fh.readline(limit + 1)
        if not raw:
            return
        n += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            length = len(raw)
            while raw and not raw.endswith(b"\n"):  # skip the rest of the line
                raw = fh.readline(MiB)
                length += len(raw)
            yield n, None, length
            continue
        yield n, raw.decode("utf-8", errors="replace").rstrip("\r\n"), len(raw)


def _stage_jsonl_python(con: duckdb.DuckDBPyConnection, path: Path, fmt: str, table: str,
                        limits: Limits) -> str | None:
    """Line-by-line fallback for files DuckDB could not read to the end.

    Keeps every line read before the damage (inserted in chunks of at most ~64 MiB); lines over
    the limit go to ``line_problems``. Returns a description of the damage (or None)."""
    opener = gzip.open if fmt == "jsonl.gz" else open
    batch: list[tuple[int, str]] = []
    held, read = 0, 0
    damage = None

    def flush() -> None:
        nonlocal held
        if batch:
            df = pd.DataFrame(batch, columns=["line", "text"])
            df.insert(0, "file", str(path))
            con.register("_fallback_lines", df)
            execute(con, f"INSERT INTO {table} SELECT file, line, text FROM _fallback_lines")
            con.unregister("_fallback_lines")
            batch.clear()
        held = 0

    try:
        with opener(path, "rb") as fh:
            for n, text, length in _fallback_lines(fh, limits.max_line_bytes):
                read = n
                if text is None:
                    execute(con, "INSERT INTO line_problems VALUES (?, ?, ?, NULL)",
                            [str(path), n, _too_long(length, limits)])
                    continue
                batch.append((n, text))
                held += length
                if held > 64 * MiB or len(batch) >= 100_000:
                    flush()
    except (EOFError, OSError, zlib.error) as exc:
        damage = f"file is damaged after line {read} ({type(exc).__name__}: {exc}); " \
                 f"the {read} lines before it were read"
    flush()
    return damage


def _too_long(length: int | str, limits: Limits) -> str:
    return (f"line of {length} bytes is longer than the limit {limits.max_line_bytes:,} "
            f"(raise PROFILER_MAX_LINE_BYTES to read it)")


def _read_rejects(con: duckdb.DuckDBPyConnection, path: Path, table: str, first_line: int,
                  limits: Limits) -> None:
    """After a DuckDB CSV scan with ``store_rejects``: quarantine each rejected line alone
    (``line_problems``) and renumber the staged rows of ``table`` (numbered 1, 2, … over the
    accepted rows only) with their real line numbers."""
    if not execute(con, "SELECT 1 FROM _rejects LIMIT 1").fetchall():
        return
    execute(con, f"""
        INSERT INTO line_problems
        SELECT {sql_string(path)}, line,
          CASE WHEN error_type = 'LINE SIZE OVER MAXIMUM'
               THEN 'line of ' || coalesce(regexp_extract(error_message, 'Actual Size:\\s*(\\d+)', 1), '?')
                    || ' bytes is longer than the limit {limits.max_line_bytes:,} (raise PROFILER_MAX_LINE_BYTES to read it)'
               ELSE 'unreadable line (' || lower(error_type) || '): ' || error_message END,
          left(csv_line, 2000)
        FROM (SELECT line, first(error_type ORDER BY column_idx) AS error_type,
                     first(error_message ORDER BY column_idx) AS error_message, first(csv_line) AS csv_line
              FROM _rejects GROUP BY line)
    """)
    # Accepted row k sits after the j-th rejected line r_j iff fewer than k accepted rows precede
    # r_j, i.e. (r_j - first_line) - (j - 1) < k; its line is k + first_line - 1 + (that many j).
    execute(con, f"""
        UPDATE {table} s SET line = m.real_line FROM (
          SELECT a.line AS k, a.line + coalesce(r.j, 0) AS real_line
          FROM (SELECT line FROM {table}) a
          ASOF LEFT JOIN (
            SELECT max(j) AS j, before FROM (
              SELECT row_number() OVER (ORDER BY line) AS j,
                     line - {first_line} - (row_number() OVER (ORDER BY line) - 1) AS before
              FROM (SELECT DISTINCT line FROM _rejects)) GROUP BY before
          ) r ON a.line - {first_line - 1} > r.before
        ) m WHERE s.line = m.k
    """)


_REJECTS = "store_rejects=true, rejects_table='_rejects', rejects_scan='_rejects_scan'"


def _stage_file(con: duckdb.DuckDBPyConnection, path: Path, fmt: str, table: str = "staging",
                limits: Limits | None = None, expected_lines: int | None = None) -> str | None:
    """Append the file's records to ``table`` (file, line, text); returns a whole-file problem or
    None. Lines DuckDB rejects go to the ``line_problems`` temp table (created when missing).
    ``expected_lines`` (JSONL): when DuckDB returns another number of lines, the file is read
    again by the bounded Python reader."""
    limits = limits or Limits.from_env()
    src = sql_string(path)
    execute(con, "CREATE TEMP TABLE IF NOT EXISTS line_problems (file VARCHAR, line BIGINT, reason VARCHAR, raw VARCHAR)")
    for t in ("_rejects", "_rejects_scan"):
        execute(con, f"DROP TABLE IF EXISTS {t}")
    if fmt in ("jsonl", "jsonl.gz"):
        try:
            execute(con, f"""
                INSERT INTO {table}
                SELECT {src}, row_number() OVER (), line_text
                FROM read_csv({src}, columns={{'line_text': 'VARCHAR'}}, header=false, delim='\\x1f',
                              quote='', escape='', auto_detect=false, strict_mode=false,
                              null_padding=false, max_line_size={limits.max_line_bytes},
                              buffer_size={max(2 * limits.max_line_bytes, 32 * MiB)}, {_REJECTS})
            """)
            if expected_lines is not None and execute(con, f"""
                    SELECT (SELECT count(*) FROM {table} WHERE file = {src})
                         + (SELECT count(DISTINCT line) FROM _rejects)""").fetchone()[0] != expected_lines:
                raise duckdb.InvalidInputException("lines missing from the CSV reader's output")
            _read_rejects(con, path, table, 1, limits)
            return None
        except duckdb.Error:
            execute(con, f"DELETE FROM {table} WHERE file = {src}")
            execute(con, f"DELETE FROM line_problems WHERE file = {src}")
            return _stage_jsonl_python(con, path, fmt, table, limits)
    try:
        if fmt == "parquet":
            execute(con, f"INSERT INTO {table} SELECT {src}, row_number() OVER (), to_json(t)::VARCHAR "
                         f"FROM read_parquet({src}) t")
        else:  # csv: first line is the header, so data line n is file line n + 1
            execute(con, f"INSERT INTO {table} SELECT {src}, row_number() OVER () + 1, to_json(t)::VARCHAR "
                         f"FROM read_csv({src}, all_varchar=true, header=true, "
                         f"max_line_size={limits.max_line_bytes}, "
                         f"buffer_size={max(2 * limits.max_line_bytes, 32 * MiB)}, {_REJECTS}) t")
            _read_rejects(con, path, table, 2, limits)
    except duckdb.Error as exc:
        execute(con, f"DELETE FROM {table} WHERE file = {src}")
        execute(con, f"DELETE FROM line_problems WHERE file = {src}")
        return f"unreadable {fmt} file: {str(exc).splitlines()[0]}"
    return None


def ingest(
    con: duckdb.DuckDBPyConnection,
    paths: Sequence[str | Path],
    *,
    strict: bool = False,
    progress: bool = False,
    limits: Limits | None = None,
) -> IngestReport:
    """Load every log file under ``paths`` into the store behind ``con``, as one transaction.

    Returns an :class:`IngestReport`; with ``strict`` raises :class:`IngestError` (after
    committing the valid records) when any record was quarantined. A full disk, a read-only
    store or a lock conflict roll the batch back and raise :class:`store.duckdb_store.StoreError`.
    When the caller already holds a transaction on ``con``, the batch joins it (the caller
    commits)."""
    limits = limits or Limits.from_env()
    files, links = discover_all(paths)
    if not files and not links:
        raise IngestError("no log files found under " + ", ".join(map(str, paths))
                          + f" (looked for {', '.join(SUFFIX_FORMATS)})")
    try:
        # Reading touches temp tables only (no transaction: a file DuckDB cannot read fails its
        # own statement, and DuckDB has no savepoints to survive that inside a transaction).
        report, todo = _stage_batch(con, files, links, limits, progress)
        own = _begin(con)
        try:
            if todo:
                _load_staged(con, report, todo)
            if own:
                execute(con, "COMMIT")
                faults.point("committed")
        except BaseException:
            if own:
                try:
                    con.execute("ROLLBACK")
                except duckdb.Error:
                    pass  # the connection is dead (fatal error): nothing was committed
            raise
    except (OSError, duckdb.Error) as exc:
        message = one_line_error(exc)
        if message is not None:
            raise StoreError(message) from exc
        raise
    finally:
        for t in ("staging", "file_problems", "line_problems"):
            try:
                con.execute(f"DROP TABLE IF EXISTS {t}")
            except duckdb.Error:
                pass
    if strict and report.quarantined:
        raise IngestError(
            f"{report.quarantined} records quarantined (strict mode); first reasons:\n  "
            + "\n  ".join(report.first_reasons))
    return report


def _begin(con: duckdb.DuckDBPyConnection) -> bool:
    """Start a transaction; False when one is already open (the caller's)."""
    try:
        execute(con, "BEGIN TRANSACTION")
        return True
    except duckdb.TransactionException:
        return False


def _stage_batch(con: duckdb.DuckDBPyConnection, files: list[tuple[Path, str]],
                 links: list[tuple[Path, Path]], limits: Limits, progress: bool,
                 ) -> tuple[IngestReport, list[tuple[Path, str, str | None, FileReport]]]:
    """Read every new file into the temp tables ``staging``, ``file_problems`` and
    ``line_problems`` (nothing in the store changes); the report and the files to load."""
    report = IngestReport()
    known = {r[0] for r in execute(con, "SELECT sha256 FROM ingested_files").fetchall()}
    execute(con, f"CREATE OR REPLACE TEMP TABLE staging {STAGING_COLUMNS}")
    execute(con, "CREATE OR REPLACE TEMP TABLE file_problems (file VARCHAR, reason VARCHAR)")
    execute(con, "CREATE OR REPLACE TEMP TABLE line_problems (file VARCHAR, line BIGINT, reason VARCHAR, raw VARCHAR)")
    todo: list[tuple[Path, str, str | None, FileReport]] = []
    staged = False  # whether a file was staged yet (``staging`` holds only its rows until then)
    for link, target in links:
        fr = FileReport(str(link), "link", rows_quarantined=1)
        report.files.append(fr)
        execute(con, "INSERT INTO file_problems VALUES (?, ?)",
                [str(link), f"symbolic link to {target}, outside the log folder: not followed"])
        todo.append((link, "link", None, fr))

    from rich.progress import Progress  # local: keeps `import profiler` light

    with Progress(transient=True, disable=not progress) as bar:
        task = bar.add_task("reading logs", total=len(files))
        for path, fmt in files:
            fr = FileReport(str(path), fmt)
            report.files.append(fr)
            digest, problem, lines = scan_file(path, fmt, limits)
            if digest in known:
                fr.skipped = True
            else:
                known.add(digest)
                if problem is not None:
                    digest = None  # over a limit: not recorded as ingested, retried next time
                elif path.stat().st_size == 0:
                    problem = "empty file: no records"
                else:  # staged alone first, so the emptiness check never scans other files;
                    # the first file goes straight into the empty ``staging`` (a batch of one file
                    # is not copied again: 1M records, ~0.5 GB of text), the others are appended
                    alone = "staging_file" if staged else "staging"
                    if staged:
                        execute(con, f"CREATE OR REPLACE TEMP TABLE staging_file {STAGING_COLUMNS}")
                    problem = _stage_file(con, path, fmt, alone, limits, lines)
                    if problem is None and not execute(con,
                            f"SELECT 1 FROM {alone} WHERE {record_sql.NON_BLANK} LIMIT 1").fetchall() \
                            and not execute(con, "SELECT 1 FROM line_problems WHERE file = ? LIMIT 1",
                                            [str(path)]).fetchall():
                        problem = "empty file: no records"
                    if staged:
                        execute(con, "INSERT INTO staging SELECT * FROM staging_file")
                        execute(con, "DROP TABLE staging_file")
                    staged = True
                if problem:
                    execute(con, "INSERT INTO file_problems VALUES (?, ?)", [str(path), problem])
                todo.append((path, fmt, digest, fr))
            bar.advance(task)
    return report, todo


def _load_staged(con: duckdb.DuckDBPyConnection, report: IngestReport,
                 todo: list[tuple[Path, str, str | None, FileReport]]) -> None:
    """Validate, deduplicate and store everything in ``staging``; fill the file reports.

    ``todo`` entries with no digest (a file over a limit, a link leading outside) get no
    ``ingested_files`` row: they are looked at again by the next ingest."""
    execute(con, f"CREATE OR REPLACE TEMP TABLE parsed AS {record_sql.parse_sql('staging')}")
    # Duplicates: within this batch (first occurrence by file, line wins) and against the store.
    # ``judged`` holds the valid records that are *not* new (usually none): request ids seen
    # twice are found by a hash aggregate and only those rows are ranked, so the million-row
    # sort a window over every record would need is not done; every other valid record is new.
    execute(con, """
        CREATE OR REPLACE TEMP TABLE judged AS
        WITH valid AS (
          SELECT file, line, request_id, content_hash FROM parsed WHERE reason IS NULL
        ),
        repeated AS (
          SELECT request_id FROM valid GROUP BY request_id HAVING count(*) > 1
        ),
        ranked AS (
          SELECT file, line,
            row_number() OVER w AS rn,
            first_value(content_hash) OVER w AS first_hash,
            first_value(file || ':' || line) OVER w AS first_at
          FROM valid SEMI JOIN repeated USING (request_id)
          WINDOW w AS (PARTITION BY request_id ORDER BY file, line)
        ),
        stored AS (
          SELECT request_id, content_hash, source_file || ':' || source_line AS stored_at
          FROM calls SEMI JOIN valid USING (request_id)
        )
        SELECT v.file, v.line, v.request_id, r.first_at,
          CASE
            WHEN c.request_id IS NOT NULL AND c.content_hash = v.content_hash THEN 'duplicate'
            WHEN c.request_id IS NOT NULL THEN 'conflict_store'
            WHEN rn > 1 AND v.content_hash = first_hash THEN 'duplicate'
            ELSE 'conflict_batch'
          END AS verdict,
          c.stored_at
        FROM valid v LEFT JOIN ranked r USING (file, line) LEFT JOIN stored c USING (request_id)
        WHERE c.request_id IS NOT NULL OR rn > 1
    """)
    # Idempotent: a (file, line, reason) already in quarantine (the file was read before, e.g.
    # it grew, or a limit keeps rejecting it) is not added again.
    execute(con, """
        INSERT INTO quarantine
        SELECT DISTINCT ON (n.file, n.line, n.reason) n.* FROM (
          SELECT file, line, field, reason, raw, now() AS ingested_at FROM parsed WHERE reason IS NOT NULL
          UNION ALL
          SELECT j.file, j.line, 'request_id',
            'conflicting duplicate request_id ' || j.request_id || ': different content from the record at '
              || CASE WHEN verdict = 'conflict_store' THEN stored_at || ' (already stored)' ELSE first_at END,
            left(s.text, 2000), now()
          FROM judged j JOIN staging s USING (file, line) WHERE verdict IN ('conflict_store', 'conflict_batch')
          UNION ALL
          SELECT file, line, NULL, reason, raw, now() FROM line_problems
          UNION ALL
          SELECT file, NULL, NULL, reason, NULL, now() FROM file_problems
        ) n
        WHERE NOT EXISTS (SELECT 1 FROM quarantine q WHERE q.file = n.file
                          AND q.line IS NOT DISTINCT FROM n.line AND q.reason = n.reason)
        ORDER BY n.file, n.line NULLS FIRST
    """)
    select_cols = ", ".join(
        {"source_file": "p.file AS source_file", "source_line": "p.line AS source_line"}.get(c, f'p."{c}"')
        for c in BASE_CALL_COLUMNS)
    # new: valid and not judged (an anti join with the few judged rows; read by the derive step
    # through a view, so the wide rows are copied once, into ``calls``)
    derive.insert_calls(con, f"SELECT {select_cols}, p.tool_list FROM parsed p ANTI JOIN judged j USING (file, line) "
                             f"WHERE p.reason IS NULL", has_tool_list=True, materialize=False)

    stats = {row[0]: row[1:] for row in execute(con, """
        WITH per_file AS (
          SELECT file,
            count(*) AS rows_read,
            count(*) FILTER (WHERE reason IS NULL AND verdict IS NULL) AS loaded,
            count(*) FILTER (WHERE reason IS NULL AND verdict = 'duplicate') AS dup,
            count(*) FILTER (WHERE reason IS NOT NULL OR verdict LIKE 'conflict%') AS bad
          FROM parsed LEFT JOIN judged USING (file, line)
          GROUP BY file
          UNION ALL SELECT file, count(*), 0, 0, count(*) FROM line_problems GROUP BY file
        )
        SELECT file, sum(rows_read), sum(loaded), sum(dup), sum(bad) FROM per_file GROUP BY file
    """).fetchall()}
    problems = dict(execute(con, "SELECT file, reason FROM file_problems").fetchall())
    for path, fmt, digest, fr in todo:
        if fmt == "link":
            continue
        read, loaded, dup, bad = stats.get(str(path), (0, 0, 0, 0))
        fr.rows_read, fr.rows_loaded, fr.rows_duplicate = int(read), int(loaded), int(dup)
        fr.rows_quarantined = int(bad) + (1 if str(path) in problems else 0)
        if digest is not None:
            execute(con, "INSERT INTO ingested_files VALUES (?, ?, ?, ?, ?, ?, ?, ?, now())",
                    [str(path), digest, path.stat().st_size, fmt, fr.rows_read, fr.rows_loaded,
                     fr.rows_duplicate, fr.rows_quarantined])
    report.first_reasons = [
        reason_line(file, line, reason) for file, line, reason in execute(con, """
            SELECT file, line, reason FROM (
              SELECT file, NULL::BIGINT AS line, reason FROM file_problems
              UNION ALL SELECT file, line, reason FROM line_problems
              UNION ALL SELECT file, line, reason FROM parsed WHERE reason IS NOT NULL
              UNION ALL SELECT file, line, 'conflicting duplicate request_id ' || request_id
                FROM judged WHERE verdict LIKE 'conflict%')
            ORDER BY file, line NULLS FIRST LIMIT 10""").fetchall()]

    for t in ("parsed", "judged"):
        execute(con, f"DROP TABLE IF EXISTS {t}")
