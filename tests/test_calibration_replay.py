"""Calibrating the simulator from a replay (simulator.calibration) and the replay's prefix
structure in the simulator (bench/engine_sim.py), on synthetic records with known answers."""
from __future__ import annotations

import numpy as np
import pytest

from bench.engine_sim import replay_prefixes, scaled_records, server_limits
from simulator.calibration import fit_step_time, mark_concurrency
from simulator.workload import workload_from_records


def test_mark_concurrency_counts_calls_in_flight_before_the_first_token():
    recs = [
        {"t_arrival": 0.0, "t_first_token": 1.0, "t_finish": 2.0},   # alone until 1.0
        {"t_arrival": 1.5, "t_first_token": 2.5, "t_finish": 3.0},   # overlaps the first (finish 2.0)
        {"t_arrival": 5.0, "t_first_token": 5.2, "t_finish": 6.0},   # alone
    ]
    assert [r["num_workers"] for r in mark_concurrency(recs)] == [1, 2, 1]
    assert "num_workers" not in recs[0]              # copies, the input is left alone


def test_prefill_intercept_recovers_a_fixed_cost():
    rng = np.random.default_rng(0)
    recs, t = [], 0.0
    for i in range(60):
        inp, out = int(rng.integers(50, 800)), 32
        ttft = 0.04 + 2e-4 * inp                     # p0 = 40 ms, a = 0.2 ms per new token
        recs.append({"workflow_id": f"w{i}", "t_arrival": t, "t_first_token": t + ttft,
                     "t_finish": t + ttft + 0.01 * (out - 1), "input_tokens": inp, "output_tokens": out,
                     "num_workers": 1, "cached_tokens": 0})
        t += 10.0
    through_origin = fit_step_time(recs)
    fit = fit_step_time(recs, prefill_intercept=True)
    assert fit.prefill_t0 == pytest.approx(0.04, rel=0.05)
    assert fit.a + fit.a_ctx == pytest.approx(2e-4, rel=0.05)
    assert through_origin.prefill_t0 == 0.0 and through_origin.prefill_mdape > fit.prefill_mdape
    assert fit.t0 == pytest.approx(0.01, rel=0.05)


def _rec(rid, agent, t, inp, out, parents=None):
    r = {"request_id": rid, "workflow_type_id": "t", "workflow_id": "w", "agent_id": agent,
         "t_arrival": t, "t_finish": t + 1.0, "input_tokens": inp, "output_tokens": out}
    if parents:
        r["parent_request_ids"] = parents
    return r


def test_replay_prefixes_continue_the_largest_fitting_context():
    recs = [_rec("a", "planner", 0, 100, 20),
            _rec("b", "coder", 2, 150, 10, ["a"]),       # fits a's 120 tokens: continues it
            _rec("c", "coder", 4, 130, 10, ["b"]),       # b's 160 do not fit; a's 120 (b's path) do
            _rec("d", "tester", 6, 50, 5, ["c"])]        # nothing fits: fresh
    wl = replay_prefixes(workload_from_records(recs, conversation_lineage=False))
    a, b, c, d = wl.calls
    assert b.path == (a.own_seg,) and b.own_prompt_tokens == 30
    assert c.path == (a.own_seg,) and c.own_prompt_tokens == 10
    assert d.path == () and d.own_prompt_tokens == 50
    assert wl.seg_tokens[b.own_seg] == 30 + 10
    assert wl.seg_consumers[a.own_seg] == [b.idx, c.idx]
    assert wl.seg_parent[b.own_seg] == a.own_seg


def test_scaled_records_and_server_limits():
    (r,) = scaled_records([_rec("a", "p", 100.0, 1000, 7)], token_scale=0.05, time_scale=0.1)
    assert (r["input_tokens"], r["output_tokens"], r["t_arrival"]) == (50, 1, 10.0)
    line = "max_total_num_tokens=2500, chunked_prefill_size=4096, max_prefill_tokens=16384, max_running_requests=2, x"
    assert server_limits("log\n" + line) == {"kv_capacity_tokens": 2500, "chunked_prefill_size": 4096,
                                             "max_running_requests": 2}
    with pytest.raises(ValueError, match="max_total_num_tokens"):
        server_limits("nothing here")
