"""Hot reload: follow a profile root's ``CURRENT`` pointer and swap new versions in.

``profiler fit`` (and the online refit) write a new version folder and then replace
``<root>/CURRENT`` atomically. :class:`ProfileReloader` polls that one-line file
(``store.profile_artifact.current_version``, a cheap read) every ``interval_s``; when it names a
new version it loads and compiles it *beside* the active one — in its own thread, so requests
keep being served — and hands it to :meth:`predictors.Predictor.load`, whose swap is a single
reference assignment. A version that fails to load, or whose ``profile.json`` has not the shape a
fit writes (:func:`store.profile_artifact.check_profile_shape`: ``{}``, ``agents: []``,
``format: 999``), or that lacks a workflow type the server is serving (one of its live sessions
is of that type: swapped in, every call of it would turn unknown and the shadow gate would take
it for a new type, issue 35), is logged and counted, its reason kept in :attr:`last_error` (the
reload endpoints reply with it); the active profile stays in service and the same version is
not retried until ``CURRENT`` changes again.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

from predictors.predictor import Predictor
from store.profile_artifact import ProfileError, check_profile_shape, current_version, load_profile

log = logging.getLogger(__name__)


class ProfileReloader:
    """Polls ``current_version(root)`` and loads new versions into ``predictor``.

    ``on_reload(outcome, version)`` is called after each attempt (outcome ``"ok"`` or ``"error"``).
    """

    def __init__(self, root: str | Path, predictor: Predictor, *, interval_s: float = 2.0,
                 on_reload: Callable[[str, str | None], None] | None = None) -> None:
        self.root = Path(root)
        self.predictor = predictor
        self.interval_s = float(interval_s)
        self.on_reload = on_reload
        self.last_error: str | None = None
        self._failed_version: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def check(self, force: bool = False) -> bool:
        """Load the version ``CURRENT`` names if it is new (or ``force``); True when one was swapped in."""
        with self._lock:
            version = current_version(self.root)
            if version is None:
                return False
            if not force and (version == self.predictor.version or version == self._failed_version):
                return False
            try:
                profile = load_profile(self.root)
                check_profile_shape(profile.data, profile.path / "profile.json")
                self._check_served_types(profile.data, profile.path / "profile.json")
                self.predictor.load(profile)
            except Exception as exc:
                self._failed_version = version
                self.last_error = f"{version}: {type(exc).__name__}: {exc}"
                log.error("profile reload failed, keeping %s: %s", self.predictor.version, self.last_error)
                if self.on_reload:
                    self.on_reload("error", version)
                return False
            self._failed_version = None
            self.last_error = None
            log.info("profile %s loaded from %s", self.predictor.version, self.root)
            if self.on_reload:
                self.on_reload("ok", self.predictor.version)
            return True

    def _check_served_types(self, data: dict, where: Path) -> None:
        """Raise :class:`ProfileError` when ``data`` lacks a workflow type of the active profile
        that a live session of the predictor is of (the types being served)."""
        active = self.predictor.profile
        if active is None:
            return
        live: dict[str, int] = {}
        for s in self.predictor.sessions.values():
            if s.workflow_type_id in active.workflow_type_calls:
                live[s.workflow_type_id] = live.get(s.workflow_type_id, 0) + 1
        known = set(data.get("workflow_types") or {}) | set((data.get("output_length") or {}).get("agents") or {})
        missing = sorted(wt for wt in live if wt not in known)
        if missing:
            shown = ", ".join(f"{wt!r} ({live[wt]:,} live sessions)" for wt in missing[:5])
            raise ProfileError(f"{where}: lacks workflow type(s) this server is serving: {shown}; "
                               f"kept {active.version} (refit with those types' logs too, or restart the server to drop them)")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # never let the poller die
                log.exception("profile reload poll failed")

    def start(self) -> "ProfileReloader":
        if self._thread is None and self.interval_s > 0:
            self._thread = threading.Thread(target=self._run, name="profile-reload", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def wait_for(self, version: str, timeout: float = 10.0) -> bool:
        """Block until ``version`` is active (tests, the refit loop)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.predictor.version == version:
                return True
            time.sleep(0.02)
        return self.predictor.version == version
