"""Online choice among keep-alive TTL candidates (issue 37 item 4): the served TTL per workflow
type switches to a candidate (the plain per-type p95, the tool's p95, a TTL that gives up on gaps
past the cap) once it is ahead of the fitted one beyond noise on the idle gaps the server saw.
Unit tests drive the selector with chosen gaps; the replay tests go through the serving Predictor
on a fitted profile (injected clocks, no timing)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fitting.profile_fit import fit_profile
from predictors.keep_alive_compare import compare_held, warm_start_state
from predictors.keep_alive_selection import CANDIDATES, KeepAliveSelector
from predictors.predictor import Predictor
from predictors.served import held_ttl_s
from scoring.online_eval import replay_served, stream_calls, stream_gaps
from store import ingest as ingest_mod
from store.duckdb_store import connect

WT = "sel_app"


def feed(sel: KeepAliveSelector, gaps, ttls) -> list[str]:
    """Record each gap with the same candidates' TTLs; the candidate served before each gap."""
    served = []
    for g in gaps:
        served.append(CANDIDATES[sel.choose(WT, ttls)])
        sel.record(WT, float(g), ttls)
    return served


def test_a_candidate_covering_more_at_the_same_cost_takes_over_after_enough_gaps():
    rng = np.random.default_rng(0)
    gaps = rng.uniform(0.5, 4.0, 400)            # every gap under 4 s: a 10 s TTL covers them all
    gaps[rng.random(400) < 0.06] = 5.5           # 6 % run to 5.5 s: past the fitted 5 s, within 10 s
    sel = KeepAliveSelector(min_outcomes=50, margin=1.0)
    served = feed(sel, gaps, (5.0, 5.0, 10.0, None))
    assert served[:50] == ["fitted"] * 50        # no switch before MIN_OUTCOMES
    assert served[-1] == "tool_p95" and sel.served(WT) == "tool_p95"
    st = sel.status()[WT]
    assert st["switches"] >= 1 and st["served_calls"]["tool_p95"] > 300
    assert st["candidates"]["tool_p95"]["coverage"] == pytest.approx(1.0)


def test_equal_candidates_never_switch_and_a_missing_one_is_never_served():
    gaps = np.random.default_rng(1).lognormal(1.0, 0.8, 500)
    sel = KeepAliveSelector()
    served = feed(sel, gaps, (6.0, 6.0, 6.0, None))
    assert set(served) == {"fitted"} and sel.status()[WT]["switches"] == 0
    assert sel.choose(WT, (6.0, None, None, None)) == 0


def test_a_cheaper_candidate_serves_only_where_it_reaches_nominal():
    """Gaps past the cap: the give-up TTL holds less at the same coverage; under nominal it is not
    taken for holding less (the fitted TTL is calibrated to nominal, trading it away loses)."""
    rng = np.random.default_rng(2)
    short = rng.uniform(0.5, 3.0, 600)
    long_ = rng.uniform(200.0, 400.0, 600)
    at_nominal = np.where(rng.random(600) < 0.03, long_, short)   # 97 % coverable
    sel = KeepAliveSelector()
    feed(sel, at_nominal, (600.0, 600.0, 10.0, 3.0))   # fitted: the cap; give-up: 3 s
    assert sel.served(WT) in ("tool_p95", "give_up")   # both hold less at the same coverage
    sel = KeepAliveSelector()
    under = np.where(rng.random(600) < 0.2, long_, short)         # 80 % coverable: under nominal
    feed(sel, under, (600.0, 600.0, 600.0, 3.0))
    assert sel.served(WT) == "fitted"


def test_the_errors_are_the_jackknifes_on_independent_gaps():
    """The selector's delta-method errors agree with eval's delete-one-workflow jackknife when each
    gap is its own workflow (half-life long enough to weigh all gaps alike)."""
    rng = np.random.default_rng(3)
    gaps = rng.lognormal(1.0, 1.0, 3000)
    a, b = np.full(3000, 8.0), np.full(3000, 12.0)
    sel = KeepAliveSelector(half_life=1e12, min_outcomes=1e9)   # never switches: scores only
    for g in gaps:
        sel.record(WT, float(g), (8.0, 12.0, 8.0, None))
    dc, sc, dk, sk = sel._versus(sel._types[WT], 1, 0)
    ref = compare_held(gaps, np.vectorize(held_ttl_s)(b), np.vectorize(held_ttl_s)(a), np.arange(3000))
    assert dc == pytest.approx(ref["coverage_diff"], abs=1e-12)
    assert dk == pytest.approx(ref["kv_s_diff"], rel=1e-9)
    assert sc == pytest.approx(ref["coverage_diff_se"], rel=0.02)
    assert sk == pytest.approx(ref["kv_s_diff_se"], rel=0.05)


# ------------------------------------------------------------------ through the Predictor
CALLS = 8


