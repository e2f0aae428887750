"""What every importer shares: the error type, walking a source tree, reading JSON with line
numbers, and turning other tools' timestamps into epoch seconds.

An importer turns one foreign trace format into *flat records* (log-format §1): one dict per LLM
call with the required fields it can ground in the source and nothing made up. A field the source
does not carry (say per-call token counts) is left out, never guessed.
"""
from __future__ import annotations

import gzip
import json
import warnings
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone as dt_timezone
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

#: Called with each problem found when the caller wants to skip bad input instead of stopping.
ErrorHandler = Callable[["ImportFormatError"], None]


@dataclass
class ImportFormatError(ValueError):
    """Input that does not have the shape of its format: names the file, line and field."""

    file: str
    line: int | None
    reason: str
    field: str | None = None
    #: A warning (e.g. "times look shifted by +08:00") keeps every record; it never stops an import.
    warning: bool = False

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        what = f" (field {self.field})" if self.field else ""
        return f"{where}: {self.reason}{what}"


def report(on_error: ErrorHandler | None, err: ImportFormatError) -> None:
    """Raise ``err`` (strict: no handler) or hand it to the handler and carry on. A warning is
    handed to the handler when there is one and otherwise goes to :mod:`warnings`: never raised."""
    if on_error is None:
        if err.warning:
            warnings.warn(str(err), stacklevel=2)
            return
        raise err
    on_error(err)


def warn(on_error: ErrorHandler | None, file: Path | str, reason: str, line: int | None = None,
         field: str | None = None) -> None:
    """Report a warning about ``file`` (see :func:`report`)."""
    report(on_error, ImportFormatError(str(file), line, reason, field, warning=True))


#: ``timing`` values a record may carry (log-format extra field; the fit reads them):
#: ``synthetic_order``  the source has no times: t_arrival = t_finish = the call's position
#:                      (0, 1, 2 ... per workflow); only order and token counts are real.
#: ``created_only``     one real timestamp per call (t_arrival = t_finish): gaps between calls
#:                      are real, call durations are not known.
TIMING_ORDER_ONLY = "synthetic_order"
TIMING_ONE_STAMP = "created_only"


def number_in_order(records: list[dict]) -> list[dict]:
    """Give the calls of one workflow, already in order, their positions as times and flag them
    ``timing = synthetic_order`` (no time is invented: position ``k`` is "the k-th call")."""
    for k, rec in enumerate(records):
        rec["t_arrival"] = rec["t_finish"] = float(k)
        rec["timing"] = TIMING_ORDER_ONLY
    return records


def count_field(value: Any) -> int | None:
    """A token count from a source (int, integral float or digit string); None when absent or
    not a non-negative integer."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        value = value.strip().replace(",", "")
        if not value.isdigit():
            return None
        return int(value)
    if isinstance(value, (int, float)) and value >= 0 and value == int(value):
        return int(value)
    return None


def iter_json_values(text: str) -> Iterator[tuple[int, Any]]:
    """(1-based line, value) of every JSON value in ``text``: one document, JSON Lines, or
    pretty-printed objects written one after another (what OpenTelemetry's ConsoleSpanExporter
    prints). Raises :class:`json.JSONDecodeError` at the first text that is not JSON."""
    decoder = json.JSONDecoder()
    pos, n, line, counted = 0, len(text), 1, 0
    while True:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n:
            return
        value, end = decoder.raw_decode(text, pos)
        line += text.count("\n", counted, pos)
        counted = pos
        yield line, value
        pos = end


def source_files(src: Path, patterns: Iterable[str]) -> list[Path]:
    """``src`` itself when it is a file, else every file under it matching one of ``patterns``
    (recursive, sorted, hidden files and folders skipped)."""
    src = Path(src)
    if not src.exists():
        raise FileNotFoundError(f"{src}: no such file or folder")
    if src.is_file():
        return [src]
    found: set[Path] = set()
    for pattern in patterns:
        for p in src.rglob(pattern):
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(src).parts):
                found.add(p)
    return sorted(found)


def open_text(path: Path) -> IO[str]:
    """Open a text file, transparently gunzipping ``*.gz``."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def iter_json_lines(path: Path, on_error: ErrorHandler | None) -> Iterator[tuple[int, Any]]:
    """(1-based line number, parsed value) for every non-blank line of a JSON Lines file;
    a line that is not JSON is reported with its number and skipped."""
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                report(on_error, ImportFormatError(str(path), lineno, f"not valid JSON: {exc.msg} "
                                                   f"at column {exc.colno}"))
                continue
            except RecursionError:
                report(on_error, ImportFormatError(str(path), lineno, TOO_DEEP))
                continue
            yield lineno, value


def load_json_document(path: Path) -> Any:
    """Parse a whole-file JSON document; a syntax error names the line it is on."""
    with open_text(path) as fh:
        text = fh.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImportFormatError(str(path), exc.lineno, f"not valid JSON: {exc.msg} at column {exc.colno}")
    except RecursionError:
        raise ImportFormatError(str(path), None, TOO_DEEP) from None


#: Why a JSON value nested past the parser's recursion limit is skipped (no trace format nests
#: more than a few dozen levels).
TOO_DEEP = "JSON nested too deep to read (thousands of levels): not a trace"


def unreadable_reason(exc: BaseException) -> str:
    """A one-line reason for a file that could not be read at all (binary, truncated gzip,
    nesting past the recursion limit, an OS error)."""
    if isinstance(exc, RecursionError):
        return TOO_DEEP
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): a binary file?"
    if isinstance(exc, (EOFError, gzip.BadGzipFile, zlib.error)):
        return f"not a readable gzip file ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'truncated'})"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"cannot read it ({type(exc).__name__}{': ' + text if text else ''})"


def resolve_timezone(name: str | None) -> dt_timezone | ZoneInfo:
    """The time zone in which naive timestamps (no offset) of a source are read; default UTC."""
    if not name or name.upper() == "UTC":
        return dt_timezone.utc
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {name!r} (use an IANA name such as Europe/Paris)") from exc


def iso_to_epoch(text: str, tz: dt_timezone | ZoneInfo) -> float:
    """ISO 8601 text -> epoch seconds; a timestamp without offset is read in ``tz``."""
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=tz)
    return t.timestamp()


def relative_source(path: Path, root: Path) -> Path:
    """``path`` relative to the folder given on the command line (its name when it is a file)."""
    root = Path(root)
    if root.is_file():
        return Path(path.name)
    return path.relative_to(root)


def first_word(command: str) -> str | None:
    """The program name of a shell-ish command line (``"grep -rn x ."`` -> ``"grep"``)."""
    words = command.strip().split()
    return words[0] if words else None
