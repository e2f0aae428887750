"""The capacity router against three real HTTP workers on loopback that report /v1/loads."""
from __future__ import annotations

import threading

import pytest
from fastapi import FastAPI, HTTPException

from policies import CapacityPolicy
from predictors.contract import Annotation
from serving_hooks.routing import CapacityRouter, WorkerLoad, parse_loads
from serving_hooks.server_thread import serve_in_thread


class FakeWorker:
    """A FastAPI app on an ephemeral loopback port that answers GET /v1/loads like SGLang."""

    def __init__(self, capacity: int, used: int, waiting: int = 0, has_loads: bool = True):
        self.capacity, self.used, self.waiting, self.has_loads = capacity, used, waiting, has_loads
        self.polls = 0
        self._polled = threading.Condition()
        self.app = FastAPI()

        @self.app.get("/v1/loads")
        def loads():
            with self._polled:
                self.polls += 1
                self._polled.notify_all()
            if not self.has_loads:
                raise HTTPException(404, "Not Found")
            return {"timestamp": "now", "version": "0.5.23", "loads": [
                {"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": self.waiting,
                 "num_used_tokens": self.used, "num_total_tokens": self.used,
                 "max_total_num_tokens": self.capacity, "token_usage": self.used / self.capacity}]}

    def wait_polls(self, n: int, timeout: float = 60.0) -> None:
        """Block until this worker has been polled ``n`` more times. Woken by the poll itself,
        not a deadline race; ``timeout`` only bounds a poller that never comes."""
        with self._polled:
            target = self.polls + n
            assert self._polled.wait_for(lambda: self.polls >= target, timeout), "router stopped polling"

    def __enter__(self):
        self.handle = serve_in_thread(self.app, lifespan="off")
        self.url = self.handle.url
        return self

    def __exit__(self, *exc):
        self.handle.stop()


@pytest.fixture
def workers():
    # w0: nearly full; w1: roomy 1000-token worker; w2: large but busy
    ws = [FakeWorker(1000, 900), FakeWorker(1000, 100, waiting=3), FakeWorker(4000, 3500)]
    for w in ws:
        w.__enter__()
    yield ws
    for w in ws:
        w.__exit__()


def test_request_that_would_overflow_under_the_predicted_bound_is_not_sent_there(workers):
    w0, w1, w2 = workers
    router = CapacityRouter([w.url for w in workers], CapacityPolicy(epsilon=0.05), timeout_s=30.0)
    router.poll_once_blocking()
    assert router.queue_depths()[w1.url] == 3
    # 150 input + 100 predicted: w0 would hold 900 + 250 > 1000 -> never w0.
    # w1 headroom 1000-100-250 = 650, w2 4000-3500-250 = 250 -> w1 first.
    chosen = []
    for i in range(6):
        d = router.decide(f"s{i}", 150, 100, alpha=0.01, request_id=f"r{i}")
        chosen.append(d.worker)
        if d.mode == "capacity":
            check = {c.name: c for c in d.placement.checks}[d.worker]
            assert check.safe and check.fits
    # Requests sent after the poll are added to the worker's reported count (100 on w1, 3500 on w2):
    #   r0: w1 headroom 1000-100-250 = 650 vs w2 250 -> w1;  r1: w1 1000-350-250 = 400 -> w1
    #   r2: w1 150 < w2 250 -> w2;  r3: w1 150 vs w2 4000-3750-250 = 0 -> w1
    #   r4: w1 850 + 250 > 1000 (would overflow) -> w2 (fits exactly);  r5: nothing is safe -> fallback
    assert chosen[:5] == [w1.url, w1.url, w2.url, w1.url, w2.url]
    assert w0.url not in chosen  # 900 + 250 > 1000 on w0, every time
    assert router.inflight()[w1.url] == 750 and router.inflight()[w0.url] == 0
    m = router.metrics()
    assert m["capacity"] == 5 and m["fallback"] == 1 and m["fallbacks"] == 1
    assert m["decisions"] == 6 and m["moved_sessions"] == 0      # six new sessions: nothing moved

    # finishing requests frees their bounds: w1 is safe again
    for i in range(6):
        router.on_finish(f"r{i}")
    assert router.decide("sX", 150, 100).worker == w1.url
    # 600 + 300 fits only on w1 (100 + 900 <= 1000; w2 3500 + 900 > 4000)
    assert router.decide("sY", 600, 300).worker == w1.url
    # 700 + 300 fits nowhere: least-loaded fallback, never a silent overflow claim
    assert router.decide("sZ", 700, 300).mode == "fallback"


def test_union_bound_refuses_a_worker_with_many_risky_requests(workers):
    w0, w1, w2 = workers
    w2.used = 0  # w2 now has 4000 free tokens: most headroom
    router = CapacityRouter([w.url for w in workers], CapacityPolicy(epsilon=0.05), timeout_s=30.0)
    router.poll_once_blocking()
    # two risky requests tracked on w2 (α = 0.02 each)
    router.on_start("a", w2.url, 10, 10, alpha=0.02)
    router.on_start("b", w2.url, 10, 10, alpha=0.02)
    # a third risky one: w2 risk 0.06 > 0.05 -> refused although it has room; w1 takes it
    d = router.decide("s", 100, 100, alpha=0.02)
    assert d.worker == w1.url and d.mode == "capacity"
    assert not {c.name: c for c in d.placement.checks}[w2.url].safe
    # a confident request (α = 0.005) still fits w2's budget: 0.045 <= 0.05
    assert router.decide("s2", 100, 100, alpha=0.005).worker == w2.url


