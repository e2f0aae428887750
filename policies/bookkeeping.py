"""The policies' bookkeeping, written once: a capacity ledger and a session priority book.

The rules (:class:`~policies.capacity.CapacityPolicy`,
:class:`~policies.priority.PriorityPolicy`) are pure functions of their inputs;
what feeds them is state kept over time — which requests are in flight where, how fast each
replica drains, where each session ran last, what each session's priority score is. That state
is kept here, once, and the gateway's router (``serving_hooks.routing``), the SGLang plugin
(``serving_hooks.sglang_plugin``) and the simulator (``simulator.ours``) all drive these same
objects, so the router that is benchmarked is the router that is deployed.

No HTTP, no threads, no SGLang, no clock: every time is an argument ``now`` (seconds on any
monotonic scale); callers that share an object across threads hold their own lock.

:class:`CapacityLedger`
    per replica, the requests sent and not yet finished with their predicted KV bounds
    (:func:`capacity_request` turns an annotation into one), the sums the capacity check reads,
    the drain rate, each session's last replica and each of its agents' prefix and replica,
    the replicas' queue depths and the
    routing counters (:class:`RoutingStats`). :meth:`CapacityLedger.place` is the routing step
    both routers call: the policy's choice, counted and reserved.
:class:`SessionPriorityBook`
    per session, the score of its latest *predicted* call and when it arrived; a call without a
    prediction keeps its session's score (aged), a session never predicted gets
    ``unknown_score``.

The decisions every caller shares (an unknown call's reservation, the expected output, the
drain rate's window, the cached prefix a move recomputes): docs/routing.md, "Bookkeeping".
"""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from sortedcontainers import SortedList

from predictors.contract import Annotation
from policies.capacity import (ActiveRequest, ActiveTotals, BoundTable, CapacityPolicy,
                                             Placement, ReplicaState)
from policies.priority import PriorityPolicy

#: Output bound of a call without a prediction when the caller knows no better (tokens).
UNKNOWN_OUTPUT_TOKENS = 4096
#: Smallest α a band's upper tail is given (a coverage of 1.0 would otherwise give α = 0).
MIN_ALPHA = 1e-6


def capacity_request(request_id: Hashable, input_tokens: int, annotation: Annotation | None,
                     session: Hashable | None = None, *, default_alpha: float,
                     unknown_output_tokens: int = UNKNOWN_OUTPUT_TOKENS,
                     risk_split: bool = True) -> ActiveRequest:
    """The :class:`ActiveRequest` (KV bound, its risk α, expected output, bound table) of one call.

    Known: ``hi`` of its band at α = the band's upper tail ``(1 − coverage)/2`` (at least
    :data:`MIN_ALPHA`), its ``output_len_upper`` table (``risk_split``), expected output = the
    agent's mean, else the band's midpoint. Unknown: ``unknown_output_tokens`` at
    ``default_alpha``, expected output ``0.75 · unknown_output_tokens`` (module doc).
    """
    known = annotation is not None and annotation.known and annotation.output_hi is not None
    hi = int(annotation.output_hi) if known else int(unknown_output_tokens)
    alpha = default_alpha
    if known and annotation.upper_tail_alpha is not None:
        alpha = max(MIN_ALPHA, annotation.upper_tail_alpha)
    if known and annotation.output_len_mean is not None:
        expected = float(annotation.output_len_mean)
    else:
        lo = annotation.output_lo if known and annotation.output_lo is not None else hi / 2
        expected = (lo + hi) / 2
    table: BoundTable = tuple(annotation.output_len_upper) if known and risk_split else ()
    agent = annotation.agent_id if annotation is not None else None
    return ActiveRequest(request_id, int(input_tokens), hi, alpha,
                         None if session is None else str(session), table, expected, agent)


