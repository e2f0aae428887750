"""The call-level Markov chain of a pruned PFA, and the estimates a serving session needs.

The PFA reads one symbol per *step*; a serving session sees one *call* at a time, and a
fan-out step is several calls. So the PFA is unrolled into an absorbing Markov chain over
calls. Its transient states are

* ``("q", q)`` — between steps, at PFA state ``q``;
* ``("g", q, s, k)`` — inside the fan-out step ``s`` taken from ``q``, ``k`` of its calls
  seen. With the step's width distribution ``w``, another member call follows with hazard
  ``h_k = P(w > k) / P(w >= k)``; otherwise the group is complete and the chain behaves as
  the PFA state after the step.

Every transition emits the agent of the call (members of a mixed group in proportion to their
share of that group's calls); the end of the workflow is the absorbing state. With ``Q`` the
transient-to-transient matrix (emissions summed), the classic absorbing-chain results give:

* expected remaining calls ``t = N · Q · 1`` with the fundamental matrix ``N = (I - Q)^-1``;
* expected remaining seconds ``v = N · r`` where ``r`` is the expected time each transition
  adds: ``latency(a) + gap_after(a) · (1 - p_end(target))`` for a call that starts a step
  (tool time only when the workflow goes on), 0 for a further member of a fan-out group
  (it runs in parallel with the first);
* for each agent ``b``, the probability ``h_b`` of ever calling ``b`` again and the expected
  number of calls until then: with ``Q_¬b`` the transitions that do not emit ``b`` and
  ``e_b`` the one-step probability of emitting ``b``, ``(I - Q_¬b) h_b = e_b`` and
  ``(I - Q_¬b) m_b = e_b + Q_¬b h_b``; the distance is ``m_b / h_b``.

A session is tracked deterministically: in chain state ``c`` a call by agent ``a`` moves to the
most probable target among the transitions emitting ``a``. Session states are the pairs
(chain state, agent of the last call) reachable that way; all their estimates are computed
here, once, at fit time.
"""
from __future__ import annotations

from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from scipy import sparse
from scipy.sparse.linalg import splu

from synth.pfa import PFA

#: Agents reached with a smaller probability than this get no expected distance.
MIN_REACH_P = 0.01

ChainKey = tuple


@dataclass
class CallChain:
    """Absorbing Markov chain over calls: ``rows[c]`` = [(agent, target, p, starts_step)]."""

    keys: list[ChainKey] = field(default_factory=list)
    rows: list[list[tuple[str, int, float, bool]]] = field(default_factory=list)
    p_end: list[float] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.keys)

    def transition_matrix(self, skip_agent: str | None = None) -> sparse.csc_matrix:
        """``Q[c, c']``: probability that the next call moves from c to c' (sparse; with
        ``skip_agent``, only transitions emitting another agent)."""
        entries = [(c, target, p) for c, row in enumerate(self.rows)
                   for agent, target, p, _ in row if agent != skip_agent]
        rows, cols, vals = zip(*entries) if entries else ((), (), ())
        return sparse.csc_matrix((vals, (rows, cols)), shape=(self.size, self.size))


def member_shares(step_symbols: Sequence[tuple[str, tuple[str, ...]]],
                  weights: Sequence[int] | None = None) -> dict[str, dict[str, float]]:
    """Per step symbol, the share of its calls made by each member agent.

    ``step_symbols`` lists (symbol, agents of the step) for every training step, or for every
    distinct step with ``weights[i]`` = how many training steps it stands for.
    """
    counts: dict[str, Counter] = defaultdict(Counter)
    for (symbol, agents), weight in zip(step_symbols, weights or [1] * len(step_symbols)):
        target = counts[symbol]
        for agent in agents:
            target[agent] += weight
    return {s: {a: n / sum(c.values()) for a, n in sorted(c.items())} for s, c in counts.items()}


def _survival(hist: Counter) -> dict[int, float]:
    """``P(w > k)`` for k = 0..max width, from a width histogram."""
    total = sum(hist.values())
    return {k: sum(n for w, n in hist.items() if w > k) / total for k in range(max(hist) + 1)}


