"""Faithful re-implementations of the baselines the issue compares against.

Each baseline is a scheduler, a router and an eviction order, as its project documents it:
``sglang-default``, ``sglang-rr``, ``least-load``, ``autellix-plas``, ``continuum-ttl``,
``mori-idleness``, ``saga``, ``astraea``, ``belady``, ``oracle-srpt``, ``nat-hints``,
``sglang-sticky``, ``sglang-session-close``, ``thunderagent`` and ``observable-ref``. The table of
what each schedules, routes and evicts: docs/simulator.md, "Policies".

``nat-hints`` is built from data: its prediction trie is fit on the train split
(:data:`TRAINED_BASELINES`, given the train records; :mod:`simulator.baselines.nat_hints`).

``observable-ref`` (and its ``-mean`` / ``-calls`` variants) is the *non-clairvoyant* reference:
the best key given what is observable so far, its distribution read in-sample from the replayed
workflows (:mod:`simulator.baselines.observable`).

``belady`` and ``oracle-srpt`` read the replay's future: they are references, not deployable
policies and not bounds. ``oracle-srpt`` orders queues by true remaining work but keeps FCFS-era
routing and LRU; a policy that also routes and caches well can beat it. ``belady`` is the
optimal *eviction order* only under its own routing and scheduling; the fair comparison for
ours' eviction is ``ours-belady`` (ours' router and scheduler, Bélády's eviction).

Every baseline runs on the same hardware: the same replicas, GPU and host tiers, admission,
chunked prefill and preemption of :mod:`simulator.engine`.
"""
from __future__ import annotations

from typing import Callable, Sequence

from simulator.baselines.caches import LRU, Belady, ContinuumTTL, MoriIdleness
from simulator.baselines.nat_hints import nat_hints_policy
from simulator.baselines.observable import ObservableRemaining
from simulator.baselines.routers import AutellixRouter, CacheAware, LeastLoad, RoundRobin, StickyLeastLoad
from simulator.baselines.schedulers import FCFS, PLAS, OracleSRPT, ProgramFCFS
from simulator.baselines.sessions import (SessionRadixCache, StickyRouter, ThunderAgentCache, ThunderAgentControl,
                                          ThunderAgentRouter, ThunderAgentScheduler)
from simulator.baselines.seeds import AgentFairShare, AstraeaCache, AstraeaMLFQ, SagaCache, SagaRouter
from simulator.policy import Policy

