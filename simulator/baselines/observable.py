"""The non-clairvoyant reference: the best queue key given what is observable so far.

``oracle-srpt`` reads each workflow's true remaining output tokens; no deployable policy can.
This reference asks how far a policy could go knowing only what a serving system observes of a
session — its workflow type (the application), how many of its calls have finished and how many
output tokens they produced — when the *distribution* of work given those observations is known
exactly. It is labelled **reference (non-clairvoyant, in-sample)**: the distribution is taken
from the replayed (test) workflows themselves, so it is the best a predictor fit on a perfectly
representative history could do, not something a profile fit on other workflows can promise.

**Conditional distribution.** When a session of type ``w`` has finished ``k`` calls that produced
``a`` output tokens, the other replayed workflows of type ``w`` with more than ``k`` calls are the
ones that would still be running in that state; each one's *remaining* output tokens after its
first ``k`` calls (in recorded order) is a draw of this session's remaining work. With
``neighbours = m`` only the ``m`` of them whose first ``k`` calls produced the closest number of
tokens to ``a`` (in log tokens) are kept — the session's own history (an agent that wrote long
answers keeps writing long ones) conditions the draw; ``by_agent=True`` measures that closeness
on each agent's tokens so far (L1 over agents of log tokens) instead of the total. The session
itself is always left out (leave-one-out), so its own future never ranks it. A replay resamples a
small test split into many sessions (``simulator.workload.replicate_records``: copies named
``<id>~k``); ``distinct_sources=True`` also leaves out the session's copies, whose recorded future is
its own — what a live server, which never saw this session before, cannot know.

**Key.** ``gittins`` (default): the Gittins rank of that empirical distribution,
``min_Δ E[min(R, Δ)] / P(R ≤ Δ)`` over the draws ``Δ`` — the expected work spent per unit of
probability of finishing within a budget, the index that minimises mean response time on one
server with known size *distributions* and unknown sizes (Gittins 1989; Scully, Harchol-Balter
and Scheller-Wolf, SIGMETRICS 2018, "SOAP"). ``mean``: the mean remaining work (mean residual
life), the plain SRPT-on-expectations key. Calls are ordered by their session's key, then FCFS;
routing and eviction are ``oracle-srpt``'s (session affinity, LRU), so the two references differ
only in what their key knows.
"""
from __future__ import annotations

import numpy as np

from simulator.engine import Request, Simulator
from simulator.policy import Scheduler


def gittins_rank(remaining: np.ndarray) -> float:
    """``min_Δ E[min(R, Δ)] / P(R ≤ Δ)`` over the draws of ``remaining`` (equal weights).

    The quanta worth considering are the draws themselves: between two draws the numerator grows
    and the denominator does not. Smallest rank runs first."""
    r = np.sort(np.asarray(remaining, dtype=float))
    n = len(r)
    if n == 0:
        return float("inf")
    below = np.cumsum(r)                   # Σ of draws ≤ r_i
    done = np.arange(1, n + 1)             # #(draws ≤ r_i)
    expected = below + r * (n - done)      # n · E[min(R, r_i)]
    return float(np.min(expected / done))


