"""Routers of the baselines: which replica a newly issued call goes to.

None of them knows a call's output length (they are non-clairvoyant, as deployed routers are).
"""
from __future__ import annotations

from simulator.engine import Request
from simulator.policy import Router


class RoundRobin(Router):
    """SGLang router's ``round_robin`` policy: replicas in turn, whatever the session."""

    def __init__(self) -> None:
        self._next = 0

    def route(self, req: Request) -> int:
        r = self._next % len(self.sim.replicas)
        self._next += 1
        return r


class LeastLoad(Router):
    """The replica with the fewest outstanding tokens (KV of running calls + waiting prompts)."""

    def route(self, req: Request) -> int:
        return min(self.sim.replicas, key=lambda rep: (rep.load_tokens(), rep.idx)).idx


class StickyLeastLoad(LeastLoad):
    """Session affinity: a workflow's calls go where its previous call ran (its KV is there);
    a new workflow goes to the least-loaded replica. Given to the cache-centric baselines
    (``continuum-ttl``, ``mori-idleness``, ``belady``), whose papers assume the session's KV is on
    the engine that serves it."""

    def __init__(self) -> None:
        self.home: dict[int, int] = {}

    def route(self, req: Request) -> int:
        r = self.home.get(req.wf)
        if r is None:
            r = self.home[req.wf] = super().route(req)
        return r


class AutellixRouter(Router):
    """Autellix's load balancer: calls with prompts longer than ``long_prompt_tokens`` (2048) are
    pinned to the engine that served their program (data locality); shorter calls go to the
    least-used engine (fewest running + waiting calls)."""

    def __init__(self, long_prompt_tokens: int = 2048) -> None:
        self.long_prompt_tokens = long_prompt_tokens
        self.home: dict[int, int] = {}

    def route(self, req: Request) -> int:
        home = self.home.get(req.wf)
        if req.call.input_tokens > self.long_prompt_tokens and home is not None:
            return home
        r = min(self.sim.replicas, key=lambda rep: (len(rep.running) + len(rep.waiting), rep.idx)).idx
        if req.call.input_tokens > self.long_prompt_tokens or home is None:
            self.home[req.wf] = r
        return r