@dataclass
class RoutingStats:
    """Counters of a router's decisions (the same keys in the gateway's metrics and the
    simulator's rows).

    ``fallbacks``: no replica was safe; ``affinity``: the session stayed on its last replica;
    ``moved_sessions``: a returning session sent to another replica than its last one, and
    ``move_recompute_tokens`` the cached prefix tokens those moves make the targets prefill
    again (the ledger's estimate: ``min(input, the session's prefix)`` per move) and
    ``move_left_behind_tokens`` the prefixes of the moved sessions' other agents left on the old
    replicas (rebuilt when those agents run next)."""

    decisions: int = 0
    fallbacks: int = 0
    affinity: int = 0
    moved_sessions: int = 0
    move_recompute_tokens: int = 0
    move_left_behind_tokens: int = 0

    def count(self, placement: Placement, home: str | None, cached_tokens: int,
              left_behind_tokens: int = 0) -> None:
        """Count one decision (``home``: the session's last replica before it)."""
        self.decisions += 1
        self.fallbacks += bool(placement.fallback)
        self.affinity += bool(placement.affinity)
        if home is not None and placement.replica != home:
            self.moved_sessions += 1
            self.move_recompute_tokens += max(0, int(cached_tokens))
            self.move_left_behind_tokens += max(0, int(left_behind_tokens))

    def as_dict(self) -> dict[str, int]:
        return {"decisions": self.decisions, "fallbacks": self.fallbacks, "affinity": self.affinity,
                "moved_sessions": self.moved_sessions,
                "move_recompute_tokens": self.move_recompute_tokens,
                "move_left_behind_tokens": self.move_left_behind_tokens}


@dataclass(frozen=True)
class Reservation:
    """A request in flight: where it went, when, and its bound."""

    replica: str
    started_at: float
    request: ActiveRequest
    session: Hashable | None = None


