"""Rotating JSON Lines log of completed calls, in the gateway-record shape (log-format §2).

The gateway hands each completed call to :meth:`GatewayLog.write`, which only appends it to a
list: a background thread wakes every ``batch_s`` (or at once for a rotation or the shutdown),
takes every record queued since, encodes them (orjson; the standard library's encoder for what
orjson cannot write exactly) and writes them with one ``write``. So a request never pays for
the disk, the encoding, or waking a thread: under load the log costs the event loop one
``list.append`` per call.

Files are written under a name the ingester ignores (``gateway-<UTC time>-<pid>-<n>.jsonl.open``)
and renamed to ``….jsonl`` when closed — on rotation (size or age limit) and at shutdown. So
``profiler fit LOGDIR`` (and the online refit) only ever read complete files, never a
half-written last line, and read them unchanged: each line is a gateway record
``{"request_id", "t_arrival", "t_first_token", "t_finish", "request": {…, "app_metadata": …},
"response": {"choices": [...], "usage": {...}}}`` plus our extra keys (``sys_annotations``,
``upstream``, ``gateway``), which the ingester keeps as unknown extras.

**Crash recovery.** A gateway killed with ``kill -9`` leaves its ``….jsonl.open`` file behind,
which ``fit`` would skip forever. At start, :func:`recover_orphans` closes every such file whose
writer process is gone: its complete lines are kept, a torn last line (no newline: the write the
kill interrupted) is cut off and counted, and the file is renamed to ``….jsonl`` so the next
refit reads it.

**What reached disk.** Each batch of whole lines is written with one unbuffered ``write``;
``records_written`` (and the ``on_written`` callback, which feeds the gateway's
``log_records_total{outcome="written"}``) counts records only once that write returned. A
failed write (full disk) is cut back off the file so no torn line stays, and counted in
``write_errors`` (every record of that write). A record orjson cannot write exactly (an
integer beyond 64 bits, a lone surrogate, one marked as leniently parsed that may hold ``NaN``)
goes to the standard library's encoder, which refuses ``NaN`` and lone surrogates
(``encode_errors``) rather than writing something else.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable

import orjson

log = logging.getLogger(__name__)

OPEN_SUFFIX = ".jsonl.open"
CLOSED_SUFFIX = ".jsonl"


def _writer_alive(path: Path) -> bool:
    """True when the pid in ``<prefix>-<stamp>-<pid>-<n>.jsonl.open`` is a live process other
    than this one (another gateway sharing the folder)."""
    parts = path.name[: -len(OPEN_SUFFIX)].rsplit("-", 2)
    try:
        pid = int(parts[-2])
    except (IndexError, ValueError):
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_orphans(directory: str | Path) -> tuple[int, int]:
    """Close the ``*.jsonl.open`` files under ``directory`` left by a writer that died.

    Returns ``(files recovered, torn last lines dropped)``. Complete lines are kept byte for
    byte; an empty file is removed.
    """
    files = torn = 0
    for path in sorted(Path(directory).glob("*" + OPEN_SUFFIX)):
        if not path.is_file() or path.is_symlink() or _writer_alive(path):
            continue
        try:
            with open(path, "r+b") as fh:
                size = fh.seek(0, os.SEEK_END)
                keep = size
                if size:
                    # find the last newline, reading backwards in blocks
                    pos, block = size, 1 << 16
                    keep = 0
                    while pos > 0:
                        start = max(0, pos - block)
                        fh.seek(start)
                        chunk = fh.read(pos - start)
                        i = chunk.rfind(b"\n")
                        if i >= 0:
                            keep = start + i + 1
                            break
                        pos = start
                    if keep < size:
                        torn += 1
                        fh.truncate(keep)
                        fh.flush()
                        os.fsync(fh.fileno())
            if keep == 0:
                path.unlink()
                continue
            os.replace(path, path.with_name(path.name[: -len(OPEN_SUFFIX)] + CLOSED_SUFFIX))
            files += 1
            log.warning("gateway log: recovered %s left open by a writer that died%s", path.name,
                        " (torn last line dropped)" if keep < size else "")
        except OSError as exc:
            log.error("gateway log: could not recover %s: %s", path, exc)
    return files, torn


class GatewayLog:
    """Background JSONL writer with size/age rotation.

    ``max_bytes``: rotate once the open file reaches this size; ``max_age_s``: rotate a non-empty
    file this long after it was opened (bounds how stale the logs the refit sees can be).
    """

    def __init__(self, directory: str | Path, *, max_bytes: int = 64 << 20, max_age_s: float = 300.0,
                 prefix: str = "gateway", flush_every_s: float = 0.5, batch_s: float = 0.02,
                 on_written: Callable[[int], None] | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.on_written = on_written
        self.recovered_files, self.recovered_torn_lines = recover_orphans(self.directory)
        self.max_bytes = int(max_bytes)
        self.max_age_s = float(max_age_s)
        self.prefix = prefix
        self.flush_every_s = flush_every_s
        self.records_written = 0
        self.files_closed = 0
        self.write_errors = 0
        self.encode_errors = 0
        self.batch_s = float(batch_s)   # how long a record may wait for the writer thread
        self._pending: deque = deque()  # (kind, item): appended by producers, taken by the writer
        self._wake = threading.Event()  # set for rotations and the stop: no waiting for a batch
        self._fh = None
        self._path: Path | None = None
        self._opened_at = 0.0
        self._size = 0
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name="gateway-log", daemon=True)
        self._thread.start()

    # -- producer side (any thread / the event loop) -------------------------------------------
    def write(self, record: dict, exact: bool = True) -> None:
        """Queue one record for writing (never blocks, never wakes a thread: the writer takes it
        within ``batch_s``). ``exact=False``: the record holds values parsed leniently (NaN,
        huge numbers), so it is encoded by the standard library, which refuses what JSON cannot
        hold instead of writing ``null``."""
        self._pending.append(("record" if exact else "record_lenient", record))

    def rotate(self, wait: bool = True, timeout: float = 10.0) -> None:
        """Close the current file now (so a refit sees it); optionally wait until done."""
        done = threading.Event()
        self._pending.append(("rotate", done))
        self._wake.set()
        if wait:
            done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write everything queued, close (rename) the file and stop the thread."""
        if self._thread.is_alive():
            self._pending.append(("stop", None))
            self._wake.set()
            self._thread.join(timeout)

    # -- writer thread --------------------------------------------------------------------------
    def _open(self) -> None:
        self._seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self._path = self.directory / f"{self.prefix}-{stamp}-{os.getpid()}-{self._seq:04d}{OPEN_SUFFIX}"
        self._fh = open(self._path, "ab", buffering=0)  # one write per record: counted when done
        self._opened_at = time.monotonic()
        self._size = 0

    def _close_file(self) -> None:
        if self._fh is None:
            return
        self._fh.close()
        self._fh = None
        assert self._path is not None
        if self._size == 0:
            self._path.unlink(missing_ok=True)
        else:
            final = self._path.with_name(self._path.name[: -len(OPEN_SUFFIX)] + CLOSED_SUFFIX)
            os.replace(self._path, final)
            self.files_closed += 1
        self._path = None

    def _encode(self, record: dict, exact: bool) -> bytes | None:
        """One record as a JSON line, or None (counted) when it cannot be written as JSON."""
        if exact:
            try:
                return orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE)
            except orjson.JSONEncodeError:
                pass   # an int beyond 64 bits, a lone surrogate, too deep: the exact encoder says
        try:
            return (json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
                    + "\n").encode("utf-8")
        except (ValueError, TypeError, RecursionError) as exc:  # NaN, a lone surrogate, too deep
            self.encode_errors += 1
            log.warning("gateway log: record %s not written: %s", record.get("request_id"), exc)
            return None

    def _write_lines(self, lines: list[bytes]) -> None:
        """Append whole lines with one write, counted once it returned; a failed write (full
        disk) is cut back off the file and its records counted in ``write_errors``."""
        if not lines:
            return
        data = b"".join(lines)
        try:
            if self._fh is None:
                self._open()
            view, done = memoryview(data), 0
            try:
                while done < len(data):
                    n = self._fh.write(view[done:])
                    if not n:
                        raise OSError("short write")
                    done += n
            except OSError:
                try:  # cut any torn part back off: the file keeps only whole records
                    self._fh.truncate(self._size)
                except OSError:
                    pass
                raise
        except OSError as exc:  # a full disk must not kill the thread: count, one line, go on
            self.write_errors += len(lines)
            log.error("gateway log: write failed (%d records so far): %s", self.write_errors, exc)
            return
        self._size += len(data)
        self.records_written += len(lines)
        if self.on_written is not None:
            self.on_written(len(lines))

    def _write_records(self, lines: list[bytes]) -> None:
        """Write encoded lines, closing the file each time it reaches ``max_bytes`` (the same
        files as one write per record would give)."""
        group: list[bytes] = []
        size = self._size if self._fh is not None else 0
        for line in lines:
            group.append(line)
            size += len(line)
            if size >= self.max_bytes:
                self._write_lines(group)
                if self._fh is not None and self._size >= self.max_bytes:
                    self._close_file()
                group, size = [], self._size if self._fh is not None else 0
        self._write_lines(group)

    def _safely(self, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception:  # the writer thread must outlive any one failure
            self.write_errors += 1
            log.exception("gateway log: write failed")

    def _run(self) -> None:
        last_flush = time.monotonic()
        while True:
            self._wake.wait(self.batch_s)   # a batch every batch_s; at once for rotate/stop
            self._wake.clear()
            lines: list[bytes] = []
            while self._pending:
                kind, item = self._pending.popleft()
                if kind in ("record", "record_lenient"):
                    line = self._encode(item, exact=kind == "record")
                    if line is not None:
                        lines.append(line)
                    continue
                self._safely(lambda: self._write_records(lines))
                lines = []
                self._safely(self._close_file)
                if kind == "rotate":
                    item.set()
                else:   # stop
                    return
            self._safely(lambda: self._write_records(lines))
            now = time.monotonic()
            if self._fh is not None and now - last_flush >= self.flush_every_s:
                self._safely(self._fh.flush)
                last_flush = now
            if self._fh is not None and self._size and now - self._opened_at >= self.max_age_s:
                self._safely(self._close_file)
