"""Online selection of the served remaining-work order (issue 26 item 5; issue 37 item 1).

The fitted remaining-tokens candidate can drift between refits (the messy workload's release
``v2`` changes the loop the ``agent_calls`` level keys on). The Predictor can score, per workflow
type, the fit's candidates (the fitted table, the position median, ``mrl``) on the sessions that
end, and serve the one that ranks better than the served one beyond a margin
(:mod:`predictors.online_selection`); ``profiler eval --online`` scores what it serves. Injected
clocks, no sleeps."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fitting.profile_fit import fit_profile
from predictors.online_selection import RemainingSelector, concordance_diff, concordance_scores
from predictors.served import RW_CANDIDATES
from predictors.predictor import Predictor
from scoring.online_eval import event_order, online_scores, replay_served, stream_calls
from scoring.remaining_eval import baseline_predictions, concordance_pairs
from serving_hooks.settings import ServiceSettings
from predictors import remaining_tokens
from predictors.remaining_tokens import session_frame
from store import ingest as ingest_mod
from store.duckdb_store import connect
from store.split import split_logs
from store.workloads import generate, write_jsonl


def sessions(n: int, rng: np.random.Generator, good) -> list[tuple]:
    """``n`` overlapping sessions of 6 calls (session k starts at 10·k s, a call every 5 s);
    per call the truth R and the three candidates' figures (position median, mrl, fitted): the
    one ``good(k)`` names with 10 % noise, the others 300 %."""
    out = []
    for k in range(n):
        outs = rng.lognormal(5, 1, 6)
        r = np.cumsum(outs[::-1])[::-1]
        x = np.stack([r * rng.lognormal(0, 0.1 if c == good(k) else 3.0, 6) for c in RW_CANDIDATES], axis=1)
        t = 10.0 * k + 5.0 * np.arange(6)
        out.append((x, r, t, t[-1] + 5.0))
    return out


def feed(sel: RemainingSelector, stream: list[tuple], start: str = "fitted") -> list[str]:
    """Record every session (in end order); the candidate served after each."""
    served = []
    for x, r, t, end in sorted(stream, key=lambda s: s[3]):
        sel.record("wt", x, r, t, end, start)
        served.append(sel.served("wt"))
    return served


def test_concordance_diff_counts_pairs_the_way_the_c_index_does() -> None:
    r, r2 = np.array([1.0, 5.0]), np.array([3.0, 3.0])
    f, f2 = np.array([9.0, 1.0]), np.array([2.0, 2.0])     # f orders every pair wrong
    b, b2 = np.array([1.0, 5.0]), np.array([3.0, 3.0])     # b = the truth: every pair right
    gain, n = concordance_diff(f, b, r, f2, b2, r2)
    assert (gain, n) == (4.0, 4)
    gain, n = concordance_diff(f, b, r, f2, b2, r2, np.array([[True, False], [False, False]]))
    assert (gain, n) == (1.0, 1)
    # a tie of a candidate scores ½ a pair, as the C-index does
    sums, n = concordance_scores(np.stack([f, b, np.ones(2)], axis=1), r,
                                 np.stack([f2, b2, np.ones(2)], axis=1), r2)
    assert n == 4 and sums.tolist() == [0.0, 4.0, 2.0]


def test_a_stationary_stream_never_switches() -> None:
    rng = np.random.default_rng(0)
    sel = RemainingSelector()
    assert set(feed(sel, sessions(400, rng, lambda k: "fitted"))) == {"fitted"}
    st = sel.status()["wt"]
    assert st["served"] == "fitted" and st["switches"] == 0 and all(z < 0 for z in st["z"].values())
    assert st["served_sessions"]["fitted"] == st["sessions"] > 0
    # candidates that order every pair alike: d ≡ 0, never a switch (the fit's choice stays)
    same = RemainingSelector()
    stream = [(np.repeat(x[:, 2:], 3, axis=1), r, t, e) for x, r, t, e in sessions(100, rng, lambda k: "fitted")]
    assert set(feed(same, stream, start="mrl")) == {"mrl"} and same.status()["wt"]["z"] == {
        "position_median": None, "fitted": None}


def test_a_drifting_stream_switches_to_the_candidate_ahead_and_back() -> None:
    rng = np.random.default_rng(1)
    sel = RemainingSelector()
    served = feed(sel, sessions(300, rng, lambda k: "mrl" if 100 <= k < 200 else "fitted"))
    assert set(served[:100]) == {"fitted"}             # fitted better: kept
    first = served.index("mrl")
    # followed within about two half-lives (the earlier evidence, strongly for the fitted figure, decays)
    assert 100 < first < 100 + 2.5 * sel.half_life
    assert set(served[first:200]) == {"mrl"}           # and held while it lasts
    assert served[-1] == "fitted" and sel.status()["wt"]["switches"] == 2   # the fitted figure is back
    assert "position_median" not in served             # never the candidate that was behind


def test_sessions_run_one_at_a_time_are_paired_on_aligned_starts() -> None:
    """A log of runs that never overlap has no concurrent pair; ``profiler eval`` then pairs the
    sessions as if they had started together, and so does the selection."""
    rng = np.random.default_rng(3)
    stream = [(x, r, t + 100.0 * k - 10.0 * k, e + 90.0 * k)
              for k, (x, r, t, e) in enumerate(sessions(80, rng, lambda k: "mrl"))]
    assert all(a[3] < b[2][0] for a, b in zip(stream, stream[1:]))      # each ends before the next starts
    sel = RemainingSelector()
    served = feed(sel, stream)
    st = sel.status()["wt"]
    assert st["aligned"] == st["sessions"] == 79 and served[-1] == "mrl" and st["switches"] == 1


def test_a_type_starts_on_the_fits_candidate() -> None:
    rng = np.random.default_rng(2)
    sel = RemainingSelector()
    served = feed(sel, sessions(60, rng, lambda k: "position_median"), start="position_median")
    assert set(served) == {"position_median"} and sel.status()["wt"]["start"] == "position_median"


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="half_life"):
        RemainingSelector(half_life=0)


# --------------------------------------------------------------- through the Predictor
def tiny_profile() -> dict:
    """A profile with only a remaining-tokens section: type ``t``, two buckets, the fitted
    candidate keyed by agent (``a`` has 100 tokens left, ``b`` 10), the position median 50."""
    keys = {"": [10, 50.0, 50.0, 90.0], "b0": [10, 50.0, 50.0, 90.0], "b1": [10, 40.0, 40.0, 80.0],
            "b0|a": [5, 100.0, 100.0, 150.0], "b0|b": [5, 10.0, 10.0, 20.0],
            "b1|a": [5, 100.0, 100.0, 150.0], "b1|b": [5, 10.0, 10.0, 20.0]}
    entry = {"n_workflows": 10, "mean_out": 20.0, "agent_mean": {"a": 20.0, "b": 20.0},
             "buckets": [0, 1], "keys": keys}
    band = {"lo": 1, "hi": 900, "n": 500, "level": "agent"}
    return {"output_length": {"coverage": 0.99, "params": {"coverage": 0.99, "min_calls": 50},
                              "global": {**band, "level": "global"},
                              "workflow_types": {"t": {**band, "level": "workflow_type"}},
                              "agents": {"t": {"a": band, "b": band}}},
            "remaining_tokens": {"workflow_types": {"t": entry},
                                 "params": {"t": {"level": "agent", "point": "p50", "beta": 0.0,
                                                  "kappa": 0.0}},
                                 "baselines": {"t": {"position_median": {"0": 50.0, "1": 40.0},
                                                     "mrl": {"0": 50.0, "1": 40.0}}}}}


def test_the_predictor_serves_the_fits_figure_until_the_outcomes_say_otherwise() -> None:
    now = [0.0]
    off = Predictor.from_dict(tiny_profile(), clock=lambda: now[0], remaining_selection=False)
    assert off.remaining_selector is None
    assert Predictor.from_dict(tiny_profile()).remaining_selector is not None     # on by default
    meta = {"workflow_type_id": "t", "workflow_id": "w0", "agent_id": "a"}
    assert off.annotate_call(meta).expected_remaining_output_tokens == 100.0
    on = Predictor.from_dict(tiny_profile(), clock=lambda: now[0], session_idle_s=60.0,
                             remaining_selection=RemainingSelector(min_sessions=1.0))
    # agent b is said to have little left but writes the most: the fitted figure ranks wrong
    for k in range(12):
        for j, (agent, out) in enumerate((("a", 5), ("b", 200))):   # both arrive at 10·k s
            now[0] = 10.0 * k
            m = {"workflow_type_id": "t", "workflow_id": f"w{k}-{agent}", "agent_id": agent}
            ann = on.annotate_call(m, request_id=f"r{k}{j}")
            assert ann.expected_remaining_output_tokens is not None
            now[0] = 10.0 * k + 1
            on.observe({"app_metadata": m, "request_id": f"r{k}{j}", "output_tokens": out})
        # the a-session ends explicitly (5 s later); the b-session is left to go idle
        now[0] = 10.0 * k + 5
        assert on.end_session({"workflow_type_id": "t", "workflow_id": f"w{k}-a"})
    now[0] = 10_000.0
    on.expire_idle()                                  # idle expiry ends the b-sessions: scored
    st = on.remaining_selector.status()["t"]
    assert st["sessions"] >= 12 and st["served"] == "position_median"
    m = {"workflow_type_id": "t", "workflow_id": "new", "agent_id": "a"}
    assert on.annotate_call(m).expected_remaining_output_tokens == pytest.approx(50.0, rel=1e-6)
    assert not on.end_session({"workflow_type_id": "t", "workflow_id": "never"})
    # a new profile: its fitted candidate is new, the evidence about the old one is dropped
    on.load(SimpleNamespace(data=tiny_profile(), version="v2", manifest={}, path=None))
    assert on.remaining_selector.status() == {}
    assert on.annotate_call(m).expected_remaining_output_tokens == 100.0


def test_a_call_the_client_marks_last_call_ends_and_scores_its_session() -> None:
    """The gateway passes the client's ``app_metadata`` to ``observe``: a call marked
    ``last_call`` (the harness returned its final answer) ends its session there, so its true
    remaining work reaches the selector without waiting for idle expiry."""
    now = [0.0]
    on = Predictor.from_dict(tiny_profile(), clock=lambda: now[0], session_idle_s=1e9,
                             remaining_selection=RemainingSelector(min_sessions=1.0))
    for k in range(12):
        for j, (agent, out) in enumerate((("a", 5), ("b", 200))):
            now[0] = 10.0 * k
            m = {"workflow_type_id": "t", "workflow_id": f"w{k}-{agent}", "agent_id": agent}
            on.annotate_call(m, request_id=f"r{k}{j}")
            now[0] = 10.0 * k + 1
            on.observe({"app_metadata": {**m, "last_call": True}, "request_id": f"r{k}{j}",
                        "output_tokens": out})
    assert on.session_count() == 0                     # every session ended at its last call
    st = on.remaining_selector.status()["t"]
    assert st["sessions"] >= 12 and st["served"] == "position_median"
    off = Predictor.from_dict(tiny_profile(), clock=lambda: now[0], remaining_selection=False)
    m = {"workflow_type_id": "t", "workflow_id": "x", "agent_id": "a"}
    off.annotate_call(m, request_id="q")
    off.observe({"app_metadata": {**m, "last_call": True}, "request_id": "q", "output_tokens": 5})
    assert off.session_count() == 1                    # without selection the table is unchanged


def test_remaining_selection_is_a_service_setting_on_by_default() -> None:
    assert ServiceSettings().remaining_selection is True
    assert ServiceSettings(remaining_selection=False).remaining_selection is False


# ----------------------------------------------------- messy: a release changes the loop
@pytest.fixture(scope="module")
def messy_v2(tmp_path_factory: pytest.TempPathFactory):
    """Messy seed 1 split by time (train: the first 70 % of workflows, test: the rest, all v2):
    its fit picks the agent_calls level with a session factor, which v2's loop breaks. The fit's
    role check (``remaining_tokens.changed_roles``) is off here, as for a release that comes
    after the training data (nothing of it to see at fit time): what is left is the online
    selection's to follow."""
    work = tmp_path_factory.mktemp("messy_rw")
    write_jsonl(generate("messy", 200, seed=1), work / "messy.jsonl")
    split_logs([work / "messy.jsonl"], work / "split", train=0.7, seed=0, order="time")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(remaining_tokens, "ROLE_ALPHA", 0.0)
        profile, _ = fit_profile([work / "split" / "train"], work / "profile")
    con = connect(None)
    ingest_mod.ingest(con, [work / "split" / "test"])
    yield profile, con
    con.close()


