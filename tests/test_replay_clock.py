"""Predictions on the replay's clock: a replay at ``--time-scale s`` shortens every gap ``s``-fold,
so the profile a gateway serves during it is fitted on records put on that clock
(:func:`serving_hooks.replay_plan.on_replay_clock`); fitted on the recorded times its TTLs are
``1/s`` too long (issue 22: retention then keeps nearly everything)."""
from __future__ import annotations

import numpy as np
import pytest

from predictors import Predictor
from fitting import profile_fit as fitting
from store.workloads import generate, write_jsonl
from serving_hooks.replay_plan import load_plan, on_replay_clock

SCALE = 0.02


def _rec(rid: str, t0: float, t1: float, parents=None, tools=()) -> dict:
    r = {"request_id": rid, "workflow_type_id": "w", "workflow_id": "s", "agent_id": rid[0],
         "t_arrival": t0, "t_finish": t1, "input_tokens": 1, "output_tokens": 1,
         "tool_calls": [{"name": "bash", "t_start": a, "t_end": b} for a, b in tools]}
    if parents is not None:
        r["parent_request_ids"] = parents
    return r


def test_gaps_are_scaled_after_the_parents_finish_on_the_new_clock() -> None:
    recs = [_rec("a1", 100.0, 110.0, tools=[(110.0, 140.0)]),        # 30 s tool, then b1
            _rec("b1", 140.0, 150.0, parents=["a1"]),
            _rec("c1", 140.0, 170.0, parents=["a1"]),                 # b1 and c1 in parallel
            _rec("d1", 180.0, 181.0, parents=["b1", "c1"])]           # 10 s after the later one
    uniform = {r["request_id"]: r for r in on_replay_clock(recs, 0.1)}
    assert uniform["a1"]["t_arrival"] == 100.0 and uniform["a1"]["t_finish"] == pytest.approx(101.0)
    assert uniform["a1"]["tool_calls"][0]["t_end"] == pytest.approx(104.0)
    assert uniform["b1"]["t_arrival"] == pytest.approx(104.0)
    assert uniform["d1"]["t_arrival"] == pytest.approx(100.0 + 8.0)   # every time x 0.1
    kept = {r["request_id"]: r for r in on_replay_clock(recs, 0.1, call_scale=1.0)}
    assert kept["b1"]["t_arrival"] == pytest.approx(113.0)            # 10 s call + 3 s gap
    assert kept["d1"]["t_arrival"] == pytest.approx(113.0 + 30.0 + 1.0)
    assert recs[1]["t_arrival"] == 140.0                              # the input is not changed
    with pytest.raises(ValueError, match="time scales"):
        on_replay_clock(recs, -1.0)


def test_ttl_served_during_a_replay_matches_the_replayed_gaps(tmp_path) -> None:
    """The keep-alive TTL a gateway serves for each agent, against the gaps a replay at
    ``SCALE`` really leaves after that agent's calls (the plan's delays × ``SCALE``): on the
    replay's clock they are of one scale; fitted on the recorded times, ``1/SCALE`` apart."""
    recs = list(generate("coding_assistant", 40, seed=7))
    write_jsonl(recs, tmp_path / "raw" / "a.jsonl")
    write_jsonl(on_replay_clock(recs, SCALE), tmp_path / "replay" / "a.jsonl")
    served = {}
    for name in ("raw", "replay"):
        fitting.fit_profile([tmp_path / name], tmp_path / f"profile-{name}",
                            options=fitting.FitOptions(min_calls=5))
        served[name] = Predictor(tmp_path / f"profile-{name}")
    plan, _ = load_plan([tmp_path / "raw"])
    gaps: dict[str, list[float]] = {}
    for wf in plan:
        agent_of = {c.request_id: c.agent_id for c in wf.calls}
        for c in wf.calls:
            for p in c.parents:
                gaps.setdefault(agent_of[p], []).append(c.delay_s * SCALE)
    ratio = {"raw": [], "replay": []}
    for agent, g in gaps.items():
        meta = {"workflow_type_id": "coding_assistant", "workflow_id": "x", "agent_id": agent}
        for name, pred in served.items():
            ttl = pred.annotate_call(meta, advance=False).keep_alive_ttl_s
            assert ttl is not None, (name, agent)
            ratio[name].append(ttl / np.percentile(g, 95))
    # on the replay's clock: the TTL is within a small factor of the gaps it must bridge
    assert 0.3 <= np.median(ratio["replay"]) <= 3.0, ratio
    # on the recorded clock: 1/SCALE = 50 times too long
    assert np.median(ratio["raw"]) >= 10 * np.median(ratio["replay"]), ratio
