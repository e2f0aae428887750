"""Rotating JSON Lines log of completed calls, in the gateway-record shape (log-format §2).

The gateway hands each completed call to :meth:`GatewayLog.write`, which only enqueues it: a
background thread does the JSON encoding and file I/O, so a slow disk never slows a request.

Files are written under a name the ingester ignores (``gateway-<UTC time>-<pid>-<n>.jsonl.open``)
and renamed to ``….jsonl`` when closed — on rotation (size or age limit) and at shutdown. So
``profiler fit LOGDIR`` (and the online refit) only ever read complete files, never a
half-written last line, and read them unchanged: each line is a gateway record
``{"request_id", "t_arrival", "t_first_token", "t_finish", "request": {…, "app_metadata": …},
"response": {"choices": [...], "usage": {...}}}`` plus our extra keys (``sys_annotations``,
``upstream``, ``gateway``), which the ingester keeps as unknown extras.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

OPEN_SUFFIX = ".jsonl.open"
CLOSED_SUFFIX = ".jsonl"


class GatewayLog:
    """Background JSONL writer with size/age rotation.

    ``max_bytes``: rotate once the open file reaches this size; ``max_age_s``: rotate a non-empty
    file this long after it was opened (bounds how stale the logs the refit sees can be).
    """

    def __init__(self, directory: str | Path, *, max_bytes: int = 64 << 20, max_age_s: float = 300.0,
                 prefix: str = "gateway", flush_every_s: float = 0.5) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = int(max_bytes)
        self.max_age_s = float(max_age_s)
        self.prefix = prefix
        self.flush_every_s = flush_every_s
        self.records_written = 0
        self.files_closed = 0
        self.write_errors = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._fh = None
        self._path: Path | None = None
        self._opened_at = 0.0
        self._size = 0
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name="gateway-log", daemon=True)
        self._thread.start()

    # -- producer side (any thread / the event loop) -------------------------------------------
    def write(self, record: dict) -> None:
        """Queue one record for writing (never blocks on I/O)."""
        self._queue.put(("record", record))

    def rotate(self, wait: bool = True, timeout: float = 10.0) -> None:
        """Close the current file now (so a refit sees it); optionally wait until done."""
        done = threading.Event()
        self._queue.put(("rotate", done))
        if wait:
            done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write everything queued, close (rename) the file and stop the thread."""
        if self._thread.is_alive():
            self._queue.put(("stop", None))
            self._thread.join(timeout)

    # -- writer thread --------------------------------------------------------------------------
    def _open(self) -> None:
        self._seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self._path = self.directory / f"{self.prefix}-{stamp}-{os.getpid()}-{self._seq:04d}{OPEN_SUFFIX}"
        self._fh = open(self._path, "ab")
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

    def _append(self, record: dict) -> None:
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        if self._fh is None:
            self._open()
        self._fh.write(line)
        self._size += len(line)
        self.records_written += 1
        if self._size >= self.max_bytes:
            self._close_file()

    def _run(self) -> None:
        last_flush = time.monotonic()
        while True:
            try:
                kind, item = self._queue.get(timeout=self.flush_every_s)
            except queue.Empty:
                kind, item = "tick", None
            try:
                if kind == "record":
                    self._append(item)
                elif kind == "rotate":
                    self._close_file()
                    item.set()
                elif kind == "stop":
                    self._close_file()
                    return
                now = time.monotonic()
                if self._fh is not None and now - last_flush >= self.flush_every_s:
                    self._fh.flush()
                    last_flush = now
                if self._fh is not None and self._size and now - self._opened_at >= self.max_age_s:
                    self._close_file()
            except Exception:  # a full disk must not kill the thread: count, log, go on
                self.write_errors += 1
                log.exception("gateway log: write failed")
                if kind == "rotate":
                    item.set()
