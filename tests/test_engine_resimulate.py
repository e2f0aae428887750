"""``bench/engine_resimulate.py`` on a stored real-engine run, without an engine: at the run's
own settings it reproduces the prediction the bench stored (open loop released at the replay's
Poisson times, not as a closed population), and a what-if ``rate`` changes the arrivals and so
the prediction (how ``open-contention``'s CPU rate was chosen, docs/sglang.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.engine_resimulate import simulate_condition

RUN = Path(__file__).resolve().parents[1] / "docs" / "measurements" / "engine-open-contention-s9-a-2026-11-29.json"


@pytest.mark.slow
def test_stored_open_loop_run_reproduced_and_rate_what_if() -> None:
    cond = json.loads(RUN.read_text())["conditions"]["open-contention"]
    stored = cond["simulator"]["seeds"]["0"]
    sim, names, seeds = simulate_condition(cond, seeds=[0])
    assert seeds == [0] and names == ["round-robin", "hints"]
    for arm in names:
        assert sim[0][arm]["jct_avg_s"] == pytest.approx(stored[arm]["jct_avg_s"], rel=1e-6)
    faster, _, _ = simulate_condition(cond, rate=2.6, seeds=[0])
    # more arrivals per second on the same replica: a longer queue, longer jobs in both arms
    for arm in names:
        assert faster[0][arm]["jct_avg_s"] > sim[0][arm]["jct_avg_s"] * 1.05