def test_a_worker_without_loads_endpoint_keeps_affinity_never_round_robin(workers):
    workers[2].has_loads = False
    # a generous poll timeout and a fixed clock: on a loaded machine a healthy worker's report
    # must neither time out (0.5 s by default) nor go stale before the decisions
    router = CapacityRouter([w.url for w in workers], timeout_s=30.0, clock=lambda: 0.0)
    router.poll_once_blocking()
    # no capacity known for w2: new sessions go to the fewest reserved tokens (in turn on ties),
    # a returning session to its last worker, whatever the turn
    first = [router.decide(f"s{i}", 150, 100, request_id=f"r{i}").worker for i in range(3)]
    assert sorted(first) == sorted(w.url for w in workers)       # spread, not piled on one
    again = [router.decide(f"s{i}", 150, 100, request_id=f"q{i}").worker for i in range(3)]
    assert again == first
    m = router.metrics()
    assert m["no_report"] == 6 and m["poll_errors"] == 1 and m["poll_ok"] == 2
    assert m["affinity"] == 3 and m["moved_sessions"] == 0 and "round_robin" not in m


def test_a_stale_report_keeps_the_session_on_its_worker(workers):
    """Reports older than ``stale_after_s`` are judged on the router's own record (the last
    capacity, the requests it sent): the session stays where its prefix is."""
    w0, w1, w2 = workers
    now = [0.0]
    router = CapacityRouter([w.url for w in workers], clock=lambda: now[0], stale_after_s=1.0)
    router.poll_once_blocking()
    d = router.decide("sess", 150, 100, request_id="a")
    assert d.worker == w1.url and d.mode == "capacity" and router.metrics()["stale"] == 0
    router.on_finish("a")
    now[0] = 5.0                      # every report is 5 s old now
    for i in range(4):
        d = router.decide("sess", 150, 100, request_id=f"b{i}")
        assert d.worker == w1.url and d.placement.affinity
    m = router.metrics()
    assert m["stale"] == 4 and m["moved_sessions"] == 0 and m["decisions"] == 5
    # on the router's own record w0 is empty (its 900 reported tokens are stale): a new
    # session takes the most headroom there
    assert router.decide("new", 150, 100).worker == w2.url   # 4000 capacity, nothing sent


def test_background_poller_follows_load_changes_and_affinity(workers):
    w0, w1, w2 = workers
    # a 30 s poll timeout and a 60 s staleness bound: on a loaded machine a 0.5 s poll can time out
    # and a 1 s-old report go stale, and then the router rightly judges w0 on what it sent (seen
    # in the no-SGLang CI run: "other" went to w1). Staleness is tested below with stale_after_s 0.
    router = CapacityRouter([w.url for w in workers], poll_interval_s=0.05, timeout_s=30.0, stale_after_s=60.0)
    router.start_background()
    try:
        for w in workers:  # the second poll starts after the first one's answer was taken in
            w.wait_polls(2)
        assert len(router.loads()) == 3
        assert router.decide("sess", 150, 100).worker == w1.url
        w0.used = 0  # w0 drains: now the roomiest
        w0.wait_polls(2)
        # w0 headroom 1000-0-250 = 750 vs w1 650: 100 apart, more than the 5 % slack (50)
        assert router.decide("other", 150, 100).worker == w0.url
        router.on_start("x", w1.url, 0, 0, session_id="sess")  # the session last ran on w1
        w1.used = 60  # w1 headroom 690: 60 behind w0; with a 7 % slack (70) that is a tie
        router.policy = CapacityPolicy(affinity_slack=0.07)
        w1.wait_polls(2)
        d = router.decide("sess", 150, 100)
        assert d.worker == w1.url and d.placement.affinity  # the session's last worker wins the tie
    finally:
        router.stop_background()
    # reports go stale once polling stops: the session still goes to its last worker
    router.stale_after_s = 0.0
    d = router.decide("sess", 1, 1)
    assert d.worker == w1.url and d.mode == "capacity" and router.metrics()["stale"] >= 1


def test_parse_loads_shapes():
    body = {"loads": [{"max_total_num_tokens": 100, "num_total_tokens": 10, "num_waiting_reqs": 1},
                      {"max_total_num_tokens": 50, "num_used_tokens": 5}]}
    load = parse_loads(body, 1.0)
    assert (load.capacity_tokens, load.reported_tokens, load.waiting_requests) == (150, 15, 1)
    assert parse_loads({"max_total_num_tokens": 10}, 0.0).capacity_tokens == 10
    assert parse_loads({"loads": []}, 0.0) is None
    assert parse_loads([1, 2], 0.0) is None
    assert parse_loads({"max_total_num_tokens": "x"}, 0.0) is None
    with pytest.raises(ValueError):
        CapacityRouter([])


def test_the_gateway_keeps_each_agents_prefix_for_the_move_rule():
    """``decide`` / ``decide_annotated`` key the per-agent prefix ledger by the call's agent: a
    session's second agent sees the first one's prefix as what a move would leave behind."""
    router = CapacityRouter(["http://a", "http://b"], clock=lambda: 0.0)
    for w in router.workers:
        router.note_load(w, WorkerLoad(10_000, 0, 0, 0.0, 0.0))
    first = router.decide("s", 300, 100, request_id="r1", expected_out=50.0, agent_id="planner")
    ann = Annotation("v", True, "wt", "s", "coder", predicted_output_len=(10, 100), output_len_mean=50.0)
    second = router.decide_annotated("r2", "s", 200, ann)
    assert second.worker == first.worker
    assert router.ledger.left_behind("s", first.worker, "coder") == 350      # 300 + 50
    assert router.ledger.left_behind("s", first.worker, "planner") == 250    # 200 + 50
    assert router.metrics()["move_left_behind_tokens"] == 0                  # nothing moved