class CapacityLedger:
    """What a router knows about its replicas besides their own load reports (module doc).

    Parameters
    ----------
    replicas : replica names (a gateway's worker URLs, the simulator's replica indices).
    drain_window_s : window of the drain rate (tokens released per second).
    max_sessions : sessions whose last replica is remembered (LRU); None: all.
    started_at : when observation began (the drain rate's span never reaches before it).
    """

    def __init__(self, replicas: Iterable[str], *, drain_window_s: float = 60.0,
                 max_sessions: int | None = 100_000, started_at: float = 0.0) -> None:
        self.replicas = list(replicas)
        self.drain_window_s = float(drain_window_s)
        self.max_sessions = max_sessions
        self.started_at = float(started_at)
        self._inflight: dict[Hashable, Reservation] = {}
        self._active: dict[str, dict[Hashable, ActiveRequest]] = {r: {} for r in self.replicas}
        #: Per replica, the sums over ``_active`` the capacity check reads, kept on start/finish
        #: (a decision reads them instead of summing every request in flight).
        self._totals: dict[str, ActiveTotals] = {r: ActiveTotals() for r in self.replicas}
        self._released: dict[str, deque] = {r: deque() for r in self.replicas}   # (t, tokens)
        self._released_sum: dict[str, float] = {r: 0.0 for r in self.replicas}
        #: session -> (its last replica, the prefix tokens it holds there)
        self._last: OrderedDict[Hashable, tuple[str, int]] = OrderedDict()
        #: session -> {agent -> (the replica of its latest request, input + E[out] there)}
        self._agents: dict[Hashable, dict[str | None, tuple[str, int]]] = {}
        self.stats = RoutingStats()
        self._tables: dict[BoundTable, BoundTable] = {}
        self._queue_depths: dict[str, int] = {}

    # ------------------------------------------------------------- in flight
    def start(self, request_id: Hashable, replica: str, request: ActiveRequest, now: float,
              session: Hashable | None = None) -> None:
        """Reserve ``request``'s bound on ``replica`` until :meth:`finish`; the session's last
        replica becomes ``replica``. Equal bound tables are shared (one object per distinct
        table, so a replica's risk split groups them)."""
        if request.upper_bounds:
            table = self._tables.setdefault(request.upper_bounds, request.upper_bounds)
            if table is not request.upper_bounds:
                request = replace(request, upper_bounds=table)
        self.finish(request_id, now, released=False)
        self._inflight[request_id] = Reservation(replica, float(now), request, session)
        self._active.setdefault(replica, {})[request_id] = request
        self._totals.setdefault(replica, ActiveTotals()).add(request)
        if session is not None:
            self.note_session(session, replica, int(request.expected_tokens), agent=request.agent_id)

    def place(self, policy: CapacityPolicy, states: list[ReplicaState], request: ActiveRequest,
              now: float, *, session: Hashable | None = None, alpha: float | None = None,
              request_id: Hashable | None = None) -> Placement:
        """The routing step of every router (gateway and simulator): ``policy.choose`` over
        ``states`` with the session's last replica and the prefix it holds there (a move costs
        ``min(request.input_tokens, prefix)`` tokens of recompute, plus the prefixes its other
        agents leave there: :meth:`left_behind`), counted in :attr:`stats`,
        and, with ``request_id``, ``request`` reserved on the chosen replica (:meth:`start`).
        ``alpha`` is the call's own risk (None: the policy's default, for an unknown call)."""
        home = self.last_replica(session)
        cached = self.cached_prefix(session, request.input_tokens)
        behind = self.left_behind(session, home, request.agent_id)
        placement = policy.choose(states, request.input_tokens, request.predicted_hi, alpha,
                                  request.expected_out, last_replica=home,
                                  upper_bounds=request.upper_bounds, cached_tokens=cached,
                                  left_behind_tokens=behind)
        if placement.replica is not None:
            self.stats.count(placement, home, cached, behind)
            if request_id is not None:
                self.start(request_id, placement.replica, request, now, session=session)
        return placement

    def cached_prefix(self, session: Hashable | None, input_tokens: int) -> int:
        """Prompt tokens of the session's next call (``input_tokens``) that its last replica
        holds: ``min(input_tokens, input + E[out] of its latest request)``; 0 for a new one."""
        entry = self._last.get(session) if session is not None else None
        return 0 if entry is None else min(int(input_tokens), entry[1])

    def left_behind(self, session: Hashable | None, replica: str | None, agent: str | None) -> int:
        """The prefixes the session's agents other than ``agent`` hold on ``replica`` (each one's
        latest input + E[out] there): what they rebuild elsewhere, when they run next, if the
        session leaves ``replica``. 0 for a new session or one with a single agent."""
        agents = self._agents.get(session) if session is not None and replica is not None else None
        if not agents:
            return 0
        return sum(tokens for a, (r, tokens) in agents.items() if a != agent and r == replica)

    def finish(self, request_id: Hashable, now: float, released: bool = True) -> ActiveRequest | None:
        """Forget a finished (or failed) request; its expected tokens count toward its replica's
        drain rate. Unknown ids are ignored (None)."""
        res = self._inflight.pop(request_id, None)
        if res is None:
            return None
        if self._active[res.replica].pop(request_id, None) is not None:
            self._totals[res.replica].remove(res.request)
        if released:
            tokens = res.request.expected_tokens
            self._released.setdefault(res.replica, deque()).append((float(now), tokens))
            self._released_sum[res.replica] = self._released_sum.get(res.replica, 0.0) + tokens
        return res.request

    def last_replica(self, session: Hashable | None) -> str | None:
        """Where the session's latest request went (None: new or forgotten session)."""
        entry = self._last.get(session) if session is not None else None
        return None if entry is None else entry[0]

    def note_session(self, session: Hashable, replica: str, prefix_tokens: int = 0,
                     agent: str | None = None) -> None:
        """The prefix (``prefix_tokens``) of the session's ``agent`` is now on ``replica`` (after
        a request sent there, or prefilled there ahead of its next call): its next request
        prefers it, and the agent's entry in the per-agent ledger moves there."""
        self._last[session] = (replica, int(prefix_tokens))
        self._last.move_to_end(session)
        self._agents.setdefault(session, {})[agent] = (replica, int(prefix_tokens))
        while self.max_sessions is not None and len(self._last) > self.max_sessions:
            old, _ = self._last.popitem(last=False)
            self._agents.pop(old, None)

    def active(self, replica: str) -> tuple[ActiveRequest, ...]:
        """The requests in flight on ``replica``, oldest first (one tuple per change, shared by
        the states taken until the next start or finish there)."""
        totals = self._totals.get(replica)
        if totals is None:
            return ()
        if totals.snapshot is None:
            totals.snapshot = tuple(self._active[replica].values())
        return totals.snapshot

    def reservations(self) -> list[Reservation]:
        return list(self._inflight.values())

    def bound_tokens(self) -> dict[str, int]:
        """Reserved ``input + hi`` tokens per replica."""
        return {r: self._totals[r].bound_tokens if r in self._totals else 0 for r in self.replicas}

    def unreported_tokens(self, replica: str, since: float) -> int:
        """Bounds of the requests sent to ``replica`` at or after ``since`` (a load report taken
        at ``since`` cannot count them yet)."""
        return sum(res.request.bound_tokens for res in self._inflight.values()
                   if res.replica == replica and res.started_at >= since)

    def drain(self, replica: str, now: float) -> float | None:
        """KV tokens per second ``replica`` released over the last ``drain_window_s``:
        ``Σ tokens / min(window, now − started_at)``; None before anything finished there."""
        q = self._released.setdefault(replica, deque())
        while q and q[0][0] < now - self.drain_window_s:
            self._released_sum[replica] -= q.popleft()[1]
        span = min(self.drain_window_s, now - self.started_at)
        return self._released_sum[replica] / span if q and span > 0 else None

    def state(self, replica: str, capacity_tokens: int, now: float, *, reported_tokens: int = 0,
              reported_at: float | None = None) -> ReplicaState:
        """The policy's view of one replica: its capacity, our requests there, its own load
        report (``reported_tokens`` taken at ``reported_at``) and its drain rate."""
        unreported = self.unreported_tokens(replica, reported_at) if reported_at is not None else 0
        totals = self._totals.get(replica)
        return ReplicaState(replica, int(capacity_tokens), self.active(replica), int(reported_tokens),
                            unreported, self.drain(replica, now),
                            summary=totals.summary() if totals is not None else None)

    def totals(self, replica: str) -> ActiveTotals | None:
        """The running sums over ``replica``'s requests in flight (what :meth:`state` passes
        the policy; ``ActiveTotals.of(self.active(replica))`` recomputes them)."""
        return self._totals.get(replica)

    # ------------------------------------------------------------ queue depths
    def note_queue_depths(self, depths: Mapping[str, int]) -> None:
        """Record the replicas' (or model pools') waiting-queue depths from their latest reports."""
        self._queue_depths.update({str(k): int(v) for k, v in depths.items()})

    def forget_queue_depth(self, replica: str) -> None:
        self._queue_depths.pop(replica, None)

    def queue_depths(self) -> dict[str, int]:
        """Waiting requests per replica (or pool): the idle-downstream term's ``queue_depth``."""
        return dict(self._queue_depths)


