"""Eviction and retention policies of the baselines (smallest key is evicted first)."""
from __future__ import annotations

import math

from simulator.engine import DONE, Request, Simulator
from simulator.policy import CachePolicy, last_access_order


class LRU(CachePolicy):
    """Least recently used, leaf first: SGLang's default radix eviction (and HiCache's host LRU)."""

    @last_access_order
    def evict_key(self, replica: int, seg: int, now: float) -> float:
        return self.sim.replicas[replica].cache.gpu[seg]


class ContinuumTTL(LRU):
    """Continuum: after a call that runs a tool, pin the session's KV on the GPU for a TTL equal
    to the running mean of that tool's observed latency (the gap between the call's finish and
    the session's next call); unpin when the session returns or the TTL expires. Before any
    observation of a tool, the mean over all tools seen so far is used (0 before any)."""

    def __init__(self) -> None:
        self.sum: dict[str, float] = {}
        self.n: dict[str, int] = {}
        self.pins: dict[int, tuple[int, tuple[int, ...], float]] = {}   # wf -> (replica, segs, t_finish)
        self.pin_tool: dict[int, str] = {}

    def _mean(self, tool: str) -> float:
        if self.n.get(tool):
            return self.sum[tool] / self.n[tool]
        total = sum(self.n.values())
        return sum(self.sum.values()) / total if total else 0.0

    def on_finish(self, req: Request) -> None:
        call = req.call
        if call.tool is None or not call.children:
            return
        ttl = self._mean(call.tool)
        segs = tuple(call.path) + (call.own_seg,)
        cache = self.sim.replicas[req.replica].cache
        until = self.sim.now + ttl
        if ttl > 0:
            for s in segs:
                cache.pin(s, until)
            self.sim.add_timer(until)
        self.pins[req.wf] = (req.replica, segs, self.sim.now)
        self.pin_tool[req.wf] = call.tool

    def on_issue(self, req: Request) -> None:
        pin = self.pins.pop(req.wf, None)
        if pin is None:
            return
        replica, segs, t_fin = pin
        tool = self.pin_tool.pop(req.wf)
        self.sum[tool] = self.sum.get(tool, 0.0) + (self.sim.now - t_fin)
        self.n[tool] = self.n.get(tool, 0) + 1
        cache = self.sim.replicas[replica].cache
        for s in segs:
            cache.unpin(s)


class MoriIdleness(CachePolicy):
    """MORI: rank sessions by *idleness*, the share of their recent time spent in tool calls
    (exponentially weighted with half-life ``half_life_s``; a session in a tool call right now
    counts that time too). The GPU tier evicts the most idle sessions first, so the busiest stay
    on the GPU and the most idle are demoted to the host tier, which also drops the most idle
    first: both tiers fill to capacity in idleness order."""

    def __init__(self, half_life_s: float = 120.0) -> None:
        self.half_life_s = half_life_s
        self.tool: dict[int, float] = {}
        self.busy: dict[int, float] = {}
        self.t_upd: dict[int, float] = {}
        self.idle_since: dict[int, float] = {}

    def _decay(self, wf: int, now: float) -> None:
        t = self.t_upd.get(wf, now)
        f = 0.5 ** ((now - t) / self.half_life_s)
        self.tool[wf] = self.tool.get(wf, 0.0) * f
        self.busy[wf] = self.busy.get(wf, 0.0) * f
        self.t_upd[wf] = now

    def on_issue(self, req: Request) -> None:
        now = self.sim.now
        self._decay(req.wf, now)
        since = self.idle_since.pop(req.wf, None)
        if since is not None:
            self.tool[req.wf] += now - since

    def on_finish(self, req: Request) -> None:
        now = self.sim.now
        self._decay(req.wf, now)
        self.busy[req.wf] += now - req.t_issue
        if req.call.children:
            self.idle_since[req.wf] = now

    def idleness(self, wf: int, now: float) -> float:
        tool = self.tool.get(wf, 0.0)
        busy = self.busy.get(wf, 0.0)
        since = self.idle_since.get(wf)
        if since is not None:
            tool += now - since
        total = tool + busy
        return tool / total if total > 0 else 0.0

    def _key(self, seg: int, now: float, last_access: float) -> tuple:
        wf = self.sim.workload.seg_wf[seg]
        idle = self.idleness(wf, now) if wf >= 0 else 0.0   # shared system prompts: busiest
        return (-idle, last_access)

    def evict_key(self, replica: int, seg: int, now: float) -> tuple:
        return self._key(seg, now, self.sim.replicas[replica].cache.gpu[seg])

    def host_key(self, replica: int, seg: int, now: float) -> tuple:
        return self._key(seg, now, self.sim.replicas[replica].cache.host.get(seg, 0.0))


class Belady(CachePolicy):
    """Bélády's MIN: evict the segment whose next use lies farthest in the future.

    An oracle: it reads the replay's future — which calls will use a segment (their prompt paths),
    when each will be issued (parents' finish plus the recorded gap once the parents are done;
    otherwise now + the gap + the parents' remaining output at ``tpot_s`` per token). Segments no
    future call uses go first; system-prompt segments (shared by all sessions) are treated as
    always about to be used. Applied to both tiers."""

    def __init__(self, tpot_s: float = 0.05) -> None:
        self.tpot_s = tpot_s
        self._ptr: dict[int, int] = {}

    def bind(self, sim: Simulator) -> None:
        super().bind(sim)
        self.wl = sim.workload

    def _est_issue(self, c: int, now: float) -> float:
        sim = self.sim
        t = sim.issue_t[c]
        if not math.isnan(t):
            return now
        call = self.wl.calls[c]
        gap = sim.gap_fn(call)
        if sim.pending_parents[c] == 0:
            return sim.parents_done_t[c] + gap
        rest = 0
        for p in call.parents:
            r = sim.requests[p]
            rest = max(rest, self.wl.calls[p].output_tokens - (r.decoded if r is not None else 0))
        return now + gap + rest * self.tpot_s

    def next_use(self, seg: int, now: float) -> float:
        if self.wl.seg_kind[seg] == 0:
            return now
        consumers = self.wl.seg_consumers[seg]
        i = self._ptr.get(seg, 0)
        reqs = self.sim.requests
        while i < len(consumers) and reqs[consumers[i]] is not None and reqs[consumers[i]].state == DONE:
            i += 1
        self._ptr[seg] = i
        # consumers are in workflow order: the first unfinished one is the next to use it
        return self._est_issue(consumers[i], now) if i < len(consumers) else math.inf

    def evict_key(self, replica: int, seg: int, now: float) -> float:
        return -self.next_use(seg, now)

    def host_key(self, replica: int, seg: int, now: float) -> float:
        return -self.next_use(seg, now)
