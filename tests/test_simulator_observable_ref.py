"""The non-clairvoyant reference (``observable-ref``): the Gittins rank of the remaining work
given what is observable, its distribution read from the *other* replayed workflows."""
from __future__ import annotations

import numpy as np
import pytest

from simulator.baselines import BASELINES
from simulator.baselines.observable import ObservableRemaining, gittins_rank
from simulator.config import ClusterConfig
from simulator.engine import Simulator
from simulator.workload import workload_from_records
from tests.simulator_helpers import STEP, rec

CFG = ClusterConfig(replicas=1, step=STEP, host_ratio=0.0, new_token_ratio=0.0, max_running_requests=1)


def test_gittins_rank_by_hand_and_where_it_differs_from_the_mean():
    assert gittins_rank([10, 10, 10]) == pytest.approx(10.0)
    # R = 1 or 100 with equal odds: a budget of 1 costs E[min(R, 1)] = 1 for a 1/2 chance of
    # finishing -> 2; a budget of 100 costs 50.5 for certainty -> 50.5; the rank is the smaller
    assert gittins_rank([1, 100]) == pytest.approx(2.0)
    assert gittins_rank([100, 1]) == pytest.approx(2.0)          # order of the draws is irrelevant
    # against a sure 30: the mean puts the sure job first (30 < 50.5), Gittins the gamble (2 < 30)
    assert np.mean([1, 100]) > 30 > gittins_rank([1, 100])
    assert gittins_rank([]) == float("inf")


def _typed(wf: str, wtype: str, outs: list[int]) -> list[dict]:
    return [rec(wf, i, float(i), float(i) + 1, 10, o, workflow_type_id=wtype) for i, o in enumerate(outs)]


def _bound(recs: list[dict], sched: ObservableRemaining) -> tuple[ObservableRemaining, dict[str, int]]:
    wl = workload_from_records(recs)
    sim = Simulator(wl, BASELINES["oracle-srpt"](), CFG, [0.0] * len(wl.workflows))
    sched.bind(sim)
    return sched, {w.workflow_id: w.idx for w in wl.workflows}


def test_a_session_never_ranks_on_its_own_future():
    base = _typed("A", "t", [5, 5]) + _typed("B", "t", [50]) + _typed("C", "t", [7, 7, 7])
    longer = _typed("A", "t", [500, 500]) + _typed("B", "t", [50]) + _typed("C", "t", [7, 7, 7])
    s1, ids = _bound(base, ObservableRemaining(key="mean"))
    s2, _ = _bound(longer, ObservableRemaining(key="mean"))
    a = ids["A"]
    # A's own outputs change nothing of its key: it is the mean of the other two sessions' totals
    assert s1.rank[a] == s2.rank[a] == pytest.approx((50 + 21) / 2)
    # ... while the others' keys see A's work
    assert s1.rank[ids["B"]] != s2.rank[ids["B"]]


def test_calls_done_and_tokens_so_far_condition_the_draws():
    recs = (_typed("S1", "t", [4]) + _typed("S2", "t", [6])          # one call each
            + _typed("L1", "t", [100, 300]) + _typed("L2", "t", [10, 30])
            + _typed("X", "t", [90, 200]))
    sched, ids = _bound(recs, ObservableRemaining(key="mean"))
    x = ids["X"]
    assert sched.rank[x] == pytest.approx((4 + 6 + 400 + 40) / 4)
    # X finished its first call (90 tokens): only sessions with a second call are draws
    req = type("R", (), {"wf": x, "call": type("C", (), {"output_tokens": 90})()})()
    sched.on_finish(req)
    assert sched.rank[x] == pytest.approx((300 + 30) / 2)
    # with one neighbour, the draw whose first call was closest in tokens (L1: 100 vs 90)
    near, ids = _bound(recs, ObservableRemaining(key="mean", neighbours=1))
    near.on_finish(req)
    assert near.rank[x] == pytest.approx(300)


def test_the_reference_serves_the_application_with_less_work_first():
    # one slot; two applications, the long one's sessions issued first: FCFS serves them first,
    # the reference (knowing only each session's type) serves the short ones first
    recs = (_typed("L1", "long", [40]) + _typed("L2", "long", [40])
            + _typed("S1", "short", [5]) + _typed("S2", "short", [5]))
    wl = workload_from_records(recs)
    res = Simulator(wl, BASELINES["observable-ref"](), CFG, [0.0, 0.0, 0.0, 0.0]).run()
    by_id = {r.call.request_id: r for r in res.requests}
    assert max(by_id[f"S{i}#0"].t_finish for i in (1, 2)) < min(by_id[f"L{i}#0"].t_first for i in (1, 2))
    fcfs = Simulator(workload_from_records(recs), BASELINES["belady"](), CFG, [0.0] * 4).run()
    by_id = {r.call.request_id: r for r in fcfs.requests}
    assert by_id["L1#0"].t_finish < by_id["S1#0"].t_first


def test_bad_options_are_refused_with_one_line():
    with pytest.raises(ValueError, match="key 'median'"):
        ObservableRemaining(key="median")
    with pytest.raises(ValueError, match="neighbours 0"):
        ObservableRemaining(neighbours=0)


def test_by_agent_neighbours_match_each_agents_tokens_not_the_total():
    def two(wf: str, first: tuple[str, int], later: int) -> list[dict]:
        agent, out = first
        return [rec(wf, 0, 0.0, 1.0, 10, out, workflow_type_id="t", agent_id=agent),
                rec(wf, 1, 1.0, 2.0, 10, later, workflow_type_id="t", agent_id="b")]
    # P's first call is agent a's (100 tokens), Q's agent b's (100 tokens): same total, other agent
    recs = two("Q", ("b", 100), 10) + two("P", ("a", 100), 1000) + two("X", ("a", 100), 500)
    req = type("R", (), {"wf": None, "call": type("C", (), {"output_tokens": 100, "agent": "a"})()})()
    total, ids = _bound(recs, ObservableRemaining(key="mean", neighbours=1))
    agents, _ = _bound(recs, ObservableRemaining(key="mean", neighbours=1, by_agent=True))
    req.wf = ids["X"]
    total.on_finish(req)
    agents.on_finish(req)
    assert agents.rank[ids["X"]] == pytest.approx(1000)      # P: agent a wrote 100, as X's did
    # on the total Q and P tie (100 each): the first in replay order, Q, is taken
    assert total.rank[ids["X"]] == pytest.approx(10)


def test_distinct_sources_leaves_out_the_sessions_own_copies():
    """A replay's copies of one recorded workflow (``<id>~k``) share its future: by default a copy
    ranks on its twin's recorded remaining work; ``distinct_sources`` leaves every copy of the same
    source out, so only other recorded workflows are draws."""
    recs = (_typed("A~0", "t", [5, 500]) + _typed("A~1", "t", [5, 500])
            + _typed("B~2", "t", [50]) + _typed("C~3", "t", [7, 7]))
    leaky, ids = _bound(recs, ObservableRemaining(key="mean"))
    clean, _ = _bound(recs, ObservableRemaining(key="mean", distinct_sources=True))
    a = ids["A~0"]
    assert leaky.rank[a] == pytest.approx((505 + 50 + 14) / 3)   # its twin A~1 is a draw
    assert clean.rank[a] == pytest.approx((50 + 14) / 2)         # only B and C
    assert clean.rank[ids["B~2"]] == pytest.approx((505 + 505 + 14) / 3)   # both A copies count