def test_on_a_release_that_breaks_the_fitted_level_the_served_c_index_rises(messy_v2) -> None:
    profile, con = messy_v2
    assert profile.data["remaining_tokens"]["params"]["messy_app"]["level"] == "agent_calls"
    rw = online_scores(profile, con)["remaining_tokens"]
    assert rw["selection"]["messy_app"]["served"] != "fitted"
    assert rw["online"]["c_index"] > rw["static"]["c_index"]
    assert rw["online_minus_static"]["c_index_diff"] > 0
    assert rw["calls"] == len(stream_calls(con))


def test_served_equals_scored(messy_v2) -> None:
    """The figure the online block scores is the one a Predictor with the selection on serves
    (its JSON contract), driven by the same events: annotate at arrival, observe at finish,
    end_session after a workflow's last finish."""
    profile, con = messy_v2
    calls = stream_calls(con)
    scored = replay_served(profile, calls, online=True)[4]["served"]
    pred = Predictor(profile, max_sessions=1_000_000, remaining_selection=True)
    served = np.full(len(calls), np.nan)
    left = calls.groupby(["workflow_type_id", "workflow_id"]).size().to_dict()
    ta, tf = calls["t_arrival"].to_numpy(float), calls["t_finish"].to_numpy(float)
    for kind, k in event_order(ta, tf):
        row = calls.iloc[k]
        meta = {"workflow_type_id": row.workflow_type_id, "workflow_id": row.workflow_id,
                "agent_id": row.agent_id}
        if kind == 1:
            pred.clock = lambda t=ta[k]: t
            served[k] = pred.annotate(meta, request_id=row.request_id,
                                      input_tokens=int(row.input_tokens))["expected_remaining_output_tokens"]
            continue
        pred.clock = lambda t=max(ta[k], tf[k]): t
        pred.observe({"app_metadata": meta, "request_id": row.request_id,
                      "output_tokens": int(row.output_tokens), "t_finish": tf[k]})
        key = (row.workflow_type_id, row.workflow_id)
        left[key] -= 1
        if left[key] == 0:
            pred.end_session(meta)
    np.testing.assert_array_equal(served, scored)
    # and the block's C-index is the eval's concurrent-session C-index of exactly that figure
    c = calls.sort_values(["workflow_type_id", "workflow_id", "call_index"], kind="stable")
    frame = session_frame(c.reset_index(drop=True))
    wf = c.groupby(["workflow_type_id", "workflow_id"], sort=False).ngroup().to_numpy()
    end = c.groupby(wf)["t_finish"].max().to_numpy(float)
    ours = concordance_pairs({"x": served[c.index.to_numpy()]}, frame["R"].to_numpy(), wf,
                             c["t_arrival"].to_numpy(float), end)["x"][0]
    assert ours == pytest.approx(online_scores(profile, con)["remaining_tokens"]["online"]["c_index"])


