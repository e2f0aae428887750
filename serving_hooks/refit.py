"""Online refit: fold new gateway logs into the store and publish a new profile version.

One refit is :func:`refit_once`: if the log folders hold a file the store has not ingested
(by content hash — the same test ingestion uses), run the regular ``profiler fit`` pipeline
(:func:`fitting.profile_fit.fit_profile`: incremental ingest, fit on everything in the store,
atomic ``write_profile``); otherwise do nothing. Servers pick the new version up through their
:class:`~serving_hooks.profile_reload.ProfileReloader`, so the swap is atomic for them too.

:class:`RefitLoop` repeats that every ``every_s`` seconds, and sooner when :meth:`RefitLoop.trigger`
asks (a server wires its output-length drift alarm to it: an alarm starts a refit at once, at
most one triggered refit per ``min_trigger_gap_s``; with no new log file it has nothing to do). Inside a server (``profiler serve
--logs DIR --refit-every 10m``) it runs each refit in a child process at lower CPU priority
(``profiler watch --once``), so the fit's CPU and GIL never stall annotation; ``profiler watch``
runs it in its own process directly. A child that runs longer than ``timeout_s`` (default 30 min)
is killed and the refit counts as failed; every failure is logged at ERROR and handed to
``on_result`` (servers count it in ``/metrics`` and show it in ``/healthz``).
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import duckdb

from fitting.profile_fit import FitOptions, fit_profile
from store.ingest import discover, sha256_of
from store.profile_artifact import ProfileError, current_version, load_profile, store_path

log = logging.getLogger(__name__)


def new_log_files(logs: Sequence[str | Path], db: str | Path) -> list[Path]:
    """Log files under ``logs`` whose content the store at ``db`` has not ingested yet."""
    existing = [p for p in logs if Path(p).exists()]
    files = [p for p, _ in discover(existing)] if existing else []
    if not files:
        return []
    db = Path(db)
    if not db.exists():
        return files
    try:
        con = duckdb.connect(str(db), read_only=True)
    except duckdb.Error:
        return files  # locked by a running fit, or unreadable: let the fit decide
    try:
        known = {r[0] for r in con.execute("SELECT sha256 FROM ingested_files").fetchall()}
    except duckdb.Error:
        known = set()
    finally:
        con.close()
    return [p for p in files if sha256_of(p) not in known]


@dataclass
class RefitResult:
    ran: bool                      # False: nothing new to ingest
    version: str | None = None     # the version CURRENT names afterwards
    changed: bool = False          # a different version than before
    new_files: int = 0
    loaded: int = 0
    quarantined: int = 0
    seconds: float = 0.0
    error: str | None = None

    def summary(self) -> str:
        if self.error:
            return f"refit failed: {self.error}"
        if not self.ran:
            return "refit: no new log files"
        what = f"new profile {self.version}" if self.changed else f"profile unchanged ({self.version})"
        return (f"refit: {self.new_files} new files, {self.loaded} calls loaded, "
                f"{self.quarantined} quarantined, {what} in {self.seconds:.1f}s")


def options_from_profile(profile_root: str | Path) -> FitOptions:
    """The :class:`fitting.profile_fit.FitOptions` the active profile was fit with (defaults if none).

    A refit keeps the choices of the original ``profiler fit`` (coverage, pruning, seed, …)
    without the server having to repeat them. An option this version does not know is refused
    (``ValueError`` naming it), never dropped.
    """
    try:
        recorded = dict(load_profile(profile_root).manifest.get("options") or {})
    except (ProfileError, OSError, ValueError):
        return FitOptions()
    return FitOptions.from_dict(recorded, source=f"{profile_root}: the manifest's options")


def refit_once(profile_root: str | Path, logs: Sequence[str | Path], *, db: str | Path | None = None,
               options: FitOptions | None = None) -> RefitResult:
    """Ingest new files under ``logs`` and fit a new version under ``profile_root`` (see module doc)."""
    root = Path(profile_root)
    db_path = store_path(root, db)
    t0 = time.monotonic()
    fresh = new_log_files(logs, db_path)
    before = current_version(root)
    if not fresh:
        return RefitResult(ran=False, version=before)
    if options is None:
        options = options_from_profile(root)
    existing = [p for p in logs if Path(p).exists()]
    profile, report = fit_profile(existing, root, db=db_path, options=options)
    return RefitResult(ran=True, version=profile.version, changed=profile.version != before,
                       new_files=len(fresh), loaded=report.loaded, quarantined=report.quarantined,
                       seconds=time.monotonic() - t0)


def _watch_once_command(profile_root: Path, logs: Sequence[Path], db: Path | None,
                        fit_args: Sequence[str]) -> list[str]:
    cmd = [sys.executable, "-c", "from profiler.cli import main; main()", "watch", "--once", "--json",
           "--profile", str(profile_root)]
    for p in logs:
        cmd += ["--logs", str(p)]
    if db is not None:
        cmd += ["--db", str(db)]
    return cmd + list(fit_args)


@dataclass
class RefitLoop:
    """Refit every ``every_s`` seconds in a background thread (``start``/``stop``).

    ``subprocess=True`` runs each refit as ``profiler watch --once`` under ``nice`` (for servers);
    otherwise in this process with ``options`` (a :class:`fitting.profile_fit.FitOptions`).
    ``on_result`` is called with each :class:`RefitResult` (e.g. to trigger a reload now).
    """

    profile_root: Path
    logs: list[Path]
    every_s: float
    db: Path | None = None
    subprocess: bool = True
    options: object = None
    fit_args: list[str] = field(default_factory=list)   # extra `profiler watch` arguments
    command: list[str] | None = None                    # child command (default: watch --once)
    on_result: Callable[[RefitResult], None] | None = None
    before_refit: Callable[[], None] | None = None
    nice: int = 10
    timeout_s: float | None = 1800.0                    # child refit killed beyond this
    results: list = field(default_factory=list)
    min_trigger_gap_s: float = 60.0                     # triggered refits at most this often
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._last_trigger: float | None = None
        self._trigger_lock = threading.Lock()
        self.triggers: list[str] = []                   # reasons of the refits triggered so far
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run_once(self) -> RefitResult:
        with self._lock:
            if self.before_refit is not None:
                try:
                    self.before_refit()
                except Exception:
                    log.exception("before-refit hook failed")
            t0 = time.monotonic()
            try:
                if self.subprocess:
                    result = self._run_child(t0)
                else:
                    result = refit_once(self.profile_root, self.logs, db=self.db, options=self.options)
            except Exception as exc:
                result = RefitResult(ran=True, error=f"{type(exc).__name__}: {exc}",
                                     seconds=time.monotonic() - t0)
            (log.error if result.error else log.info)(result.summary())
            self.results.append(result)
            del self.results[:-20]
            if self.on_result is not None:
                try:
                    self.on_result(result)
                except Exception:
                    log.exception("refit result hook failed")
            return result

    def _run_child(self, t0: float) -> RefitResult:
        nice = self.nice
        try:
            proc = subprocess.run(
                self.command or _watch_once_command(self.profile_root, self.logs, self.db, self.fit_args),
                capture_output=True, text=True, timeout=self.timeout_s,
                preexec_fn=(lambda: os.nice(nice)) if nice and os.name == "posix" else None)
        except subprocess.TimeoutExpired:  # run() has killed the child
            return RefitResult(ran=True, error=f"refit child killed after the {self.timeout_s:g}s "
                               "timeout", seconds=time.monotonic() - t0)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return RefitResult(ran=True, error=f"exit {proc.returncode}: " + " | ".join(tail),
                               seconds=time.monotonic() - t0)
        return RefitResult(**json.loads(lines[-1]))

    def trigger(self, reason: str) -> bool:
        """Run a refit now instead of at the next tick (e.g. ``"drift alarm in coding"``); False
        when the loop is not running or a triggered refit started less than
        ``min_trigger_gap_s`` ago."""
        now = self.clock()
        with self._trigger_lock:
            if self._thread is None or (self._last_trigger is not None
                                        and now - self._last_trigger < self.min_trigger_gap_s):
                return False
            self._last_trigger = now
            self.triggers.append(reason)
        log.warning("refit triggered now: %s", reason)
        self._wake.set()
        return True

    def _run(self) -> None:
        while True:
            self._wake.wait(self.every_s)
            if self._stop.is_set():
                return
            self._wake.clear()
            self.run_once()

    def start(self) -> None:
        if self._thread is None and self.every_s > 0:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="refit-loop", daemon=True)
            self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the loop thread; True while it is still running (for a foreground watch)."""
        if self._thread is None:
            return False
        self._thread.join(timeout)
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)  # a running child fit finishes on its own
            self._thread = None
