"""Queue orders of the baselines (smallest key runs first)."""
from __future__ import annotations

import math

from simulator.engine import WAITING, Request, Simulator
from simulator.policy import Scheduler


class FCFS(Scheduler):
    """First come, first served by call issue time; the newest call is preempted first (vLLM and
    SGLang's recompute preemption)."""

    static_order = True

    def queue_key(self, req: Request) -> tuple:
        return (req.t_issue, req.idx)


class ProgramFCFS(Scheduler):
    """Program-level FCFS (Continuum): calls ordered by their workflow's arrival, so an older
    program's next turn goes ahead of newer programs' calls."""

    static_order = True

    def queue_key(self, req: Request) -> tuple:
        return (self.sim.wf_arrival[req.wf], req.t_issue, req.idx)


class PLAS(Scheduler):
    """Autellix's Program-Level Attained Service with multi-level queues and anti-starvation.

    A program's attained service ``T`` is the sum of the service times (time spent in running
    batches) of its calls. A call is placed, when issued, in the queue of its program's ``T``:
    queue 0 for ``T < q``, queue ``i`` for ``T`` in ``[q·2^(i−1), q·2^i)``, ``levels`` queues in all.
    Queue ``i`` has a quantum of ``q·2^i`` seconds of service; a running call that uses it up is
    demoted one queue (multi-level feedback). Within a queue calls are FCFS; a waiting call of a
    higher queue preempts running calls of lower queues. Anti-starvation: when a program's
    accumulated waiting ``W`` reaches ``β·T`` (``W/T ≥ β``), its waiting call is promoted to queue 0
    with a fresh quantum, and ``W`` counts afresh from the promotion (an MLFQ priority boost).
    Preempted calls are swapped to host memory (Autellix's swap optimisation) when the host tier
    has room, else recomputed.
    """

    preemptive = True
    #: A full running set does not shield lower queues either (Autellix preempts by queue).
    slot_preemption = True
    #: Autellix swaps preempted calls' KV to CPU memory rather than recomputing it.
    swap_on_preempt = True

    def __init__(self, quantum_s: float = 2.0, levels: int = 8, beta: float = 2.0) -> None:
        self.quantum_s = quantum_s
        self.levels = levels
        self.beta = beta
        self.service: dict[int, float] = {}
        self.wait: dict[int, float] = {}
        self.level_of: dict[int, int] = {}
        self.used: dict[int, float] = {}

    def _initial_level(self, t: float) -> int:
        if t < self.quantum_s:
            return 0
        return min(self.levels - 1, int(math.log2(t / self.quantum_s)) + 1)

    def on_issue(self, req: Request) -> None:
        self.level_of[req.idx] = self._initial_level(self.service.get(req.wf, 0.0))
        self.used[req.idx] = 0.0

    def on_admit(self, req: Request) -> None:
        self.wait[req.wf] = self.wait.get(req.wf, 0.0) + (self.sim.now - req.t_enqueue)

    def on_step(self, replica: int, dt: float, batch: list[Request]) -> None:
        for q in batch:
            self.service[q.wf] = self.service.get(q.wf, 0.0) + dt
            used = self.used[q.idx] + dt
            lvl = self.level_of[q.idx]
            if used >= self.quantum_s * 2 ** lvl and lvl < self.levels - 1:
                self.level_of[q.idx] = lvl + 1
                used = 0.0
            self.used[q.idx] = used

    def level(self, req: Request) -> int:
        lvl = self.level_of[req.idx]
        if req.state == WAITING and lvl > 0:  # starving programs are promoted
            t = self.service.get(req.wf, 0.0)
            w = self.wait.get(req.wf, 0.0) + (self.sim.now - req.t_enqueue)
            if t > 0 and w >= self.beta * t:
                self.level_of[req.idx] = lvl = 0
                self.used[req.idx] = 0.0
                # a priority boost: the program's waiting is counted afresh from here
                self.wait[req.wf] = -(self.sim.now - req.t_enqueue)
        return lvl

    def queue_key(self, req: Request) -> tuple:
        return (self.level(req), req.t_issue, req.idx)

    def preempt_rank(self, req: Request) -> int:
        """Only a call of a strictly higher queue preempts (FCFS inside a queue)."""
        return self.level(req)


class OracleSRPT(Scheduler):
    """Clairvoyant workflow-level shortest-remaining-work-first: a *reference*, not a deployable
    policy. Calls are ordered by the output tokens their workflow has left to generate (every
    unfinished call of it, read from the replay), then FCFS. It shows how far any ordering of
    the waiting queue could go on a trace, the way ``belady`` bounds eviction."""

    def bind(self, sim: Simulator) -> None:
        super().bind(sim)
        self.left: dict[int, int] = {}
        for c in sim.workload.calls:
            self.left[c.wf] = self.left.get(c.wf, 0) + c.output_tokens

    def on_finish(self, req: Request) -> None:
        self.left[req.wf] -= req.call.output_tokens

    def queue_key(self, req: Request) -> tuple:
        return (self.left[req.wf], req.t_issue, req.idx)