class SessionPriorityBook:
    """Each session's workflow-level priority (alg. 3; ``policies.priority``).

    A session's reference is ``(score, since)``: the score its latest predicted call was given
    (``base + aging · session age`` at arrival) and when that call arrived; every call of the
    session is ranked by ``aged(score, since, now)``. An unknown call leaves the reference as it
    is; a session never predicted is created at the caller's fallback score (module doc).
    Each session also keeps the aging rate its latest predicted call was given
    (``PriorityPolicy.aging_rate``: ``aging_per_s``, or per session duration), :meth:`rate`.

    **The relative guard** (``PriorityPolicy.oldest_share = q``): the book also keeps which
    batch sessions are *live* — from a call's arrival (:meth:`note` with ``started_at``) until a
    call marked ``session_end`` finishes (:meth:`finished`), or until no call of it has been in
    flight for ``live_window_s`` — ordered by session start in a ``SortedList``. The oldest
    ``floor(q · n)`` of the ``n`` live batch sessions are *lifted*: their reference becomes
    ``(lifted_score, start)`` at the policy's ``aging_per_s``, so what it guarantees is: **a
    session among the oldest q of the live batch sessions is passed by no younger batch session
    that is not lifted, and the lifted ones are served in order of their start** (one model pool,
    ``slowdown_bound`` off; SGLang's integer rounding aside, ties going to the earlier call).
    The guard lives here because only this book sees the live set: the simulator's
    ``PriorityScheduler`` and the SGLang plugin keep it; a gateway without the plugin sends each
    call's own score. Each membership change
    moves at most a few sessions across the boundary; those whose reference changed are
    returned by :meth:`changed` so a caller's ordered queue can re-key them.
    """

    def __init__(self, policy: PriorityPolicy | None = None, max_sessions: int | None = 100_000) -> None:
        self.policy = policy or PriorityPolicy()
        self.max_sessions = max_sessions
        self._ref: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()
        #: session -> its aging rate, only where it differs from ``policy.aging_per_s``
        self._rate: dict[Hashable, float] = {}
        self.guard = self.policy.oldest_share is not None
        #: live batch sessions as (start, session key) in start order (the guard's order statistic)
        self._live: SortedList = SortedList()
        #: session -> its live key (start, tiebreak); its calls in flight; lifted sessions' own refs
        self._live_key: dict[Hashable, tuple[float, int]] = {}
        self._inflight: dict[Hashable, int] = {}
        #: live sessions with no call in flight -> when the last one finished (oldest first)
        self._idle: OrderedDict[Hashable, float] = OrderedDict()
        #: lifted sessions: their own references, and them as (key, session) in start order
        self._own: dict[Hashable, tuple[float, float]] = {}
        self._lifted: SortedList = SortedList()
        self._changed: set[Hashable] = set()
        self._seq = 0

    def note(self, session: Hashable, score: float | None, now: float,
             fallback: float | None = None, rate: float | None = None,
             started_at: float | None = None, batch: bool = True) -> tuple[float, float]:
        """A call of ``session`` arrived at ``now`` with ``score`` (None: no prediction).

        A known score replaces the session's reference; an unknown one keeps it, or, for a
        session without one, starts it at ``fallback`` (default: the policy's
        ``unknown_score``). ``rate`` is the known score's aging rate (default ``aging_per_s``; an
        unknown call keeps the session's). With the guard on, ``started_at`` (when the session
        started, on the caller's clock) makes the session live with one more call in flight, a
        batch one unless ``batch`` is False (an interactive session is never lifted). Returns the
        session's reference ``(score, since)`` (the lifted one while the guard lifts it)."""
        own = self._own.get(session)
        ref = own if own is not None else self._ref.get(session)
        if score is not None and ref is not None and self.policy.monotone:
            # a session's rank never falls (PriorityPolicy.monotone)
            score = max(float(score), self.policy.aged(ref[0], ref[1], now, self._own_rate(session)))
        if score is not None or ref is None:
            value = score if score is not None else (self.policy.unknown_score if fallback is None
                                                     else fallback)
            ref = (float(value), float(now))
            if own is not None:
                self._own[session] = ref
            else:
                self._ref[session] = ref
            if score is not None and rate is not None and rate != self.policy.aging_per_s:
                self._rate[session] = float(rate)
            else:
                self._rate.pop(session, None)
        self._ref.move_to_end(session)
        while self.max_sessions is not None and len(self._ref) > self.max_sessions:
            old, _ = self._ref.popitem(last=False)
            self._rate.pop(old, None)
            if self.guard:
                self._leave(old)
        if self.guard and started_at is not None:
            if batch:
                self._arrive(session, float(started_at))
            else:
                self._leave(session)
            self._expire(now)
            self._relift()
        return self._ref[session]

    # ------------------------------------------------------------ the relative guard
    def finished(self, session: Hashable, now: float, end: bool = False) -> None:
        """A call of ``session`` finished at ``now``; ``end``: it was marked ``session_end``,
        so the session is no longer live. No-op without the guard or for a session not live."""
        if not self.guard or session not in self._live_key:
            return
        if end:
            self._leave(session)
        else:
            n = self._inflight.get(session, 0) - 1
            if n > 0:
                self._inflight[session] = n
            else:
                self._inflight.pop(session, None)
                self._idle[session] = float(now)
                self._idle.move_to_end(session)
        self._expire(now)
        self._relift()

    def live(self, now: float | None = None) -> int:
        """How many batch sessions are live (at ``now``: after expiring the idle ones)."""
        if now is not None and self.guard:
            self._expire(now)
            self._relift()
        return len(self._live)

    def lifted(self, session: Hashable) -> bool:
        """Does the guard lift ``session`` now?"""
        return session in self._own

    def changed(self) -> set[Hashable]:
        """The sessions whose reference the guard changed (lifted or dropped) since the last
        call; the caller re-keys them in its ordered queues."""
        out, self._changed = self._changed, set()
        return out

    def _arrive(self, session: Hashable, started_at: float) -> None:
        if session not in self._live_key:
            self._seq += 1
            key = (started_at, self._seq)
            self._live_key[session] = key
            self._live.add((key, session))
            # the lifted sessions stay a prefix of the live order: one older than the youngest
            # lifted joins them (and the youngest may then drop out, :meth:`_relift`)
            if self._lifted and (key, session) < self._lifted[-1]:
                self._lift(session)
        self._idle.pop(session, None)
        self._inflight[session] = self._inflight.get(session, 0) + 1

    def _leave(self, session: Hashable) -> None:
        if session in self._own:
            self._drop(session)
        key = self._live_key.pop(session, None)
        if key is None:
            return
        self._live.remove((key, session))
        self._inflight.pop(session, None)
        self._idle.pop(session, None)

    def _expire(self, now: float) -> None:
        """Sessions with no call in flight for ``live_window_s`` are no longer live."""
        horizon = now - self.policy.live_window_s
        while self._idle:
            session, t = next(iter(self._idle.items()))
            if t >= horizon:
                break
            self._leave(session)

    def _relift(self) -> None:
        """Lift exactly the first ``floor(q · n)`` of the ``n`` live sessions. The lifted ones
        are always a prefix of the live order (:meth:`_arrive`, :meth:`_leave`), so only the
        boundary moves: O(log n) per session that crosses it."""
        k = int(self.policy.oldest_share * len(self._live))
        while len(self._lifted) > k:
            self._drop(self._lifted[-1][1])
        while len(self._lifted) < k:
            self._lift(self._live[len(self._lifted)][1])

    def _lift(self, session: Hashable) -> None:
        key = self._live_key[session]
        self._own[session] = self._ref[session]
        self._lifted.add((key, session))
        self._ref[session] = (self.policy.lifted_score(), key[0])
        self._changed.add(session)

    def _drop(self, session: Hashable) -> None:
        own = self._own.pop(session)
        self._lifted.remove((self._live_key[session], session))
        if session in self._ref:
            self._ref[session] = own
        self._changed.add(session)

    def _own_rate(self, session: Hashable) -> float:
        return self._rate.get(session, self.policy.aging_per_s)

    def rate(self, session: Hashable) -> float:
        """The session's aging rate per second (``aging_per_s`` unless its latest predicted call
        was given another; a lifted session ages at ``aging_per_s``)."""
        if session in self._own:
            return self.policy.aging_per_s
        return self._rate.get(session, self.policy.aging_per_s)

    def reference(self, session: Hashable | None) -> tuple[float, float] | None:
        return self._ref.get(session) if session is not None else None

    def score(self, session: Hashable, now: float) -> float | None:
        """The session's aged score at ``now`` (None: unknown session)."""
        ref = self._ref.get(session)
        return None if ref is None else self.policy.aged(ref[0], ref[1], now, self.rate(session))

    def priority(self, session: Hashable, now: float) -> int | None:
        """SGLang integer priority of the session at ``now`` (bigger runs first)."""
        s = self.score(session, now)
        return None if s is None else self.policy.to_sglang(s)

    def references(self) -> Mapping[Hashable, tuple[float, float]]:
        """Every session's ``(score, since)`` (a live read-only view, for a caller's sort key)."""
        return MappingProxyType(self._ref)

    def __len__(self) -> int:
        return len(self._ref)

    def __contains__(self, session: object) -> bool:
        return session in self._ref