def test_each_candidate_served_is_the_figure_eval_scores(messy_v2) -> None:
    """What the selection can serve is exactly what ``profiler eval`` scores under that name:
    the position median and ``mrl`` as :func:`scoring.remaining_eval.baseline_predictions` reads
    them, ``fitted`` the fit's cross-validated table candidate (its served figure here)."""
    profile, con = messy_v2
    pred = Predictor(profile, remaining_selection=False)
    m = pred._model
    section = profile.data["remaining_tokens"]
    calls = stream_calls(con).sort_values(["workflow_type_id", "workflow_id", "call_index"], kind="stable")
    frame = session_frame(calls.reset_index(drop=True))
    base = baseline_predictions(section, frame)
    wt = "messy_app"
    assert m.remaining.served_candidate(wt) == "fitted"
    for row in frame.sample(200, random_state=0).itertuples():
        got = {c: m.remaining_output(wt, int(row.i), row.agent_id, float(row.S), 0.0, 0, None, candidate=c).expected
               for c in ("position_median", "mrl")}
        assert got["position_median"] == base["position_median"][row.Index]
        assert got["mrl"] == base["mrl"][row.Index]
    served = m.remaining_output(wt, 3, "a", 10.0, 10.0, 1, 5.0)
    assert m.remaining_output(wt, 3, "a", 10.0, 10.0, 1, 5.0, candidate="fitted") == served
    with pytest.raises(ValueError, match="unknown remaining-tokens candidate"):
        m.remaining_output(wt, 3, "a", 10.0, 10.0, candidate="oracle")


def test_where_the_fit_serves_a_baseline_the_fitted_candidate_is_still_offered() -> None:
    """A type whose forward rule served a baseline starts there; ``fitted`` is the
    cross-validated table candidate the forward rule passed over (kept in ``selection``)."""
    prof = tiny_profile()
    rt = prof["remaining_tokens"]
    fitted = dict(rt["params"]["t"])
    rt["params"]["t"] = {"level": "baseline", "baseline": "mrl"}
    rt["selection"] = {"t": {"forward": {"served": "mrl", "fitted": fitted}}}
    pred = Predictor.from_dict(prof, remaining_selection=False)
    m = pred._model
    assert m.remaining.served_candidate("t") == "mrl"
    assert m.remaining.candidate_params("t", "fitted") == fitted
    assert m.remaining_output("t", 0, "a", 0.0, 0.0).expected == 50.0                       # mrl at index 0
    assert m.remaining_output("t", 0, "a", 0.0, 0.0, candidate="fitted").expected == 100.0  # the agent key
