"""What every importer shares: the error type, walking a source tree, reading JSON with line
numbers, and turning other tools' timestamps into epoch seconds.

An importer turns one foreign trace format into *flat records* (log-format §1): one dict per LLM
call with the required fields it can ground in the source and nothing made up. A field the source
does not carry (say per-call token counts) is left out, never guessed.
"""
from __future__ import annotations

import gzip
import json
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

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        what = f" (field {self.field})" if self.field else ""
        return f"{where}: {self.reason}{what}"


def report(on_error: ErrorHandler | None, err: ImportFormatError) -> None:
    """Raise ``err`` (strict: no handler) or hand it to the handler and carry on."""
    if on_error is None:
        raise err
    on_error(err)


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
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                report(on_error, ImportFormatError(str(path), lineno, f"not valid JSON: {exc.msg} "
                                                   f"at column {exc.colno}"))


def load_json_document(path: Path) -> Any:
    """Parse a whole-file JSON document; a syntax error names the line it is on."""
    with open_text(path) as fh:
        text = fh.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImportFormatError(str(path), exc.lineno, f"not valid JSON: {exc.msg} at column {exc.colno}")


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
