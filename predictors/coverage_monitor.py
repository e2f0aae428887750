"""Drift alarm for served output-length bands: rolling coverage of observed calls.

A band fit on last month's workflows covers today's only while the workload stays put; a
team whose tasks change (issue 26: trained on the first 70 % of workflows by time, the rest
covered 0.917 at nominal 0.99) is served bands that miss more and more, and nothing between
refits says so. :class:`CoverageMonitor` keeps, per workflow type, the last ``window``
outcomes (did the output fall inside the band served at the call's arrival:
:meth:`predictors.Predictor.observe`) and raises an **alarm** when the misses among them are
significantly more than nominal:

    misses > α·n + z·√(n·α·(1 − α)),   n ≥ ``min_calls``,

a one-sided binomial (normal-approximation) test at ``z`` standard deviations (default 4: at
nominal 0.99 and a window of 500 the alarm needs 14 misses, which a stationary log at nominal
coverage makes in 0.06 % of windows (binomial tail), while a coverage of 0.97 makes 15). The alarm clears when
the rolling coverage is back within the test. :meth:`status` gives, per type, ``calls``,
``coverage``, ``nominal``, ``alarm`` and ``since`` (outcomes since the alarm turned on); a
warning is logged when an alarm turns on, and ``on_alarm(workflow_type_id, status)`` is called
then (at most once per window of a type's outcomes, outside the lock): the serving layer exports
the state in ``/metrics``, records the alarm for ``profiler show`` and starts a refit
(``serving_hooks.service``).

Which band it judges is the caller's choice: :meth:`predictors.Predictor.observe` records the
outcome of the band the *profile* fitted, not of the band online calibration served
(:mod:`predictors.online_calibration` keeps the served coverage up under drift; the alarm says
the profile itself no longer fits, i.e. a refit is due).

Cost: O(1) per outcome (a deque and a running miss count per type).
"""
from __future__ import annotations

import logging
import math
import threading
from collections import deque
from typing import Any, Callable

log = logging.getLogger(__name__)

#: Outcomes kept per workflow type.
DEFAULT_WINDOW = 500
#: Fewest outcomes before the test may fire.
DEFAULT_MIN_CALLS = 100
#: Standard deviations of binomial noise tolerated above the nominal misses.
DEFAULT_Z = 4.0


class CoverageMonitor:
    """Rolling band coverage per workflow type with a drift alarm (see the module docstring)."""

    def __init__(self, nominal: float = 0.99, window: int = DEFAULT_WINDOW,
                 min_calls: int = DEFAULT_MIN_CALLS, z: float = DEFAULT_Z) -> None:
        if not 0.0 < nominal < 1.0:
            raise ValueError(f"nominal coverage must be in (0, 1), got {nominal}")
        if window < 1 or min_calls < 1:
            raise ValueError("window and min_calls must be positive")
        self.nominal = float(nominal)
        self.window = int(window)
        self.min_calls = int(min_calls)
        self.z = float(z)
        self._outcomes: dict[str, deque] = {}
        self._misses: dict[str, int] = {}
        self._alarm_since: dict[str, int] = {}
        #: per type, outcomes recorded so far and at the last warning: an alarm that flickers at
        #: the threshold warns again only after a whole window of new outcomes
        self._seen: dict[str, int] = {}
        self._warned_at: dict[str, int] = {}
        self._lock = threading.Lock()
        #: called as ``on_alarm(workflow_type_id, status)`` when a type's alarm turns on (and warns)
        self.on_alarm: Callable[[str, dict[str, Any]], None] | None = None

    def set_nominal(self, nominal: float) -> None:
        """A new profile's nominal coverage (the windows are kept)."""
        if 0.0 < nominal < 1.0:
            self.nominal = float(nominal)

    def limit(self, n: int) -> float:
        """Most misses among ``n`` outcomes that the test still calls nominal."""
        a = 1.0 - self.nominal
        return a * n + self.z * math.sqrt(n * a * (1.0 - a))

    def record(self, workflow_type_id: str, hit: bool) -> bool:
        """One observed outcome; returns whether the type's alarm is on after it."""
        warned, alarm = self._record(workflow_type_id, hit)
        hook = self.on_alarm
        if warned and hook is not None:
            try:
                hook(workflow_type_id, self.status().get(workflow_type_id, {}))
            except Exception:  # a failing hook must not fail the observation
                log.exception("drift alarm hook failed")
        return alarm

    def _record(self, workflow_type_id: str, hit: bool) -> tuple[bool, bool]:
        """(warned now, alarm on) after one outcome."""
        warned = False
        with self._lock:
            q = self._outcomes.get(workflow_type_id)
            if q is None:
                q = self._outcomes[workflow_type_id] = deque(maxlen=self.window)
                self._misses[workflow_type_id] = 0
            if len(q) == q.maxlen:
                self._misses[workflow_type_id] -= not q[0]
            q.append(bool(hit))
            self._misses[workflow_type_id] += not hit
            n, misses = len(q), self._misses[workflow_type_id]
            alarm = n >= self.min_calls and misses > self.limit(n)
            was = workflow_type_id in self._alarm_since
            seen = self._seen[workflow_type_id] = self._seen.get(workflow_type_id, 0) + 1
            last = self._warned_at.get(workflow_type_id)
            if alarm and not was:
                self._alarm_since[workflow_type_id] = 0
                if last is None or seen - last >= self.window:
                    self._warned_at[workflow_type_id] = seen
                    warned = True
                    log.warning("output-length coverage drift in %s: %.3f over the last %d calls "
                                "(nominal %.3f); consider a refit", workflow_type_id, 1 - misses / n,
                                n, self.nominal)
            elif alarm:
                self._alarm_since[workflow_type_id] += 1
            elif was:
                del self._alarm_since[workflow_type_id]
            return warned, alarm

    def status(self) -> dict[str, dict[str, Any]]:
        """Per workflow type: calls in the window, rolling coverage, nominal, alarm, since."""
        with self._lock:
            out = {}
            for wt, q in self._outcomes.items():
                n = len(q)
                out[wt] = {"calls": n, "coverage": 1 - self._misses[wt] / n if n else None,
                           "nominal": self.nominal, "alarm": wt in self._alarm_since,
                           "since": self._alarm_since.get(wt)}
            return out

    def alarms(self) -> list[str]:
        """Workflow types whose alarm is on."""
        with self._lock:
            return sorted(self._alarm_since)
