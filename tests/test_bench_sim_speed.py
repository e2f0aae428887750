"""bench/bench_sim_speed.py: the outcome digest and the --check comparison that guard speed work."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_sim_speed", REPO / "bench" / "bench_sim_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(policy, digest, jct=10.0):
    return {"policy": policy, "calls": 100, "load": "peak", "arrivals": "poisson", "digest": digest,
            "avg_jct_s": jct}


def test_check_reports_rows_that_changed(capsys):
    b = _bench()
    before = [_row("ours", "aaa"), _row("least-load", "bbb")]
    assert b.check([_row("ours", "aaa"), _row("least-load", "bbb")], before) == 0
    assert b.check([_row("ours", "aaa"), _row("least-load", "bbc")], before) == 1
    assert b.check([_row("ours", "aaa", jct=10.5)], before) == 1
    assert "DIFFERS ours" in capsys.readouterr().out
    assert b.check([_row("saga", "x")], before) == 2                 # nothing to compare


def test_digest_sees_every_call_outcome():
    b = _bench()

    def res(t_finish):
        return SimpleNamespace(requests=[SimpleNamespace(t_admit=0.0, t_first=0.5, t_finish=t, preempts=0,
                                                         recomputed=0) for t in t_finish])

    assert b.outcome_digest(res([1.0, 2.0])) == b.outcome_digest(res([1.0, 2.0]))
    assert b.outcome_digest(res([1.0, 2.0])) != b.outcome_digest(res([1.0, 2.000002]))
    assert b.outcome_digest(res([1.0, 2.0])) != b.outcome_digest(res([2.0, 1.0]))


@pytest.mark.slow
def test_bench_runs_and_checks_itself(tmp_path):
    cmd = [sys.executable, str(REPO / "bench" / "bench_sim_speed.py"), "--calls", "600",
           "--policies", "sglang-default,ours", "--out", str(tmp_path / "o")]
    first = subprocess.run(cmd + ["--json", str(tmp_path / "a.json")], capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 0, first.stderr
    rows = json.loads((tmp_path / "a.json").read_text())
    assert [r["policy"] for r in rows] == ["sglang-default", "ours"] and all(r["calls"] > 400 for r in rows)
    again = subprocess.run(cmd + ["--check", str(tmp_path / "a.json")], capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0 and "2 rows compared, 0 differ" in again.stdout
