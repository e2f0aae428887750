"""Model pools: which replicas serve which model, and which model each agent calls.

In a multi-model workflow the agents call different models (a planner on a large model, coders
on a code model, a verifier on a small one), each served by its own *pool* of replicas. Two
decisions need the pools:

* **routing** — a call may only go to a replica of the model it names (the request's ``model``
  field, as an OpenAI-compatible router routes by model);
* **priority** — the idle-downstream term of Pythia's rule
  (:class:`~policies.priority.PriorityPolicy`):
  ``w2 · Σ_{m idle} 1 / E[D_m]`` rewards a workflow whose next calls soon reach a pool that is
  about to idle. It needs each pool's waiting-queue depth (the sum of its replicas' waiting
  requests) and the agent → pool map (distances in the profile are to *agents*; queues belong
  to *pools*).

:class:`ModelPools` keeps both, with no HTTP, threads or clock (the gateway's router feeds it
the replicas' load reports; the simulator keeps its pools as replica indices,
:mod:`simulator.pools`, and sums its replicas' waiting calls per pool the same way in
``Simulator.pool_queue_depths``). The agent → pool map is
learned from the traffic itself: the pool a ``(workflow type, agent)`` called last — the
logs' ``model`` field is optional, and the traffic is the truth about where an agent's calls go.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping


def pool_queue_depths(replica_depth: Mapping[str, int],
                      pool_replicas: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """Waiting requests per pool, ``Σ_{r ∈ pool} depth(r)``. A pool with a replica that has not
    reported is left out: its depth is unknown, so it is never taken for idle."""
    out: dict[str, int] = {}
    for pool, replicas in pool_replicas.items():
        depths = [replica_depth.get(r) for r in replicas]
        if depths and all(d is not None for d in depths):
            out[pool] = int(sum(depths))
    return out


class NoReplicaForModel(LookupError):
    """A request names a model that no replica serves (the gateway answers 404)."""


class ModelPools:
    """Replicas grouped by the model they serve, plus the agents' learned pools (module doc).

    Parameters
    ----------
    replica_pool : each replica's pool (the model name it serves); ``None`` for a replica that
        serves any model (a single-model deployment has no pool at all).
    max_agents : how many ``(workflow type, agent)`` → pool entries to remember (LRU), so that
        clients sending arbitrary agent ids cannot grow it without bound.
    """

    def __init__(self, replica_pool: Mapping[str, str | None], max_agents: int = 10_000) -> None:
        self.replica_pool = dict(replica_pool)
        self.pools: dict[str, list[str]] = {}
        for replica, pool in self.replica_pool.items():
            if pool is not None:
                self.pools.setdefault(pool, []).append(replica)
        self.unpooled = [r for r, p in self.replica_pool.items() if p is None]
        self.max_agents = int(max_agents)
        self._lru: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._by_type: dict[str, dict[str, str]] = {}

    @property
    def pooled(self) -> bool:
        """Whether any replica declares a pool (else routing ignores the model name)."""
        return bool(self.pools)

    def pool_of(self, model: str | None) -> str | None:
        """The pool serving ``model`` (None: no pool is named so; unpooled replicas serve it)."""
        return model if isinstance(model, str) and model in self.pools else None

    def candidates(self, model: str | None) -> list[str]:
        """The replicas that may serve a request naming ``model``: its pool's, else the replicas
        without a pool; :class:`NoReplicaForModel` when there are neither."""
        pool = self.pool_of(model)
        if pool is not None:
            return list(self.pools[pool])
        if self.unpooled:
            return list(self.unpooled)
        raise NoReplicaForModel(f"model {model!r} is served by no upstream (pools: "
                                f"{', '.join(sorted(self.pools))})")

    # ------------------------------------------------------------- agents → pools
    def note_agent(self, workflow_type: str, agent: str, pool: str | None) -> None:
        """A call of ``agent`` (of ``workflow_type``) went to ``pool`` (None: forgotten)."""
        key = (str(workflow_type), str(agent))
        if pool is None:
            self._forget(key)
            return
        self._by_type.setdefault(key[0], {})[key[1]] = pool
        self._lru[key] = None
        self._lru.move_to_end(key)
        while len(self._lru) > self.max_agents:
            self._forget(next(iter(self._lru)))

    def _forget(self, key: tuple[str, str]) -> None:
        self._lru.pop(key, None)
        agents = self._by_type.get(key[0])
        if agents is not None:
            agents.pop(key[1], None)
            if not agents:
                del self._by_type[key[0]]

    def agent_pools(self, workflow_type: str | None) -> Mapping[str, str]:
        """``agent → pool`` for the agents of ``workflow_type`` seen so far (read-only use)."""
        return self._by_type.get(str(workflow_type), {}) if workflow_type is not None else {}

    # ------------------------------------------------------------- queue depths
    def depths(self, replica_depth: Mapping[str, int]) -> dict[str, int]:
        """Waiting requests per pool from the replicas' latest reports
        (:func:`pool_queue_depths`)."""
        return pool_queue_depths(replica_depth, self.pools)

    def as_dict(self) -> dict:
        return {"pools": {p: list(r) for p, r in self.pools.items()}, "unpooled": list(self.unpooled),
                "agents": {f"{wt}/{a}": p for wt, agents in self._by_type.items()
                           for a, p in agents.items()}}