def write_log(path: Path, n_wf: int, seed: int, start: int = 0) -> Path:
    """Sequential workflows of one type, one agent; idle gaps ~ LN(ln 3 s, 0.5) except 8 % of
    9–10 s: the fitted 0.95 quantile covers the short ones, the tool's 10 s default all."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_wf):
        w, t = start + i, (start + i) * 1000.0
        for k in range(CALLS):
            rows.append({"request_id": f"r{w}-{k}", "workflow_type_id": WT, "workflow_id": f"w{w:05d}",
                         "agent_id": "solo", "call_index": k, "t_arrival": t, "t_finish": t + 1.0,
                         "input_tokens": 400, "output_tokens": int(rng.integers(50, 300))})
            gap = rng.uniform(9.0, 9.9) if rng.random() < 0.08 else float(rng.lognormal(math.log(3.0), 0.5))
            t += 1.0 + gap
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    root = tmp_path_factory.mktemp("sel")
    prof, _ = fit_profile([write_log(root / "train" / "log.jsonl", 60, seed=1)], root / "profile")
    info = prof.data["idle_gap"]["workflow_types"][WT]
    assert info["past_cap_share"] == 0.0 and info["coverable_quantile_s"] is not None
    return prof


def test_replay_serves_the_candidate_ahead_and_what_it_serves_is_annotate_calls(profile, tmp_path):
    path = write_log(tmp_path / "test.jsonl", 80, seed=7, start=5000)
    con = connect(None)
    ingest_mod.ingest(con, [path])
    try:
        calls = stream_calls(con)
        gap = stream_gaps(con, calls)
        off = replay_served(profile, calls, online=True)[2]
        _, _, on, _, rw = replay_served(profile, calls, online=True, keep_alive_selection=True)
    finally:
        con.close()
    assert rw["keep_alive_selection"][WT]["served"] == "tool_p95"
    m = ~np.isnan(gap) & ~np.isnan(on)
    hit = lambda t: np.mean(gap[m] <= np.vectorize(held_ttl_s)(t[m]))   # noqa: E731
    assert hit(on) > hit(off) + 0.02
    # a hand-written serving loop gets exactly those TTLs
    records = [json.loads(line) for line in path.read_text().splitlines()]
    events = sorted([(r["t_arrival"], 1, i) for i, r in enumerate(records)]
                    + [(r["t_finish"], 0, i) for i, r in enumerate(records)])
    now = [0.0]
    pred = Predictor(profile, clock=lambda: now[0], keep_alive_selection=True)
    got = {}
    for t, kind, i in events:
        r, now[0] = records[i], t
        meta = {k: r[k] for k in ("workflow_type_id", "workflow_id", "agent_id")}
        if kind == 1:
            got[r["request_id"]] = pred.annotate_call(meta, request_id=r["request_id"]).keep_alive_ttl_s
        else:
            pred.observe({"app_metadata": meta, "request_id": r["request_id"], "output_tokens": r["output_tokens"]})
    np.testing.assert_array_equal(np.array([got[rid] for rid in calls["request_id"]], dtype=float), on)


def test_off_by_default_and_a_new_profile_forgets_the_evidence(profile):
    assert Predictor(profile).keep_alive_selector is None
    sel = KeepAliveSelector(min_outcomes=5)
    for i in range(60):
        sel.record(WT, 5.5 if i % 10 == 0 else 2.0 + 0.01 * i, (5.0, 5.0, 10.0, None))
    assert sel.served(WT) == "tool_p95"
    cold = KeepAliveSelector(min_outcomes=5, warm=False)
    for i in range(60):
        cold.record(WT, 5.5 if i % 10 == 0 else 2.0 + 0.01 * i, (5.0, 5.0, 10.0, None))
    Predictor(profile, keep_alive_selection=cold).load(profile)
    assert cold.served(WT) == "fitted" and cold.status() == {}
    # warm (the default): the old evidence is gone, the new profile's forward replay replaces it
    pred = Predictor(profile, keep_alive_selection=sel)
    pred.load(profile)
    st = sel.status()[WT]
    assert st["outcomes"] == 0 and st["switches"] == 0
    fresh = KeepAliveSelector()
    fresh.warm_start({WT: profile.data["idle_gap"]["workflow_types"][WT]["selection_warm_start"]})
    assert st == fresh.status()[WT]


# ------------------------------------------------------------------ warm start (fit time)
def test_the_warm_start_is_the_selectors_own_sums_in_closed_form():
    """warm_start_state over a replay equals recording the same gaps one by one (NaN: not
    offered, scored as the fitted TTL), so the server continues the evidence exactly."""
    rng = np.random.default_rng(5)
    n = 700
    gaps = rng.lognormal(1.0, 1.0, n)
    ttls = np.column_stack([rng.uniform(0.2, 30, n), rng.uniform(1, 200, n), np.full(n, 10.0),
                            np.where(rng.random(n) < 0.5, np.nan, 4.0)])
    state = warm_start_state(gaps, ttls, half_life=50.0)
    sel = KeepAliveSelector(half_life=50.0, min_outcomes=1e9)
    for g, t in zip(gaps, ttls):
        sel.record(WT, float(g), tuple(None if math.isnan(v) else float(v) for v in t))
    st = sel._types[WT]
    assert state["gaps"] == n
    assert state["sw"] == pytest.approx(st.sw) and state["sw2"] == pytest.approx(st.sw2)
    np.testing.assert_allclose(state["s1"], st.s1, rtol=1e-9)
    np.testing.assert_allclose(state["s2"], st.s2, rtol=1e-9)
    assert warm_start_state(np.array([np.nan]), np.full((1, 4), 3.0)) is None


def test_a_capped_warm_start_keeps_its_means_and_counts_for_at_most_warm_gaps():
    rng = np.random.default_rng(6)
    gaps = rng.uniform(0.5, 4.0, 2000)
    gaps[rng.random(2000) < 0.06] = 5.5          # past the fitted 5 s, within the p95 candidate's 10 s
    ttls = np.column_stack([np.full(2000, 5.0), np.full(2000, 10.0), np.full(2000, 5.0), np.full(2000, np.nan)])
    state = warm_start_state(gaps, ttls)
    full, capped = KeepAliveSelector(), KeepAliveSelector(warm_gaps=20)
    full.warm_start({WT: state})
    capped.warm_start({WT: state})
    a, b = full._types[WT], capped._types[WT]
    assert a.sw * a.sw / a.sw2 > 1000 and b.sw * b.sw / b.sw2 == pytest.approx(20)
    np.testing.assert_allclose(b.s1 / b.sw, a.s1 / a.sw)
    np.testing.assert_allclose(b.s2 / b.sw, a.s2 / a.sw)
    # the same means: served from the first call on the full replay; capped under the 30 gaps a
    # switch needs, the fitted TTL serves until the server's own gaps add up
    assert full.served(WT) == "idle_gap_p95" and capped.served(WT) == "fitted"


def test_the_fit_stores_the_forward_replay_and_the_server_serves_its_choice_from_the_first_call(profile):
    """The fixture's gaps have a 9–10 s tail the fitted 0.95 quantile misses and the tool's 10 s
    default covers: the training side's forward replay already puts ``tool_p95`` ahead, so the
    first call is served it (a cold selector serves the fitted TTL until 30 gaps are seen)."""
    warm = profile.data["idle_gap"]["workflow_types"][WT]["selection_warm_start"]
    assert warm["gaps"] == 30 * (CALLS - 1)     # the blocks after the first origin (half the workflows)
    meta = {"workflow_type_id": WT, "workflow_id": "new", "agent_id": "solo"}
    # 210 replayed gaps put it ahead by between one and two se: past a one-se margin, not the shipped two
    served = Predictor(profile, clock=lambda: 0.0, keep_alive_selection=KeepAliveSelector(margin=1.0)).annotate_call(meta)
    assert Predictor(profile, clock=lambda: 0.0, keep_alive_selection=True).annotate_call(meta).keep_alive_ttl_s < 10.0
    cold = Predictor(profile, clock=lambda: 0.0, keep_alive_selection=KeepAliveSelector(warm=False)).annotate_call(meta)
    fitted = Predictor(profile, clock=lambda: 0.0).annotate_call(meta)
    assert served.keep_alive_ttl_s == 10.0
    assert cold.keep_alive_ttl_s == fitted.keep_alive_ttl_s < 10.0


def test_a_stationary_set_keeps_the_fitted_ttl_from_the_first_call(tmp_path):
    """Stationary lognormal gaps, 7 % past the tool's 10 s default: no candidate is ahead on the
    training side's future (the plain p95 is the fitted quantile's twin, the tool's default covers
    less), so the warm start serves the fitted TTL (no exploration cost on a stationary set)."""
    rng = np.random.default_rng(11)
    rows = []
    for w in range(60):
        t = w * 1000.0
        for k in range(CALLS):
            rows.append({"request_id": f"r{w}-{k}", "workflow_type_id": WT, "workflow_id": f"w{w:05d}",
                         "agent_id": "solo", "call_index": k, "t_arrival": t, "t_finish": t + 1.0,
                         "input_tokens": 400, "output_tokens": 100})
            t += 1.0 + float(rng.lognormal(math.log(3.0), 0.8))
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prof, _ = fit_profile([path], tmp_path / "profile")
    sel = KeepAliveSelector()
    sel.warm_start({WT: prof.data["idle_gap"]["workflow_types"][WT]["selection_warm_start"]})
    assert sel.served(WT) == "fitted"
    tool = sel.status()[WT]["candidates"]["tool_p95"]["coverage"]
    assert tool < sel.status()[WT]["candidates"]["fitted"]["coverage"]