def build_chain(pfa: PFA, shares: Mapping[str, Mapping[str, float]]) -> CallChain:
    """Unroll a (pruned) PFA into the call-level chain, states reachable from ``("q", 0)``."""
    chain = CallChain()
    index: dict[ChainKey, int] = {}
    survival = {(q, s): _survival(pfa.widths[q][s]) for q in pfa.states for s in pfa.trans[q]}

    def state(key: ChainKey) -> int:
        if key not in index:
            index[key] = len(chain.keys)
            chain.keys.append(key)
            chain.rows.append([])
            chain.p_end.append(0.0)
            pending.append(key)
        return index[key]

    def after_call(q: int, s: str, k: int) -> ChainKey:
        """Chain state after the k-th call of step s from q."""
        return ("g", q, s, k) if survival[(q, s)].get(k, 0.0) > 0 else ("q", pfa.trans[q][s])

    def step_row(q: int, weight: float) -> tuple[list, float]:
        row = []
        for s in sorted(pfa.trans[q]):
            p = pfa.prob(q, s) * weight
            for agent, share in shares[s].items():
                row.append((agent, after_call(q, s, 1), p * share, True))
        return row, pfa.stop_prob(q) * weight

    pending: list[ChainKey] = []
    state(("q", pfa.initial))
    while pending:
        key = pending.pop()
        if key[0] == "q":
            row, end = step_row(key[1], 1.0)
        else:
            _, q, s, k = key
            surv = survival[(q, s)]
            hazard = surv[k] / surv[k - 1]
            row = [(agent, after_call(q, s, k + 1), hazard * share, False)
                   for agent, share in shares[s].items()]
            more, end = step_row(pfa.trans[q][s], 1.0 - hazard)
            row += more
        c = index[key]
        merged: dict[tuple[str, ChainKey, bool], float] = defaultdict(float)
        for agent, target_key, p, starts in row:
            if p > 0:
                merged[(agent, target_key, starts)] += p
        chain.rows[c] = [(agent, state(t), p, starts) for (agent, t, starts), p in merged.items()]
        chain.p_end[c] = end
    chain.agents = sorted({a for row in chain.rows for a, *_ in row})
    return chain


def combine_chains(first: CallChain, second: CallChain) -> CallChain:
    """One chain holding both (block-diagonal: no transition between the two parts).

    States of ``second`` are shifted by ``first.size``; keys become ("1",)+key / ("2",)+key.
    """
    out = CallChain(keys=[("1",) + k for k in first.keys] + [("2",) + k for k in second.keys],
                    rows=[list(r) for r in first.rows]
                    + [[(a, t + first.size, p, s) for a, t, p, s in r] for r in second.rows],
                    p_end=first.p_end + second.p_end)
    out.agents = sorted(set(first.agents) | set(second.agents))
    return out


@dataclass
class ChainEstimates:
    """Per chain state: remaining calls, remaining seconds, reach probability and distance."""

    remaining_calls: np.ndarray
    remaining_s: np.ndarray
    reach: dict[str, np.ndarray]
    distance: dict[str, np.ndarray]


def _solver(q: sparse.csc_matrix):
    """Solve ``(I - Q) x = b`` for several b with one sparse LU factorization."""
    a = (sparse.identity(q.shape[0], format="csc") - q).tocsc()
    try:
        return splu(a).solve
    except RuntimeError:  # singular: a closed loop without exit (pruning should prevent it)
        dense = a.toarray()
        return lambda b: np.linalg.lstsq(dense, b, rcond=None)[0]


