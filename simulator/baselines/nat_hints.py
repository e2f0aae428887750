"""``nat-hints``: NVIDIA NeMo Agent Toolkit's prediction trie, served the way Dynamo uses its hints.

A **baseline of what a team running NAT on Dynamo deploys today**: the trie as
:mod:`predictors.nat_trie` describes it (NAT's ``trie_builder.py``, ``metrics_accumulator.py`` and
``dynamo_llm.py`` at commit 325afac; pull requests #1648 and #1634 for the ``nvext`` fields and
the 1–5 ``latency_sensitivity`` sent as the request's priority), served as Dynamo documents:

* Dynamo docs, "Agent Hints" (``latency_sensitivity`` in seconds shifts a request's effective
  arrival earlier in the router queue) and "KV Router" (default ``--router-mode kv``: per worker
  ``cost = overlap_weight × prefill blocks + active decode blocks``, ``overlap_weight`` 1,
  temperature 0 → the cheapest worker; host-tier prefix hits credited at 0.75).

What runs in the simulator:

* **trie** (:class:`predictors.nat_trie.PredictionTrie`, the one implementation, shared with
  ``profiler eval``'s ``baselines.nat_trie``) — fit on the *train split* (the records the profile is fit
  on, never the replayed ones). Path = (workflow type, agent): the workflow is NAT's parent
  function, the agent its function;
* **scheduler** (:class:`LatencySensitivityFCFS`) — FCFS on the effective arrival
  ``t_issue − latency_sensitivity`` seconds (Dynamo's documented use of the hint);
* **router** (:class:`DynamoKVRouter`) — the KV router's cost on each replica of the call's pool,
  from the replica's real cache state (Dynamo's KV events) and its outstanding tokens;
* **cache** (:class:`HintTTLCache`) — LRU plus ``nvext.cache_control``: after a call the
  session's prefix is pinned for ``ttl = total_requests × iat`` (remaining calls × inter-arrival
  of the trie's prediction), unpinned when the session's next call arrives or the TTL ends.

Assumptions where the sources did not settle a detail: the four sensitivity signals are weighted
equally, each min–max normalised within its trace, and mapped to 1–5 (``1 + round(4 × score)``);
the node's sensitivity is the rounded mean over its samples. NAT's custom ``processor.py``
router (stickiness from ``total_requests`` and ``iat``) is an example component, not Dynamo's
default router, so it is not modelled; Dynamo has since deprecated ``cache_control`` (the TTL pin
is kept here because it is what NAT sends).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from predictors.nat_trie import CallPrediction, Metrics, PredictionTrie, _sensitivities  # noqa: F401 (re-exported)
from simulator.baselines.caches import LRU
from simulator.engine import Request
from simulator.policy import Policy, Router, Scheduler


@dataclass
class Hints:
    """The ``nvext`` hints NAT sends with one request (numbers, not NAT's LOW/MEDIUM/HIGH)."""

    total_requests: float
    osl: float
    iat_s: float
    latency_sensitivity: float


class HintFeed(Scheduler):
    """Attaches NAT's hints to each issued call (``req.hints``), counting the call index
    of its agent in its workflow as NAT's call tracker does. Orders nothing itself."""

    def __init__(self, trie: PredictionTrie) -> None:
        self.trie = trie
        self.counts: dict[tuple[int, str], int] = defaultdict(int)

    def hints(self, req: Request) -> Hints:
        key = (req.wf, req.call.agent)
        if req.hints is not None:
            return req.hints
        self.counts[key] += 1
        wtype = self.sim.workload.workflows[req.wf].workflow_type
        p = self.trie.find(wtype, req.call.agent, self.counts[key])
        h = (Hints(0.0, 0.0, 0.0, 0.0) if p is None else
             Hints(p.remaining_calls.mean, p.output_tokens.p90, p.interarrival_ms.mean / 1000.0,
                   float(p.latency_sensitivity or 0)))
        req.hints = h
        return h


class LatencySensitivityFCFS(HintFeed):
    """Dynamo's queue order with ``latency_sensitivity``: FCFS on ``t_issue − sensitivity`` (s)."""

    static_order = True

    def on_issue(self, req: Request) -> None:
        self.hints(req)

    def queue_key(self, req: Request) -> tuple:
        return (req.t_issue - self.hints(req).latency_sensitivity, req.idx)


class DynamoKVRouter(Router):
    """Dynamo's default KV router: the replica of least ``overlap_weight × prefill tokens +
    outstanding tokens`` (block counts × block size: the ratio is the same), where prefill
    tokens are the prompt minus its cached prefix there (GPU hits in full, host hits credited
    at ``host_credit``) and outstanding tokens the running calls' KV plus the waiting prompts."""

    def __init__(self, overlap_weight: float = 1.0, host_credit: float = 0.75) -> None:
        self.overlap_weight = overlap_weight
        self.host_credit = host_credit

    def route(self, req: Request) -> int:
        call = req.call
        best, best_r = math.inf, -1
        for rep in self.sim.candidates(req):
            gpu, host, _ = rep.cache.match(call.path)
            prefill = call.input_tokens - gpu - self.host_credit * host
            cost = self.overlap_weight * prefill + rep.load_tokens()
            if cost < best:
                best, best_r = cost, rep.idx
        return best_r


class HintTTLCache(LRU):
    """LRU plus NAT's ``cache_control`` pin: after a call with children the session's prefix
    stays on its replica's GPU for ``total_requests × iat`` seconds, or until its next call."""

    def __init__(self, feed: HintFeed) -> None:
        self.feed = feed
        self.pins: dict[int, tuple[int, tuple[int, ...]]] = {}

    def on_finish(self, req: Request) -> None:
        call = req.call
        if not call.children:
            return
        h = self.feed.hints(req)
        ttl = h.total_requests * h.iat_s
        if ttl <= 0:
            return
        self._release(req.wf)
        segs = tuple(call.path) + (call.own_seg,)
        cache = self.sim.replicas[req.replica].cache
        until = self.sim.now + ttl
        for s in segs:
            cache.pin(s, until)
        self.sim.add_timer(until)
        self.pins[req.wf] = (req.replica, segs)

    def on_issue(self, req: Request) -> None:
        self._release(req.wf)

    def _release(self, wf: int) -> None:
        pin = self.pins.pop(wf, None)
        if pin is not None:
            cache = self.sim.replicas[pin[0]].cache
            for s in pin[1]:
                cache.unpin(s)


def nat_hints_policy(train_records: Sequence[dict]) -> Policy:
    """The ``nat-hints`` baseline, its trie fit on ``train_records`` (the train split)."""
    trie = PredictionTrie().fit(train_records)
    sched = LatencySensitivityFCFS(trie)
    return Policy("nat-hints", DynamoKVRouter(), sched, HintTTLCache(sched),
                  "NAT-style hints (NeMo Agent Toolkit prediction trie fit on the train split): "
                  "Dynamo KV router, FCFS shifted by latency sensitivity, KV pinned for "
                  "remaining calls × inter-arrival")


__all__ = ["PredictionTrie", "CallPrediction", "Metrics", "DynamoKVRouter",
           "LatencySensitivityFCFS", "HintTTLCache", "nat_hints_policy"]
