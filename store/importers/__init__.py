"""Importers: other tools' traces -> our flat records (``docs/log-format.md`` §1).

Each module handles one format and exposes ``NAME``, ``SUMMARY``, ``FILE_PATTERNS`` (what to
look for in a folder) and ``read_file(path, **options) -> Iterator[dict]`` for one file;
:func:`iter_records` and :func:`convert` walk files and folders for all of them. Options every
importer accepts:

``workflow_type``  the ``workflow_type_id`` to give the records (each format has a default);
``timezone``       IANA zone for timestamps written without offset (default UTC);
``with_text``      keep prompts / responses when the source has them (default True);
``on_error``       a callable receiving each :class:`ImportFormatError` (file, line, field, reason);
                   when None the first problem is raised.

Importers ground every field in the source: a value the source does not hold (per-call token
counts, call times) is left out or the input is reported, never invented.

:func:`convert` writes the records as JSON Lines, one output file per input file, ready for
``profiler fit``; the ``profiler import`` command (and ``profiler fit --format``) is its
command-line face.
"""
from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Sequence

from store.importers import (aiperf_agentic, atif, claude_code, codex, dynamo, dynamo_agentic, mini_swe_agent,
                             openhands, otel, swe_agent, tracelab)
from store.importers._common import ImportFormatError, relative_source, source_files, unreadable_reason
from store.importers.detect import AUTO_PATTERNS, detect_format, part_of_conversation

#: Format name (as given to ``--format``) -> importer module.
FORMATS: dict[str, ModuleType] = {m.NAME: m for m in (otel, swe_agent, mini_swe_agent, openhands, dynamo, atif,
                                                      claude_code, codex, tracelab, dynamo_agentic,
                                                      aiperf_agentic)}
#: Other names a format is known by (``openinference`` -> ``otel``...).
ALIASES: dict[str, str] = {alias: m.NAME for m in FORMATS.values() for alias in getattr(m, "ALIASES", ())}

#: What reading one file may raise besides :class:`ImportFormatError`: it becomes that file's
#: one-line reason (binary or truncated input, JSON nested past the recursion limit, OS errors).
UNREADABLE = (RecursionError, UnicodeDecodeError, EOFError, OSError, ValueError, zlib.error, KeyError,
              TypeError, AttributeError, IndexError)

__all__ = ["FORMATS", "ALIASES", "ImportFormatError", "ConversionReport", "FileResult", "get_format",
           "iter_records", "convert", "convert_to_folder"]


def get_format(name: str) -> ModuleType:
    """The importer for ``name`` (``swe_agent`` and ``swe-agent`` are the same; aliases such as
    ``openinference`` name the module that reads them)."""
    key = name.strip().lower().replace("_", "-")
    module = FORMATS.get(ALIASES.get(key, key))
    if module is None:
        raise ValueError(f"unknown import format {name!r}; known formats: {', '.join(FORMATS)} "
                         f"(also: {', '.join(sorted(ALIASES))})")
    return module


def iter_records(fmt: str, src: Path, **options: Any) -> Iterator[dict]:
    """Flat records of ``src`` read as format ``fmt`` (or ``auto``: each file's own): the file
    itself, or every file under the folder that matches the format's ``FILE_PATTERNS``."""
    jobs = _jobs(fmt, [Path(src)])  # an unknown format fails here, not at the first record

    def records() -> Iterator[dict]:
        for _, path, module in jobs:
            if module is not None:
                yield from module.read_file(path, **options)
    return records()


def _jobs(fmt: str, srcs: Sequence[Path]) -> list[tuple[Path, Path, ModuleType | None]]:
    """(source argument, file, importer) for every file to read; with ``auto`` the importer is
    the detected one (None: no format recognised)."""
    auto = fmt.strip().lower() == "auto"
    module = None if auto else get_format(fmt)
    patterns = AUTO_PATTERNS if auto else module.FILE_PATTERNS
    jobs, seen = [], set()
    for src in map(Path, srcs):
        for path in source_files(src, patterns):
            if path.resolve() in seen or (auto and src.is_dir() and part_of_conversation(path)):
                continue
            seen.add(path.resolve())
            if auto:
                name = detect_format(path)
                jobs.append((src, path, FORMATS[name] if name else None))
            else:
                jobs.append((src, path, module))
    return jobs


