"""Pre-prefill: an idle replica computes the known prefix of a session's predicted next call.

The rule is :class:`policies.PrePrefillPolicy`. When a call finishes, its
annotation names the session's most likely next agent ``X`` (with probability ``p``). If
``p ≥ min_p``, the prefix of ``X``'s next prompt that is already known is worth computing ahead
of the call — on a replica of ``X``'s model pool, only while that replica has **nothing to do**
(no call running or waiting) and only into **free KV** (nothing is evicted for it):

* with conversation lineage (logs such as SWE-agent: an agent's prompt extends its previous
  call's prompt and output) the known prefix is ``X``'s conversation so far in the session —
  the path and own segment of ``X``'s last call;
* otherwise (prompts rebuilt from the parents, as in the generated workloads) it is ``X``'s
  system prompt and the workflow's task for ``X`` (:attr:`simulator.workload.Workload.seg_index`);
  the parents' outputs and the tool results are not known before the call.

Segments already on the replica's GPU tier are skipped, and the job stops before the first one
held on the host tier (a host hit is loaded back cheaply by the call itself). The job runs as
prefill iterations of at most one chunk with an empty batch (:meth:`Simulator._idle_work`);
each finished segment is inserted into the GPU tier (:meth:`Simulator.materialize`). A call
arriving at the replica waits for the iteration in progress; the rest of the job is dropped
(its partial segment wasted). The session's home replica in that pool becomes the one that
holds the prefix (``CapacityLedger.note_session``; the sticky router's home), so its next call
is routed there — only for a session with no other home in the pool.

Counters: tokens pre-prefilled; **used** — tokens of pre-prefilled segments that a later call
matched on the GPU at its first admission on that replica; **wasted** — the rest (evicted or
never matched), plus the partial chunks of dropped jobs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from policies import PrePrefillPolicy
from simulator.policy import IdlePrefill, Part


class Waiting(NamedTuple):
    """A session in a gap whose predicted next agent is worth a pre-prefill: since when (the
    finish of its last call; older sessions are served first) and which agent."""
    since: float
    agent: str


@dataclass(slots=True)
class Job:
    """A pre-prefill running on one replica: the segments it computes, in path order."""
    segs: list[int]
    #: tokens still to compute
    left: int
    #: prompt position of its first token (the tokens before it are on the GPU already)
    pos: int
    #: the prefix it builds (``pos + total``) and the tokens it computes
    ctx: int
    total: int
    #: tokens computed; of them placed on the GPU tier
    done: int = 0
    placed: int = 0
    #: index into ``segs`` of the first segment not yet placed
    next: int = 0
    #: the chunk of the iteration in progress (0: none)
    take: int = 0


class PrePrefill(Part):
    """Idle-capacity prefill of predicted next calls' known prefixes (module docstring)."""

    def __init__(self, feed: Any, policy: PrePrefillPolicy | None = None) -> None:
        self.feed = feed
        self.policy = policy or PrePrefillPolicy()
        #: wf -> sessions whose next call is not issued yet
        self.pending: dict[int, Waiting] = {}
        self.last_call: dict[tuple[int, str], Any] = {}
        self.jobs: dict[int, Job] = {}
        #: replica -> {segment: tokens} pre-prefilled there and not yet used
        self.fresh: dict[int, dict[int, int]] = {}
        self.counts = {"jobs": 0, "tokens": 0, "used_tokens": 0, "partial_wasted_tokens": 0,
                       "calls_hit": 0}

    # --- sessions entering a gap --------------------------------------------------------------
    def on_finish(self, req: Any) -> None:
        self.last_call[(req.wf, req.call.agent)] = req.call
        ann = self.feed.served(req)
        agent, p = ann.next_agent_id, ann.next_agent_p
        if not self.policy.wants(ann.known, agent, p):
            self.pending.pop(req.wf, None)
            return
        self.pending[req.wf] = Waiting(self.sim.now, agent)
        pool = self._pool_index(agent)
        if pool is None:
            return
        for rep in self._members(pool):
            if not rep.stepping and not rep.running and not rep.waiting:
                self.sim.wake(rep.idx)

    def on_issue(self, req: Any) -> None:
        self.pending.pop(req.wf, None)

    # --- the work -----------------------------------------------------------------------------
    def idle_prefill(self, replica: int) -> IdlePrefill | None:
        sim = self.sim
        pool = sim.pool_of_replica(replica)
        if pool is None:
            return None
        job = self.jobs.get(replica)
        if job is None:
            job = self._new_job(replica, pool)
            if job is None:
                return None
        take = min(job.left, sim.config.chunked_prefill_size)
        job.take = take
        return IdlePrefill(take, job.pos + job.done, job.ctx, job.total)

    def _new_job(self, replica: int, pool: int) -> Job | None:
        sim = self.sim
        rep = sim.replicas[replica]
        cache, tok = rep.cache, sim.workload.seg_tokens
        for wf, (_t, agent) in sorted(self.pending.items(), key=lambda kv: (kv[1].since, kv[0])):
            if self._pool_index(agent) != pool:
                continue
            key = self._home_key(wf, pool)
            home = self._home(key)
            if home is not None and home != replica:
                continue
            segs = self.known_prefix(wf, agent)
            i = 0
            while i < len(segs) and segs[i] in cache.gpu:
                i += 1
            missing: list[int] = []
            for s in segs[i:]:
                if s in cache.host:
                    break
                missing.append(s)
            total = sum(tok[s] for s in missing)
            if total < self.policy.min_tokens:     # nothing worth it for this session
                self.pending.pop(wf, None)
                continue
            if not self.policy.worth(total, rep.free_tokens(), idle=not rep.running and not rep.waiting):
                continue
            self.pending.pop(wf, None)
            pos = sum(tok[s] for s in segs[:i])
            job = Job(segs=missing, left=total, pos=pos, ctx=pos + total, total=total)
            self.jobs[replica] = job
            self.counts["jobs"] += 1
            self._set_home(key, replica, pos + total, agent)
            return job
        return None

    def on_step(self, replica: int, dt: float, batch: list) -> None:
        job = self.jobs.get(replica)
        if batch or job is None or not job.take:
            return
        take, job.take = job.take, 0
        job.done += take
        job.left -= take
        tok = self.sim.workload.seg_tokens
        covered = 0
        ready: list[int] = []
        for s in job.segs:
            covered += tok[s]
            if covered > job.done:
                break
            ready.append(s)
        new = ready[job.next:]
        if new:
            placed = self.sim.materialize(replica, new)
            fresh = self.fresh.setdefault(replica, {})
            got = 0
            for s in new:
                if got >= placed:
                    break
                fresh[s] = tok[s]
                got += tok[s]
            self.counts["tokens"] += placed
            job.placed += placed
            job.next = len(ready)
            if placed < sum(tok[s] for s in new):      # no room any more: stop here
                self._drop(replica)
                return
        if job.left <= 0:
            del self.jobs[replica]

    def on_admit(self, req: Any) -> None:
        r = req.replica
        if r in self.jobs:                  # real work arrived: the rest of the job is dropped
            self._drop(r)
        fresh = self.fresh.get(r)
        if not fresh or req.preempts:
            return
        tok = self.sim.workload.seg_tokens
        got, used = 0, 0
        for s in req.call.path:
            if got + tok[s] > req.gpu_hit:
                break
            got += tok[s]
            t = fresh.pop(s, None)
            if t is not None:
                used += t
        if used:
            self.counts["used_tokens"] += used
            self.counts["calls_hit"] += 1

    def on_replica_reset(self, replica: int) -> None:
        self.jobs.pop(replica, None)
        self.fresh.pop(replica, None)

    def _drop(self, replica: int) -> None:
        job = self.jobs.pop(replica)
        self.counts["partial_wasted_tokens"] += job.done - job.placed

    # --- what is known of the next call -------------------------------------------------------
    def known_prefix(self, wf: int, agent: str) -> list[int]:
        """Segments of ``agent``'s next prompt in workflow ``wf`` known now (module docstring)."""
        wl = self.sim.workload
        last = self.last_call.get((wf, agent))
        if wl.lineage and last is not None:
            return [*last.path, last.own_seg]
        wt = wl.workflows[wf].workflow_type
        out = []
        for key in (("sys", wt, agent), ("task", wf, agent)):
            s = wl.seg_index.get(key)
            if s is not None:
                out.append(s)
        return out

    # --- pools and homes ----------------------------------------------------------------------
    def _pool_index(self, agent: str) -> int | None:
        pools = self.sim.pools
        if pools is None:
            return 0
        name = pools.agent_pool.get(agent)
        return pools.names.index(name) if name in pools.names else None

    def _members(self, pool: int) -> list:
        sim = self.sim
        if sim.pools is None:
            return sim.replicas
        return [sim.replicas[r] for r in sim.pools.replicas[pool]]

    def _home_key(self, wf: int, pool: int) -> object:
        return wf if self.sim.pools is None else (wf, pool)

    def _home(self, key: object) -> int | None:
        router = self.sim.policy.router
        ledger = getattr(router, "ledger", None)
        if ledger is not None:
            r = ledger.last_replica(key)
            return None if r is None else int(r)
        home = getattr(router, "home", None)
        return home.get(key) if isinstance(home, dict) else None

    def _set_home(self, key: object, replica: int, prefix_tokens: int = 0,
                  agent: str | None = None) -> None:
        router = self.sim.policy.router
        ledger = getattr(router, "ledger", None)
        if ledger is not None:     # the prefix a move away from it would recompute
            ledger.note_session(key, str(replica), prefix_tokens, agent=agent)
            return
        home = getattr(router, "home", None)
        if isinstance(home, dict):
            home[key] = replica

    def stats(self) -> dict:
        c = self.counts
        return {"preprefill_jobs": c["jobs"], "preprefill_tokens": c["tokens"],
                "preprefill_used_tokens": c["used_tokens"],
                "preprefill_wasted_tokens": c["tokens"] - c["used_tokens"] + c["partial_wasted_tokens"],
                "preprefill_calls_hit": c["calls_hit"]}
