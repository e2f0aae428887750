"""Drift alarm over observed band outcomes (issue 26 f)."""
from __future__ import annotations

import numpy as np
import pytest

from predictors.coverage_monitor import CoverageMonitor
from predictors.predictor import Predictor
from tests.serving_helpers import fit_generated_profile


def test_alarm_fires_on_drift_and_not_on_a_stationary_stream():
    rng = np.random.default_rng(0)
    mon = CoverageMonitor(nominal=0.99)
    fired = [mon.record("steady", bool(h)) for h in rng.random(20_000) < 0.99]
    assert not any(fired)
    assert mon.status()["steady"]["calls"] == 500 and mon.alarms() == []
    mon2 = CoverageMonitor(nominal=0.99)
    for h in rng.random(300) < 0.92:
        mon2.record("t", bool(h))
    assert mon2.alarms() == ["t"] and mon2.status()["t"]["since"] >= 0
    for _ in range(500):  # back to nominal: the window refills with hits and the alarm clears
        mon2.record("t", True)
    assert mon2.alarms() == []


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="nominal"):
        CoverageMonitor(nominal=1.0)
    with pytest.raises(ValueError, match="positive"):
        CoverageMonitor(window=0)


def test_predictor_feeds_observed_outcomes(tmp_path):
    profile = fit_generated_profile(tmp_path, 60, 0)
    p = Predictor(profile)
    wt = next(iter(p.profile.workflow_type_calls))
    agent = next(a for (t, a) in p.profile.agents if t == wt)
    meta = {"workflow_type_id": wt, "workflow_id": "w1", "agent_id": agent}
    for i in range(150):  # far outside every band: the alarm turns on
        p.annotate(meta, request_id=f"r{i}")
        assert p.observe({"app_metadata": meta, "request_id": f"r{i}", "output_tokens": 10**7}) is False
    st = p.coverage_monitor.status()[wt]
    assert st["alarm"] and st["coverage"] == 0.0 and st["nominal"] == p.profile.coverage


def test_a_flickering_alarm_warns_once_per_window(caplog):
    """At the threshold the alarm turns on and off call by call; the log says so once per window."""
    import logging

    import numpy as np

    from predictors.coverage_monitor import CoverageMonitor

    mon = CoverageMonitor(nominal=0.9, window=50, min_calls=10, z=0.0)   # limit = 10 % misses
    misses = np.random.default_rng(0).random(1000) < 0.1                  # right at the limit
    ons, was = 0, False
    with caplog.at_level(logging.WARNING, logger="predictors.coverage_monitor"):
        for miss in misses:
            now = mon.record("t", hit=not miss)
            ons += now and not was
            was = now
    warnings = [r for r in caplog.records if "coverage drift" in r.getMessage()]
    assert ons > len(warnings) >= 1                      # it flickered; the log did not follow it
    assert len(warnings) <= len(misses) // 50 + 1        # at most one warning per window of calls