def chain_estimates(chain: CallChain, timings: Mapping[str, tuple[float, float]]) -> ChainEstimates:
    """Solve the absorbing-chain systems above. ``timings[agent] = (latency_s, gap_after_s)``."""
    n = chain.size
    q = chain.transition_matrix()
    solve = _solver(q)
    remaining_calls = solve(np.asarray(q.sum(axis=1)).ravel())
    reward = np.zeros(n)
    for c, row in enumerate(chain.rows):
        for agent, target, p, starts in row:
            if starts:
                lat, gap = timings.get(agent, (0.0, 0.0))
                reward[c] += p * (lat + gap * (1.0 - chain.p_end[target]))
    remaining_s = solve(reward)
    reach, distance = {}, {}
    for agent in chain.agents:
        q_not = chain.transition_matrix(skip_agent=agent)
        e = np.zeros(n)
        for c, row in enumerate(chain.rows):
            for a, _, p, _ in row:
                if a == agent:
                    e[c] += p
        solve_not = _solver(q_not)
        h = solve_not(e)
        m = solve_not(e + q_not @ h)
        reach[agent] = h
        with np.errstate(divide="ignore", invalid="ignore"):
            distance[agent] = np.where(h > 0, m / np.where(h > 0, h, 1.0), np.nan)
    return ChainEstimates(remaining_calls, remaining_s, reach, distance)


@dataclass
class SessionTable:
    """Deterministic session tracking: ``next[sid][agent] = sid'``; estimates per sid."""

    chain_state: list[int]
    last_agent: list[str | None]
    next: list[dict[str, int]]
    estimates: list[dict]
    accepting: list[bool] = field(default_factory=list)  # may the workflow stop here?


def _round(x: float) -> float:
    return float(round(float(x), 6))


def session_table(chain: CallChain, est: ChainEstimates,
                  timings: Mapping[str, tuple[float, float]],
                  fallback: Mapping[int, int] | None = None) -> SessionTable:
    """Enumerate session states (chain state, last agent) from the start; precompute estimates.

    ``fallback[c]`` names a second chain state standing in for ``c`` when ``c`` has no
    transition for an agent (the counting automaton's loop bound is exceeded, but the PFA
    still knows the way): the session continues there.
    """
    table = SessionTable([], [], [], [])
    index: dict[tuple[int, str | None], int] = {}
    queue: deque[tuple[int, str | None]] = deque()

    def sid(key: tuple[int, str | None]) -> int:
        if key not in index:
            index[key] = len(table.chain_state)
            table.chain_state.append(key[0])
            table.last_agent.append(key[1])
            table.next.append({})
            table.estimates.append({})
            table.accepting.append(False)
            queue.append(key)
        return index[key]

    sid((0, None))
    while queue:
        c, last = queue.popleft()
        me = index[(c, last)]
        by_agent: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        for agent, target, p, _ in chain.rows[c]:
            by_agent[agent][target] += p
        moves = dict(by_agent)
        if fallback and c in fallback:
            for agent, target, p, _ in chain.rows[fallback[c]]:
                if agent not in by_agent:
                    moves.setdefault(agent, defaultdict(float))[target] += p
        for agent in sorted(moves):
            targets = moves[agent]
            best = max(sorted(targets), key=lambda t: targets[t])
            table.next[me][agent] = sid((best, agent))
        next_agents = sorted(((a, sum(t.values())) for a, t in by_agent.items()),
                             key=lambda ap: (-ap[1], ap[0]))
        table.accepting[me] = chain.p_end[c] > 0 or bool(
            fallback and c in fallback and chain.p_end[fallback[c]] > 0)
        pending_s = 0.0
        if last is not None:
            lat, gap = timings.get(last, (0.0, 0.0))
            pending_s = lat + gap * (1.0 - chain.p_end[c])
        table.estimates[me] = {
            "next_agents": [{"agent_id": a, "p": _round(p)} for a, p in next_agents],
            "p_end": _round(chain.p_end[c]),
            "expected_remaining_calls": _round(max(est.remaining_calls[c], 0.0)),
            "expected_remaining_s": _round(max(est.remaining_s[c], 0.0) + pending_s),
            "expected_distance": {a: _round(est.distance[a][c]) for a in chain.agents
                                  if est.reach[a][c] >= MIN_REACH_P},
        }
    return table
