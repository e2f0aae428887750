"""A replica's waiting queue under workflow-level priority, without sorting every call each round.

``PriorityScheduler`` (``simulator.ours``) orders a waiting call by SGLang's integer priority of
its *session* (workflow), then FCFS::

    key(call, now) = (−V_s(now), t_enqueue, idx),
    V_s(now) = round(scale · (score_s + aging · (now − since_s)))

with ``(score_s, since_s)`` the session's reference in the ``SessionPriorityBook``. The engine
sorted the whole queue by this key at every admission round: O(W log W) per round, W the
queue's length, which grows with the backlog (superlinear in the trace at peak load).

Everything about a session's order is one number, its **anchor**
``a_s = scale · (score_s − aging · since_s)``: ``V_s(now) = round(a_s + scale · aging · now)``
up to float rounding, the same shift for every session. The integer rounding makes sessions
whose anchors are less than 1 apart tie or not depending on ``now`` (the tie then goes to the
older call), so the anchor alone does not give the order; but it bounds it: if
``a_s < a_max − 1 − m`` (``m`` a margin far above the float error) then ``V_s < V_max``, since
``|round(x) − x| ≤ ½``. So the head at ``now`` is found among the sessions whose anchor is within
``1 + m`` of the largest (a heap of sessions by anchor), by computing their ``V_s(now)`` exactly
as the sort key does and taking the smallest ``(−V_s, t_enqueue, idx)`` of each session's oldest
call: the element the sort would have put first, in O(k log S) for k sessions near the top.

**Per-session aging rates** (``PriorityPolicy.aging_per_duration``: each session ages at
``k / τ_s``, its expected duration ``τ_s``). With rates ``r_s`` the anchors no longer shift
together — ``V_s(now) = round(scale · (score_s − r_s · since_s) + scale · r_s · now)`` — so no
single heap order holds for all ``now``. But sessions *of one rate* still shift together, and
the rate is rounded to a power of two times ``aging_per_s``, so there are few rates: the queue
keeps one anchor heap per rate (a session lives in the heap of its current rate; a rekey may
move it), finds each heap's head as above and takes the smallest key of those heads: exact, in
O(#rates · k log S). ``tests/test_simulator_incremental_state.py`` checks head and order
against a brute-force sort with sessions moving between five rates.

**The list it replaces.** The engine appends calls (issued or preempted) at the end and sorts
at the start of each admission (:meth:`Simulator._admit`); a call appended after the sort stays
behind every sorted call until the next sort. This queue keeps that: appended calls wait in
``tail`` (in order) and :meth:`sort` moves them into the ordered part. The ordered part is read
only at the time it was sorted (within one admission) or when it holds one call, so computing
its head from the sessions' current references at ``now`` gives what the sorted list held.
A session whose reference changes (a new call of it was issued) is re-keyed (:meth:`rekey`).
"""
from __future__ import annotations

import bisect
import heapq
from typing import Any, Callable, Iterator

from predictors.contract import sglang_priority

def sglang_int(score: float, since: float, now: float, aging: float, scale: float) -> int:
    """The session's integer priority at ``now``: ``PriorityPolicy.to_sglang(aged(score, since,
    now))`` without the method lookups, rendered by the one function the gateway's dialect and
    the plugin use (:func:`predictors.contract.sglang_priority`)."""
    return sglang_priority(score + aging * max(0.0, now - since), scale)


