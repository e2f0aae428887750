"""Calibrating the simulator from a replay (simulator.calibration) and the replay's prompts in
the simulator, as the engine counts them (bench/engine_sim.py), on synthetic records with known
answers."""
from __future__ import annotations

import numpy as np
import pytest

from bench.engine_sim import ChatTemplate, fit_chat_template, replay_prefixes, scaled_records, server_limits
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


def test_replay_prefixes_size_prompts_as_the_replay_and_the_engine_do():
    """Known answers by hand, template 6 tokens per message, 3 of generation prompt, half a word
    per reply token: the replay's room is the recorded prompt − 4; a whole context is sized
    engine prompt + reply + 4, a prompt alone by its engine count, a shorter start by words + 4
    per message; the engine counts each message's words + 6 (+ 3 for a reply's end markers
    before the next message) + the generation prompt."""
    tpl = ChatTemplate(msg_tokens=6, gen_tokens=3, reply_words=0.5)
    recs = [_rec("a", "planner", 0, 100, 20),
            _rec("b", "coder", 2, 150, 10, ["a"]),       # a's whole context (105 + 20 + 4) fits 146
            _rec("c", "coder", 4, 130, 10, ["b"]),       # b's 154 do not fit 126; a's messages (114) do
            _rec("d", "tester", 6, 50, 5, ["c"]),        # nothing fits 46: fresh
            _rec("e", "critic", 8, 160, 5, ["b"])]       # b's whole (168) does not fit 156, its prompt does
    wl = replay_prefixes(workload_from_records(recs, conversation_lineage=False), tpl)
    a, b, c, d, e = wl.calls
    tok = wl.seg_tokens
    (ua,) = a.path
    assert (a.input_tokens, tok[ua], tok[a.own_seg]) == (105, 102, 23)      # 96 words + 6, + 3
    ub = b.path[-1]
    assert b.path == (ua, a.own_seg, ub) and tok[ub] == 17 + 6 + 3 and b.input_tokens == 154
    assert c.path[:2] == (ua, a.own_seg) and tok[c.path[2]] == 12 + 6 + 3 and c.input_tokens == 149
    assert len(d.path) == 1 and d.input_tokens == 46 + 6 + 3
    assert e.path[:3] == b.path and tok[e.path[3]] == 2 + 6 and e.input_tokens == 162
    assert all(x.own_prompt_tokens == 3 for x in wl.calls)
    assert wl.seg_consumers[a.own_seg] == [b.idx, c.idx, e.idx]
    assert wl.seg_parent[b.own_seg] == ub and wl.seg_parent[ub] == a.own_seg


def test_fit_chat_template_recovers_the_template_a_replay_was_counted_with():
    rng = np.random.default_rng(3)
    recs = []
    for w in range(12):                                  # conversations whose prompts grow, and shrink
        inp, prev = int(rng.integers(20, 60)), None
        for i in range(8):
            out = int(rng.integers(2, 40))
            r = _rec(f"w{w}c{i}", ["x", "y"][i % 2], i, inp, out, [prev] if prev else None)
            r["workflow_id"] = f"w{w}"
            recs.append(r)
            prev = r["request_id"]
            inp = max(5, inp + out + int(rng.integers(-30, 25)))
    truth = ChatTemplate(msg_tokens=7, gen_tokens=3, reply_words=0.75)
    counted = replay_prefixes(workload_from_records(recs, conversation_lineage=False), truth)
    replayed = [{"request_id": f"{c.request_id}-run1", "input_tokens": c.input_tokens, "status": "ok"}
                for c in counted.calls]
    fit = fit_chat_template(recs, replayed)
    assert (fit.msg_tokens, fit.gen_tokens, fit.reply_words) == (7, 3, 0.75)
    assert "mean error 0.0 tokens" in fit.source
    with pytest.raises(ValueError, match="match 0 of the plan's"):
        fit_chat_template(recs, [])


def test_scaled_records_and_server_limits():
    (r,) = scaled_records([_rec("a", "p", 100.0, 1000, 7)], token_scale=0.05, time_scale=0.1)
    assert (r["input_tokens"], r["output_tokens"], r["t_arrival"]) == (50, 1, 10.0)
    line = "max_total_num_tokens=2500, chunked_prefill_size=4096, max_prefill_tokens=16384, max_running_requests=2, x"
    assert server_limits("log\n" + line) == {"kv_capacity_tokens": 2500, "chunked_prefill_size": 4096,
                                             "max_running_requests": 2}
    with pytest.raises(ValueError, match="max_total_num_tokens"):
        server_limits("nothing here")
