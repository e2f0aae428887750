"""Model pools: multi-model workflows, where each agent is served by the replicas of one model.

A :class:`Pools` maps every call (by its agent) to a pool and every pool to its replicas; the
engine's routers choose only among the replicas of the call's pool
(:meth:`simulator.engine.Simulator.candidates`), a session has one home replica per pool, and
the priority rule's idle-downstream term reads each pool's queue depth
(:meth:`~simulator.engine.Simulator.pool_queue_depths`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from simulator.workload import Workload


@dataclass
class Pools:
    """``names[p]`` is served by replicas ``replicas[p]``; ``agent_pool`` maps agent → pool name;
    ``pool_of_call[i]`` is call ``i``'s pool index."""

    names: list[str]
    replicas: list[list[int]]
    agent_pool: dict[str, str]
    pool_of_call: np.ndarray

    def check(self, wl: Workload, n_replicas: int) -> None:
        if len(self.pool_of_call) != wl.n_calls:
            raise ValueError("pools: one pool per call is needed")
        used = [i for reps in self.replicas for i in reps]
        if any(not reps for reps in self.replicas):
            raise ValueError("pools: every pool needs at least one replica")
        if sorted(used) != list(range(n_replicas)):
            raise ValueError(f"pools: the pools' replicas {sorted(used)} must be each of the "
                             f"{n_replicas} replicas exactly once")

    def copy(self) -> "Pools":
        """An independent copy (an autoscaler changes a run's pool membership)."""
        return Pools(list(self.names), [list(r) for r in self.replicas], dict(self.agent_pool),
                     self.pool_of_call)

    def to_dict(self) -> dict:
        return {"pools": {n: {"replicas": r, "agents": sorted(a for a, p in self.agent_pool.items() if p == n)}
                          for n, r in zip(self.names, self.replicas)}}


def build_pools(wl: Workload, pool_replicas: Mapping[str, int],
                agent_pool: Mapping[str, str], default_pool: str | None = None,
                type_pool: Mapping[str, str] | None = None) -> Pools:
    """Pools of ``pool_replicas[name]`` consecutive replicas each; a call goes to the pool of its
    agent (``agent_pool``), else of its workflow type (``type_pool``: one model per application,
    as on a platform serving several), else to ``default_pool``, else an error naming it."""
    names = list(pool_replicas)
    replicas: list[list[int]] = []
    nxt = 0
    for n in names:
        replicas.append(list(range(nxt, nxt + int(pool_replicas[n]))))
        nxt += int(pool_replicas[n])
    index = {n: i for i, n in enumerate(names)}
    type_pool = dict(type_pool or {})
    for a, p in [*agent_pool.items(), *type_pool.items()]:
        if p not in index:
            raise ValueError(f"pools: {a!r} is mapped to unknown pool {p!r}")
    out = np.empty(wl.n_calls, dtype=np.int64)
    for c in wl.calls:
        agent = c.agent
        p = agent_pool.get(agent) or type_pool.get(wl.workflows[c.wf].workflow_type, default_pool)
        if p is None:
            raise ValueError(f"pools: agent {agent!r} (call {c.request_id}) is in no pool")
        out[c.idx] = index[p]
    return Pools(names, replicas, dict(agent_pool), out)


def n_replicas(pool_replicas: Mapping[str, int]) -> int:
    return int(sum(pool_replicas.values()))


__all__: Sequence[str] = ("Pools", "build_pools", "n_replicas")