class SessionQueue:
    """The waiting calls of one replica in ``PriorityScheduler``'s order (module docstring).

    ``reference(wf)`` returns the session's ``(score, since)``; ``clock()`` the simulated time.
    Supports what the engine and the routers use of a list: ``append``, ``remove``, ``sort``
    (the key is ignored: the order is the scheduler's), ``[0]`` (the head), ``len``, truth and
    iteration (in queue order: the sorted part, then the calls appended since)."""

    def __init__(self, reference: Callable[[Any], tuple[float, float]], clock: Callable[[], float],
                 aging: float, scale: float, rate: Callable[[Any], float] | None = None) -> None:
        self.reference = reference
        self.clock = clock
        self.aging = float(aging)
        self.scale = float(scale)
        #: session -> its aging rate (None: every session at ``aging``)
        self.rate = rate
        #: Sorted part: per session, its calls by (t_enqueue, idx).
        self.sessions: dict[Any, list] = {}
        #: Per aging rate, a heap of (−anchor, stamp, session); an entry is live while ``stamp``
        #: is the session's (a session lives in the heap of its current rate only).
        self.heaps: dict[float, list[tuple[float, int, Any]]] = {}
        self.stamp: dict[Any, int] = {}
        self._stamps = 0
        #: Calls appended since the last sort, in order.
        self.tail: list = []
        self.n = 0

    # --- list operations ----------------------------------------------------------------------
    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def append(self, req: Any) -> None:
        self.tail.append(req)
        self.n += 1

    def sort(self, key: Any = None) -> None:
        """Move the calls appended since the last sort into the ordered part."""
        for req in self.tail:
            self._insert(req)
        self.tail.clear()

    def remove(self, req: Any) -> None:
        calls = self.sessions.get(req.wf)
        if calls is not None:
            i = bisect.bisect_left(calls, (req.t_enqueue, req.idx), key=_fcfs)
            if i < len(calls) and calls[i] is req:
                del calls[i]
                if not calls:
                    del self.sessions[req.wf]
                    del self.stamp[req.wf]
                self.n -= 1
                return
        self.tail.remove(req)
        self.n -= 1

    def __getitem__(self, i: int) -> Any:
        if i == 0 and self.n:
            return self.head(self.clock())
        return list(self)[i]

    def __iter__(self) -> Iterator[Any]:
        now = self.clock()
        ordered = sorted((c for calls in self.sessions.values() for c in calls),
                         key=lambda c: (-self._priority(c.wf, now), c.t_enqueue, c.idx))
        return iter(ordered + self.tail)

    # --- order --------------------------------------------------------------------------------
    def rekey(self, wf: Any) -> None:
        """The session's reference changed: re-place it in the heap (a no-op if it has no sorted
        call here)."""
        if wf in self.sessions:
            self._push(wf)

    def head(self, now: float) -> Any:
        """The first call of the queue at ``now`` (module docstring): the best of each rate's
        heap's head, O(#rates) heads."""
        if not self.sessions:
            return self.tail[0]
        best_key, best = None, None
        for rate, heap in list(self.heaps.items()):
            key, first = self._heap_head(rate, heap, now)
            if first is None:
                del self.heaps[rate]
            elif best_key is None or key < best_key:
                best_key, best = key, first
        return best

    def _heap_head(self, rate: float, heap: list, now: float) -> tuple[Any, Any]:
        """``(sort key, call)`` of the first call among the sessions of one rate's heap
        (``(None, None)`` when the heap holds no live session)."""
        stamp = self.stamp
        while heap and heap[0][1] != stamp.get(heap[0][2]):
            heapq.heappop(heap)
        if not heap:
            return None, None
        top = -heap[0][0]
        margin = 1.0 + 1e-9 * (1.0 + abs(top) + abs(rate * self.scale * now))
        # the second largest anchor is one of the root's children (live or not): when both are
        # out of the window, the top session alone holds the head
        if all(-heap[i][0] < top - margin for i in (1, 2) if i < len(heap)):
            wf = heap[0][2]
            first = self.sessions[wf][0]
            return (-self._priority(wf, now), first.t_enqueue, first.idx), first
        near: list[tuple[float, int, Any]] = []
        best_key, best = None, None
        while heap and -heap[0][0] >= top - margin:
            entry = heapq.heappop(heap)
            wf = entry[2]
            if entry[1] != stamp.get(wf):
                continue
            near.append(entry)
            first = self.sessions[wf][0]
            key = (-self._priority(wf, now), first.t_enqueue, first.idx)
            if best_key is None or key < best_key:
                best_key, best = key, first
        for entry in near:
            heapq.heappush(heap, entry)
        return best_key, best

    def _rate(self, wf: Any) -> float:
        return self.aging if self.rate is None else self.rate(wf)

    def _priority(self, wf: Any, now: float) -> int:
        score, since = self.reference(wf)
        return sglang_int(score, since, now, self._rate(wf), self.scale)

    def _insert(self, req: Any) -> None:
        calls = self.sessions.get(req.wf)
        if calls is None:
            self.sessions[req.wf] = [req]
            self._push(req.wf)
        else:
            bisect.insort(calls, req, key=_fcfs)

    def _push(self, wf: Any) -> None:
        score, since = self.reference(wf)
        rate = self._rate(wf)
        self._stamps += 1
        self.stamp[wf] = self._stamps
        heap = self.heaps.setdefault(rate, [])
        heapq.heappush(heap, (-(score - rate * since) * self.scale, self._stamps, wf))
        if len(heap) > 2 * len(self.stamp) + 64:     # drop the dead entries
            heap[:] = [e for e in heap if e[1] == self.stamp.get(e[2])]
            heapq.heapify(heap)


def _fcfs(req: Any) -> tuple[float, int]:
    return (req.t_enqueue, req.idx)