BASELINES: dict[str, Callable[[], Policy]] = {
    "sglang-default": lambda: Policy("sglang-default", CacheAware(), FCFS(), LRU(),
                                     "FCFS, LRU eviction, SGLang router's default cache-aware "
                                     "routing (threshold 0.3, balance 64 / 1.5×)"),
    "sglang-rr": lambda: Policy("sglang-rr", RoundRobin(), FCFS(), LRU(),
                                "FCFS, LRU eviction, round-robin routing"),
    "least-load": lambda: Policy("least-load", LeastLoad(), FCFS(), LRU(),
                                 "FCFS, LRU, least outstanding tokens"),
    "autellix-plas": lambda: Policy("autellix-plas", AutellixRouter(), PLAS(), LRU(),
                                    "PLAS multi-level queues + anti-starvation, LRU, "
                                    "least-used routing with session pinning > 2048 tokens"),
    "continuum-ttl": lambda: Policy("continuum-ttl", StickyLeastLoad(), ProgramFCFS(), ContinuumTTL(),
                                    "program-level FCFS, TTL pins from tool running means"),
    "mori-idleness": lambda: Policy("mori-idleness", StickyLeastLoad(), FCFS(), MoriIdleness(),
                                    "idleness-ranked GPU/host placement"),
    "saga": lambda: Policy("saga", SagaRouter(), AgentFairShare(), SagaCache(),
                           "Agent Fair Share, workflow-aware LRU + tool-latency TTL, session "
                           "affinity with work stealing (simulator/baselines/seeds.py)"),
    "astraea": lambda: Policy("astraea", LeastLoad(), AstraeaMLFQ(), AstraeaCache(),
                              "state-aware MLFQ + HRRN aging, keep/swap/discard by memory "
                              "pressure (simulator/baselines/seeds.py)"),
    "belady": lambda: Policy("belady", StickyLeastLoad(), FCFS(), Belady(),
                             "offline-optimal (MIN) eviction, oracle of future accesses"),
    "oracle-srpt": lambda: Policy("oracle-srpt", StickyLeastLoad(), OracleSRPT(), LRU(),
                                  "clairvoyant workflow-level shortest remaining work first"),
    "sglang-sticky": lambda: Policy("sglang-sticky", StickyRouter(), FCFS(), LRU(),
                                    "FCFS, LRU, SGLang router --policy sticky (a session stays on "
                                    "its worker until idle > --sticky-idle-secs 600; new ones "
                                    "round robin)"),
    "sglang-session-close": lambda: Policy("sglang-session-close", StickyRouter(), FCFS(), SessionRadixCache(),
                                           "FCFS, SGLang router --policy sticky, "
                                           "--enable-session-radix-cache: an open session's KV is "
                                           "evicted after all unreferenced KV, dereferenced by "
                                           "close_session at the session's true end"),
    "thunderagent": lambda: _thunderagent(),
    "observable-ref": lambda: Policy("observable-ref", StickyLeastLoad(),
                                     ObservableRemaining(neighbours=50), LRU(),
                                     "reference (non-clairvoyant, in-sample): Gittins rank of the "
                                     "remaining output tokens given workflow type, calls done and "
                                     "output tokens so far (the 50 closest other sessions)"),
    "observable-ref-distinct": lambda: Policy("observable-ref-distinct", StickyLeastLoad(),
                                              ObservableRemaining(neighbours=50,
                                                                  distinct_sources=True), LRU(),
                                              "reference (non-clairvoyant, in-sample): "
                                              "observable-ref without the session's own copies "
                                              "in the replay (their future is its own)"),
    "observable-ref-mean": lambda: Policy("observable-ref-mean", StickyLeastLoad(),
                                          ObservableRemaining(key="mean", neighbours=50), LRU(),
                                          "reference (non-clairvoyant, in-sample): mean remaining "
                                          "output tokens given workflow type, calls done and "
                                          "output tokens so far"),
    "observable-ref-agents": lambda: Policy("observable-ref-agents", StickyLeastLoad(),
                                            ObservableRemaining(neighbours=50, by_agent=True), LRU(),
                                            "reference (non-clairvoyant, in-sample): Gittins rank "
                                            "given workflow type, calls done and each agent's "
                                            "output tokens so far (the 50 closest other sessions)"),
    "observable-ref-calls": lambda: Policy("observable-ref-calls", StickyLeastLoad(),
                                           ObservableRemaining(), LRU(),
                                           "reference (non-clairvoyant, in-sample): Gittins rank "
                                           "given workflow type and calls done only"),
}

def _thunderagent() -> Policy:
    control = ThunderAgentControl()
    return Policy("thunderagent", ThunderAgentRouter(control), ThunderAgentScheduler(control),
                  ThunderAgentCache(control),
                  "Dynamo ThunderAgent program scheduler: pause tool-waiting programs over 0.95 of "
                  "GPU+host KV, resume smallest first under 0.85 (BFD), paused KV evicted first; "
                  "Dynamo KV router", extras=(control,))


#: Baselines fit on the train split: name -> factory of the train records.
TRAINED_BASELINES: dict[str, Callable[[Sequence[dict]], Policy]] = {
    "nat-hints": nat_hints_policy,
}

__all__ = ["BASELINES", "TRAINED_BASELINES", "LRU", "Belady", "ContinuumTTL", "MoriIdleness", "AutellixRouter", "CacheAware",
           "LeastLoad", "RoundRobin", "StickyLeastLoad", "FCFS", "PLAS", "OracleSRPT", "ProgramFCFS",
           "ObservableRemaining", "StickyRouter", "SessionRadixCache", "ThunderAgentControl",
           "SagaRouter", "SagaCache", "AgentFairShare", "AstraeaMLFQ", "AstraeaCache"]