class ObservableRemaining(Scheduler):
    """Queue order by a session's remaining-work key from its observable state, the distribution
    read in-sample from the replay (module docstring); a reference, not a deployable policy."""

    def __init__(self, key: str = "gittins", neighbours: int | None = None,
                 by_agent: bool = False, distinct_sources: bool = False) -> None:
        if key not in ("gittins", "mean"):
            raise ValueError(f"key {key!r}: use 'gittins' or 'mean'")
        if neighbours is not None and neighbours < 1:
            raise ValueError(f"neighbours {neighbours}: must be ≥ 1 (or None for every draw)")
        self.key = key
        self.neighbours = neighbours
        self.by_agent = by_agent
        self.distinct_sources = distinct_sources

    def bind(self, sim: Simulator) -> None:
        super().bind(sim)
        wl = sim.workload
        by_type: dict[str, list[int]] = {}
        for wf in wl.workflows:
            by_type.setdefault(wf.workflow_type, []).append(wf.idx)
        #: per workflow, the recorded workflow it replays (its id without the copy's ``~k``)
        self.source = np.asarray([wf.workflow_id.rsplit("~", 1)[0] for wf in wl.workflows])
        #: type -> (workflow ids, calls per workflow, cumulative output tokens padded with the total)
        self.types: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        #: type -> (agent -> column, per workflow and calls done the output tokens per agent)
        self.agent_cum: dict[str, tuple[dict[str, int], np.ndarray]] = {}
        for wtype, ids in by_type.items():
            outs = [[wl.calls[c].output_tokens for c in wl.workflows[i].calls] for i in ids]
            width = max(len(o) for o in outs) + 1
            cum = np.zeros((len(ids), width))
            for row, o in enumerate(outs):
                cs = np.concatenate(([0.0], np.cumsum(o, dtype=float)))
                cum[row, :len(cs)] = cs
                cum[row, len(cs):] = cs[-1]
            self.types[wtype] = (np.asarray(ids), np.asarray([len(o) for o in outs]), cum)
            if self.by_agent:
                agents = sorted({wl.calls[c].agent for i in ids for c in wl.workflows[i].calls})
                col = {a: j for j, a in enumerate(agents)}
                per = np.zeros((len(ids), width, len(agents)))
                for row, i in enumerate(ids):
                    for n, c in enumerate(wl.workflows[i].calls):
                        per[row, n + 1:, col[wl.calls[c].agent]] += wl.calls[c].output_tokens
                self.agent_cum[wtype] = (col, per)
        self.done = np.zeros(len(wl.workflows), dtype=np.int64)
        self.produced = np.zeros(len(wl.workflows))
        self.produced_by_agent: dict[int, dict[str, float]] = {}
        self.rank = np.array([self._rank(i) for i in range(len(wl.workflows))])

    def _rank(self, wf: int) -> float:
        ids, n_calls, cum = self.types[self.sim.workload.workflows[wf].workflow_type]
        k = int(self.done[wf])
        other = (self.source[ids] != self.source[wf]) if self.distinct_sources else (ids != wf)
        alive = (n_calls > k) & other
        if not alive.any():                  # no other session got this far: the longest seen
            alive = other
            if not alive.any():
                return 0.0
            k = min(k, cum.shape[1] - 1)
        sofar = cum[alive, min(k, cum.shape[1] - 1)]
        remaining = cum[alive, -1] - sofar
        if self.neighbours is not None and len(remaining) > self.neighbours:
            if self.by_agent:
                wtype = self.sim.workload.workflows[wf].workflow_type
                col, per = self.agent_cum[wtype]
                mine = np.zeros(len(col))
                for a, tok in self.produced_by_agent.get(wf, {}).items():
                    mine[col[a]] = tok
                theirs = per[alive, min(k, cum.shape[1] - 1)]
                dist = np.abs(np.log1p(theirs) - np.log1p(mine)).sum(axis=1)
            else:
                dist = np.abs(np.log1p(sofar) - np.log1p(self.produced[wf]))
            remaining = remaining[np.argsort(dist, kind="stable")[:self.neighbours]]
        if self.key == "mean":
            return float(remaining.mean())
        return gittins_rank(remaining)

    def on_finish(self, req: Request) -> None:
        self.done[req.wf] += 1
        self.produced[req.wf] += req.call.output_tokens
        if self.by_agent:
            mine = self.produced_by_agent.setdefault(req.wf, {})
            mine[req.call.agent] = mine.get(req.call.agent, 0.0) + req.call.output_tokens
        self.rank[req.wf] = self._rank(req.wf)

    def queue_key(self, req: Request) -> tuple:
        return (self.rank[req.wf], req.t_issue, req.idx)
