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
    """

    def __init__(self, policy: PriorityPolicy | None = None, max_sessions: int | None = 100_000) -> None:
        self.policy = policy or PriorityPolicy()
        self.max_sessions = max_sessions
        self._ref: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()
        #: session -> its aging rate, only where it differs from ``policy.aging_per_s``
        self._rate: dict[Hashable, float] = {}

    def note(self, session: Hashable, score: float | None, now: float,
             fallback: float | None = None, rate: float | None = None) -> tuple[float, float]:
        """A call of ``session`` arrived at ``now`` with ``score`` (None: no prediction).

        A known score replaces the session's reference; an unknown one keeps it, or, for a
        session without one, starts it at ``fallback`` (default: the policy's
        ``unknown_score``). ``rate`` is the known score's aging rate (default ``aging_per_s``; an
        unknown call keeps the session's). Returns the session's reference ``(score, since)``."""
        ref = self._ref.get(session)
        if score is not None and ref is not None and self.policy.monotone:
            # a session's rank never falls (PriorityPolicy.monotone)
            score = max(float(score), self.policy.aged(ref[0], ref[1], now, self._rate.get(session)))
        if score is not None or ref is None:
            value = score if score is not None else (self.policy.unknown_score if fallback is None
                                                     else fallback)
            ref = (float(value), float(now))
            self._ref[session] = ref
            if score is not None and rate is not None and rate != self.policy.aging_per_s:
                self._rate[session] = float(rate)
            else:
                self._rate.pop(session, None)
        self._ref.move_to_end(session)
        while self.max_sessions is not None and len(self._ref) > self.max_sessions:
            old, _ = self._ref.popitem(last=False)
            self._rate.pop(old, None)
        return ref

    def rate(self, session: Hashable) -> float:
        """The session's aging rate per second (``aging_per_s`` unless its latest predicted call
        was given another)."""
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
