"""What a serving policy decides in the simulator, split into three switchable parts.

* :class:`Router` — which replica a newly issued call goes to;
* :class:`Scheduler` — the order of a replica's waiting queue (``queue_key``, smallest first),
  whether a waiting call may preempt running ones when KV is short (``preemptive``) or when the
  running set is full (``slot_preemption``, SGLang's priority preemption), and which running
  call is preempted first (``victim_key``, largest first);
* :class:`CachePolicy` — the GPU and host eviction orders (``evict_key`` / ``host_key``, smallest
  evicted first) and lifecycle hooks that pin or release a session's KV.

A :class:`Policy` is a name plus one of each, so an ablation swaps one part
(``simulator.baselines`` builds the baselines, ``simulator.ours`` the policy under test).
Every part sees the running :class:`simulator.engine.Simulator` through ``bind``.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Protocol

import numpy as np

from simulator.config import ClusterConfig
from simulator.pools import Pools
from simulator.workload import Workload

#: A call in flight: :class:`simulator.engine.Request`. This module sits below the engine (the
#: engine imports it to drive the parts), so it names the engine's runtime types without
#: importing them; parts read the request's documented attributes.
Request = Any


class Simulator(Protocol):
    """What a part sees of the running simulator; :class:`simulator.engine.Simulator` is one.

    Declared here, not imported from the engine, so the arrow runs one way: the engine
    imports the policy interface, never the reverse."""

    now: float
    workload: Workload
    config: ClusterConfig
    pools: Pools | None
    replicas: list[Any]          # simulator.engine.Replica
    requests: list[Any]          # simulator.engine.Request | None, by call index
    wf_arrival: np.ndarray
    wf_left: np.ndarray

    def candidates(self, req: Request) -> list[Any]: ...
    def home_key(self, req: Request) -> object: ...
    def pool_queue_depths(self) -> dict[str, int] | None: ...
    def add_timer(self, t: float) -> None: ...
    def set_pool_members(self, pool: int, members: Any) -> None: ...
    def pool_of_replica(self, r: int) -> int | None: ...
    def reset_replica(self, r: int) -> None: ...
    def wake(self, r: int) -> None: ...
    def materialize(self, r: int, segs: Any) -> int: ...


class IdlePrefill(NamedTuple):
    """One chunk of background prefill on an idle replica (:meth:`Part.idle_prefill`):
    ``tokens`` computed from prompt ``position`` on, in a job that computes ``total`` tokens of a
    prefix ``context`` tokens long (the per-token prefill rate uses ``context / total``)."""
    tokens: int
    position: int
    context: int
    total: int


class Part:
    """Base of every policy part: bound to the simulator, told about lifecycle events."""

    sim: "Simulator"

    def bind(self, sim: "Simulator") -> None:
        self.sim = sim

    # lifecycle hooks (no-ops by default)
    def on_issue(self, req: "Request") -> None: ...
    def on_admit(self, req: "Request") -> None: ...
    def on_first_token(self, req: "Request") -> None: ...
    def on_finish(self, req: "Request") -> None: ...
    def on_preempt(self, req: "Request") -> None: ...
    def on_step(self, replica: int, dt: float, batch: list["Request"]) -> None: ...
    def on_timer(self) -> None: ...
    def on_replica_reset(self, replica: int) -> None:
        """Replica ``replica`` restarted with empty KV tiers (an autoscaler moved it)."""

    def idle_prefill(self, replica: int) -> IdlePrefill | None:
        """Background prefill for an idle replica: the next chunk, or None (the default: no
        idle-capacity work)."""
        return None


class Router(Part):
    def route(self, req: "Request") -> int:  # pragma: no cover - interface
        raise NotImplementedError


class Scheduler(Part):
    #: May a waiting call preempt running calls of a worse ``preempt_rank`` when KV is short?
    preemptive: bool = False
    #: May a waiting call preempt a running call (``may_preempt``) when the running set is at
    #: ``max_running_requests``? SGLang's ``--enable-priority-scheduling`` does exactly this
    #: (``PrefillAdder.preempt_to_schedule``, triggered when the batch is full of requests).
    slot_preemption: bool = False
    #: With ``slot_preemption``: may a waiting call that does not fit in KV preempt running calls
    #: it outranks by the threshold (``may_preempt``) to free tokens, as SGLang's
    #: ``preempt_to_schedule`` also does (``Simulator._admit_by_preemption``)?
    kv_preemption: bool = False
    #: Do priority preemptions swap the victim's KV to the host tier instead of dropping it?
    swap_on_preempt: bool = False
    #: Is a call's ``queue_key`` fixed once it is queued? Then the engine keeps each queue sorted
    #: by insertion (one key per call) instead of sorting it at every admission round.
    static_order: bool = False

    def queue_key(self, req: "Request") -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def new_queue(self) -> Any:
        """The container of one replica's waiting calls: a list (kept sorted by insertion when
        ``static_order``, else sorted by ``sort_key()`` at each admission). A scheduler that can
        find its head without sorting every call may return an object with the list operations
        the engine uses — ``append``, ``remove``, ``sort``, ``[0]``, ``len``, iteration — in
        the same order (``simulator.session_queue.SessionQueue``)."""
        return []

    def sort_key(self) -> Any:
        """The key function a queue is sorted with now (default: ``queue_key``); a scheduler
        may return a faster closure that gives the same order."""
        return self.queue_key

    def preempt_rank(self, req: "Request") -> Any:
        """Coarse class compared for priority preemption (default: the queue key itself)."""
        return self.queue_key(req)

    def victim_key(self, req: "Request") -> Any:
        """Running calls are preempted in decreasing ``victim_key`` (default: worst queue key)."""
        return self.queue_key(req)

    def may_preempt(self, waiting: "Request", running: "Request") -> bool:
        """Is ``waiting`` worth preempting ``running`` for? (default: strictly better rank)."""
        return self.preempt_rank(running) > self.preempt_rank(waiting)


def last_access_order(fn: Any) -> Any:
    """Mark an ``evict_key`` / ``host_key`` that *is* the tier's last access time of the segment
    (LRU): the cache then orders by those times directly instead of calling the key once per
    segment (same order; an override of the method is not marked and is called)."""
    fn.last_access = True
    return fn


class CachePolicy(Part):
    def evict_key(self, replica: int, seg: int, now: float) -> float:  # pragma: no cover
        raise NotImplementedError

    @last_access_order
    def host_key(self, replica: int, seg: int, now: float) -> float:
        """Host tier eviction order: LRU by default."""
        return self.sim.replicas[replica].cache.host.get(seg, 0.0)

    def to_host(self, replica: int, seg: int) -> bool:
        """Write a segment evicted from the GPU to the host tier? (default: yes)."""
        return True

    def gpu_order(self, replica: int) -> Any:
        """``evict_key`` of ``replica`` as the cache calls it, ``key(seg, now)``; None when it is
        the last access time (``last_access_order``: the cache reads the times directly). A
        policy may return a faster function giving the same keys."""
        if getattr(self.evict_key, "last_access", False):
            return None
        return functools.partial(self.evict_key, replica)

    def host_order(self, replica: int) -> Any:
        """``host_key`` of ``replica`` as ``key(seg, now)``, or None for LRU (as ``gpu_order``)."""
        if getattr(self.host_key, "last_access", False):
            return None
        return functools.partial(self.host_key, replica)


class Policy:
    """A named combination of a router, a scheduler and a cache policy."""

    def __init__(self, name: str, router: Router, scheduler: Scheduler, cache: CachePolicy,
                 description: str = "", extras: tuple[Part, ...] = ()) -> None:
        self.name = name
        self.router = router
        self.scheduler = scheduler
        self.cache = cache
        self.description = description
        self.parts: list[Part] = []
        #: hook name -> the parts' methods that implement it (:meth:`listeners`)
        self._hooks: dict[str, list] = {}
        # extras first: e.g. a prediction feed that annotates a call before it is routed
        for part in (*extras, router, scheduler, cache):
            if all(part is not p for p in self.parts):
                self.parts.append(part)

    def bind(self, sim: "Simulator") -> None:
        self._hooks.clear()
        for part in self.parts:
            part.bind(sim)

    def hook(self, name: str, *args: Any) -> None:
        """Call hook ``name`` on every part, in order (parts that leave it a no-op skipped)."""
        for fn in self.listeners(name):
            fn(*args)

    def listeners(self, name: str) -> list:
        """The parts' ``name`` methods that do something (not :class:`Part`'s no-op), in part
        order; found once per hook and forgotten when :meth:`add_part` changes the parts."""
        fns = self._hooks.get(name)
        if fns is None:
            noop = getattr(Part, name)
            fns = self._hooks[name] = [getattr(p, name) for p in self.parts
                                 if getattr(getattr(p, name), "__func__", None) is not noop]
        return fns

    def ask(self, name: str, *args: Any) -> Any:
        """The first part's answer to ``name(*args)`` that is not None (None if none has one)."""
        for part in self.parts:
            out = getattr(part, name)(*args)
            if out is not None:
                return out
        return None

    def add_part(self, part: Part) -> None:
        """Add a part after the others (an autoscaler or a feed a baseline lacks)."""
        if all(part is not p for p in self.parts):
            self.parts.append(part)
            self._hooks.clear()       # the listeners change with the parts