@dataclass
class FileResult:
    """One source file's outcome: calls written, or why none; and the warnings it raised."""

    source: str
    fmt: str | None = None
    calls: int = 0
    output: str | None = None
    problems: list[ImportFormatError] = field(default_factory=list)
    warnings: list[ImportFormatError] = field(default_factory=list)

    @property
    def reason(self) -> str | None:
        """Why the file gave no calls (its first problem), None when it gave some."""
        if self.calls:
            return None
        if self.problems:
            p = self.problems[0]
            return p.reason + (f" (field {p.field})" if p.field else "")
        return "no LLM calls in it"

    def line(self) -> str:
        """``source: N calls`` or ``source: 0 calls - reason``, with problem/warning counts."""
        what = f" [{self.fmt}]" if self.fmt else ""
        text = (f"{self.source}{what}: {self.calls} calls" if self.calls
                else f"{self.source}{what}: 0 calls - {self.reason}")
        if self.calls and self.problems:
            text += f" ({len(self.problems)} parts skipped)"
        return text


@dataclass
class ConversionReport:
    """What :func:`convert` did: records written per output file, per source file, and the
    problems skipped."""

    files: dict[str, int] = field(default_factory=dict)  # output path -> records written
    sources: int = 0
    errors: list[ImportFormatError] = field(default_factory=list)
    warnings: list[ImportFormatError] = field(default_factory=list)
    per_file: list[FileResult] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(self.files.values())


def _output_name(rel: Path) -> Path:
    name = rel.name
    if name in ("base_state.json", "trajectory.json"):  # one per folder: name the output after it
        name = (rel.parent.name or "conversation") + ".json"
        rel = rel.parent if rel.parent.name else Path(name)
    for suffix in (".gz", ".jsonl", ".json", ".traj"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return rel.with_name(name + ".jsonl")


def _write_jsonl(records: Iterator[dict], dest: Path) -> int:
    """Write records to ``dest`` atomically (temp file then rename); nothing is left for zero records."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    n = 0
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
                fh.write("\n")
                n += 1
        if n:
            os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return n


def convert(fmt: str, srcs: Sequence[Path], out_dir: Path, *, strict: bool = False,
            progress: bool = False, **options: Any) -> ConversionReport:
    """Convert every ``fmt`` file under ``srcs`` into flat JSONL files under ``out_dir``, mirroring
    the source tree (``run1/x/x.traj`` -> ``out_dir/run1/x/x.jsonl``).

    Not strict (default): malformed parts are skipped and listed in the report's ``errors``, every
    valid record is written. Strict: the first problem raises :class:`ImportFormatError`.
    """
    out_dir = Path(out_dir)
    result = ConversionReport()
    jobs = _jobs(fmt, srcs)
    if not jobs:
        patterns = AUTO_PATTERNS if fmt.strip().lower() == "auto" else get_format(fmt).FILE_PATTERNS
        raise FileNotFoundError(f"no {fmt} files under {', '.join(map(str, srcs))} "
                                f"(looked for {', '.join(patterns)})")
    from rich.progress import Progress  # local: keeps `import store.importers` light

    with Progress(transient=True, disable=not progress) as bar:
        task = bar.add_task(f"importing {fmt}", total=len(jobs))
        for src, path, module in jobs:
            rel = relative_source(path, src)
            base = Path(src.name) if src.is_dir() and len(srcs) > 1 else Path()
            dest = out_dir / base / _output_name(rel)
            one = FileResult(str(path), fmt=module.NAME if module else None)
            if module is None:
                one.problems.append(ImportFormatError(str(path), None, "format not recognised (no marker of "
                                                      f"{', '.join(FORMATS)} in its first bytes)"))
                result.per_file.append(one)
                result.sources += 1
                bar.advance(task)
                continue

            def handler(err: ImportFormatError, one: FileResult = one) -> None:
                if err.warning:
                    one.warnings.append(err)
                    result.warnings.append(err)
                    return
                if strict:
                    raise err
                one.problems.append(err)
                result.errors.append(err)

            try:
                n = _write_jsonl(module.read_file(path, on_error=handler, **options), dest)
            except ImportFormatError:
                raise  # strict: the handler raised it
            except UNREADABLE as exc:  # one bad file never stops the others
                handler(ImportFormatError(str(path), None, unreadable_reason(exc)))
                n = 0
            if n:
                result.files[str(dest)] = n
                one.calls, one.output = n, str(dest)
            result.per_file.append(one)
            result.sources += 1
            bar.advance(task)
    return result


def convert_to_folder(fmt: str, srcs: list[Path], out_dir: Path, **options: Any) -> int:
    """:func:`convert`, returning only the number of records written (keyword options as
    there: ``strict``, ``workflow_type``, ``timezone``, ``with_text``)."""
    return convert(fmt, srcs, out_dir, **options).records
