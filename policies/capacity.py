"""Capacity-safe replica choice (Pythia algorithm 2): union bound over predicted upper bounds.

Every active request ``i`` on a replica will hold at most ``input_i + U_i(α_i)`` KV tokens, where
``U_i(α)`` is the one-sided (1 − α) upper bound of its output length. A replica with KV capacity
``C`` (SGLang's ``max_total_num_tokens``) is *safe* for a new request ``n`` when

    Σ_{i ∈ active ∪ {n}} (input_i + U_i(α_i)) ≤ C      (the bounds fit), and
    Σ_{i ∈ active ∪ {n}} α_i ≤ ε                       (union bound: P(any bound broken) ≤ Σ α_i).

A request that carries its table of bounds ``((α, U(α)), …)`` (``ActiveRequest.upper_bounds``)
takes its share of the budget, ``α_F = (ε − Σ_{fixed-α} α_i) / |F|``, so the check tightens as
the batch grows; ``committed(α)`` is the larger of the bounds we sent and the worker's own count
plus what we sent since it was taken.

Where a request goes (one rule for the gateway and the simulator): a session stays on its last
replica while that replica is safe; it moves only when the home is unsafe by ``move_margin``,
another replica is safe, and the wait the move saves exceeds ``move_gain_ratio`` (2) times the
cost of rebuilding on the target what the session holds at home — the moving call's cached prefix
and, weighted by ``left_behind_weight``, the prefixes its other agents leave there (each rebuilt
when that agent runs next); a new session goes to the safe replica with
the largest expected headroom. ``fallback=True`` marks decisions with no replica safe;
``moved=True`` a session sent off its last replica, with the ``recompute_tokens`` it costs.

The rule in full, the worked example and why the gain must be twice the cost (the measured
figures and their commands): docs/routing.md.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

#: ((α, U(α)), …), largest α first: one-sided upper bounds of an output length.
BoundTable = tuple[tuple[float, int], ...]


def bound_at(table: BoundTable, alpha: float) -> int:
    """``U(α)`` from a table (largest α first): the entry of the largest tabulated α ≤ ``alpha``;
    the last (most conservative) entry past the table's end. Tables from a profile with
    ``certified_alpha`` hold the band's ceiling (twice its largest observed length, or the user's
    ``max_output_tokens``) at every α below it, so a tiny α never yields an extrapolated bound."""
    for a, u in table:
        if a <= alpha:
            return int(u)
    return int(table[-1][1])


@dataclass(frozen=True)
class ActiveRequest:
    """One request running (or queued) on a replica, with its predicted KV bound.

    ``predicted_hi``/``alpha`` are a single bound and its risk; ``upper_bounds``, when given, is
    the request's table of bounds and makes it share the replica's risk budget (module doc).
    ``expected_out`` is its expected output length (default: ``predicted_hi``); ``agent_id`` the
    session's agent that sent it (the ledger keeps each agent's prefix apart, ``None``: unknown).
    """

    request_id: str
    input_tokens: int
    predicted_hi: int
    alpha: float
    session_id: str | None = None
    upper_bounds: BoundTable = ()
    expected_out: float | None = None
    agent_id: str | None = None

    @property
    def bound_tokens(self) -> int:
        """``input + hi``: the most KV this request should ever hold (w.p. ``1 − α``)."""
        return int(self.input_tokens) + int(self.predicted_hi)

    @property
    def expected_tokens(self) -> float:
        """``input + E[out]``."""
        out = self.predicted_hi if self.expected_out is None else self.expected_out
        return float(self.input_tokens) + float(out)


#: Fixed point of the exact sums: every finite double is an integer multiple of 2^-1074.
_EXACT_SHIFT = 1074


def _exact(x: float) -> int:
    """``x · 2^1074`` as an integer: exact for every finite double (``x = n / 2^k``, k ≤ 1074)."""
    n, d = float(x).as_integer_ratio()
    return n << (_EXACT_SHIFT - d.bit_length() + 1)


@dataclass(frozen=True)
class ActiveSummary:
    """The sums over a replica's active requests that :meth:`CapacityPolicy.check` reads.

    ``fixed_alpha`` and ``expected_tokens`` are the *correctly rounded* sums of their terms (the
    float nearest the exact sum, as ``math.fsum`` gives): independent of the order the requests
    were added and removed in, so a running total and a sum from scratch are the same number."""

    fixed_alpha: float          # Σ α of requests without a bound table
    fixed_tokens: int           # Σ (input + hi) of requests without a table
    flex_input: int             # Σ input of requests with a table
    tables: tuple[tuple[BoundTable, int], ...]   # (table, how many requests carry it), sorted
    expected_tokens: float      # Σ (input + E[out])
    bound_tokens: int           # Σ (input + hi) of every request

    @property
    def flexible_count(self) -> int:
        return sum(n for _, n in self.tables)


class ActiveTotals:
    """Running sums over a set of :class:`ActiveRequest` (a replica's in-flight requests) under
    :meth:`add` / :meth:`remove`, so a routing decision reads them in O(distinct tables) instead
    of summing every request again. Float terms are summed exactly (integers in units of
    2^-1074) and rounded once in :meth:`summary`: the running value equals the from-scratch
    value bit for bit, however many adds and removes came before (``ActiveTotals.of(active)``
    is that from-scratch value). Requests with equal bound tables are grouped (by identity, as
    the ledger interns them; equal tables under two identities give the same sums)."""

    __slots__ = ("_alpha", "_expected", "fixed_tokens", "flex_input", "bound_tokens", "_tables", "count",
                 "_summary", "snapshot")

    def __init__(self) -> None:
        self._alpha = 0
        self._expected = 0
        self.fixed_tokens = 0
        self.flex_input = 0
        self.bound_tokens = 0
        self._tables: dict[int, list] = {}      # id(table) -> [table, count]
        self.count = 0
        self._summary: ActiveSummary | None = None
        #: A caller's tuple of the requests counted, cleared on every change (the ledger keeps
        #: its ``active`` tuple here so that it is rebuilt once per change, not per decision).
        self.snapshot: tuple[ActiveRequest, ...] | None = None

    @classmethod
    def of(cls, active: Iterable[ActiveRequest]) -> "ActiveTotals":
        """The totals of ``active`` summed from scratch."""
        t = cls()
        for r in active:
            t.add(r)
        return t

    def add(self, r: ActiveRequest) -> None:
        self._apply(r, 1)

    def remove(self, r: ActiveRequest) -> None:
        """Take back a request :meth:`add` counted (the same object or an equal one)."""
        self._apply(r, -1)

    def _apply(self, r: ActiveRequest, sign: int) -> None:
        self._summary = None
        self.snapshot = None
        self.count += sign
        bound = r.bound_tokens
        self.bound_tokens += sign * bound
        self._expected += sign * _exact(r.expected_tokens)
        if r.upper_bounds:
            self.flex_input += sign * int(r.input_tokens)
            slot = self._tables.get(id(r.upper_bounds))
            if slot is None:
                slot = self._tables[id(r.upper_bounds)] = [r.upper_bounds, 0]
            slot[1] += sign
            if slot[1] == 0:
                del self._tables[id(r.upper_bounds)]
        else:
            self._alpha += sign * _exact(r.alpha)
            self.fixed_tokens += sign * bound

    def summary(self) -> ActiveSummary:
        """The sums now (floats rounded once from the exact totals; kept until the next change)."""
        if self._summary is None:
            scale = 1 << _EXACT_SHIFT
            self._summary = ActiveSummary(self._alpha / scale, self.fixed_tokens, self.flex_input,
                                          tuple(sorted((t, n) for t, n in self._tables.values())),
                                          self._expected / scale, self.bound_tokens)
        return self._summary


@dataclass(frozen=True)
class ReplicaState:
    """What is known about one replica at decision time.

    ``capacity_tokens`` is ``max_total_num_tokens``; ``reported_tokens`` the worker's own count
    of tokens in use or promised (``num_total_tokens`` of ``GET /v1/loads``: used + waiting);
    ``unreported_tokens`` the bounds of the active requests sent after that count was taken;
    ``drain_tokens_per_s`` how fast it releases KV (for the expected wait of a request).
    """

    name: str
    capacity_tokens: int
    active: tuple[ActiveRequest, ...] = ()
    reported_tokens: int = 0
    unreported_tokens: int = 0
    #: KV tokens per second the replica releases (finished requests), when measured.
    drain_tokens_per_s: float | None = None
    #: The sums over ``active`` the check reads, kept up to date by the caller
    #: (:class:`ActiveTotals`, as ``CapacityLedger`` does); None: summed over ``active`` here.
    #: Both give the same numbers (exact sums), so a caller may pass either.
    summary: ActiveSummary | None = field(default=None, compare=False, repr=False)

    def expected_wait_s(self, headroom_tokens: float) -> float | None:
        """``max(0, −headroom) / drain``: seconds until an overflow drains (None: no drain rate)."""
        if headroom_tokens >= 0:
            return 0.0
        if not self.drain_tokens_per_s or self.drain_tokens_per_s <= 0:
            return None
        return -headroom_tokens / self.drain_tokens_per_s

    @property
    def tracked_tokens(self) -> int:
        """``Σ_active (input + hi)``."""
        return self._split.bound_tokens

    @property
    def committed_tokens(self) -> int:
        """``max(Σ_active (input + hi), reported + unreported)`` (each request's own bound)."""
        return max(self.tracked_tokens, int(self.reported_tokens) + int(self.unreported_tokens))

    @cached_property
    def _split(self) -> ActiveSummary:
        """(Σ α fixed, Σ bound fixed, Σ input flexible, [(table, count)], Σ expected tokens, Σ
        bound): ``summary`` when the caller keeps it, else summed over ``active``."""
        return self.summary if self.summary is not None else ActiveTotals.of(self.active).summary()

    @property
    def flexible_count(self) -> int:
        return self._split.flexible_count

    @property
    def fixed_alpha(self) -> float:
        return self._split.fixed_alpha

    def committed_at(self, alpha_flexible: float) -> int:
        """``committed(α)``: tables read at ``alpha_flexible``, fixed requests at their own bound."""
        sp = self._split
        tracked = sp.fixed_tokens + sp.flex_input + sum(n * bound_at(t, alpha_flexible) for t, n in sp.tables)
        return max(tracked, int(self.reported_tokens) + int(self.unreported_tokens))

    @property
    def expected_committed(self) -> float:
        """``max(Σ_active (input + E[out]), reported + unreported)``."""
        return max(self._split.expected_tokens, float(self.reported_tokens) + float(self.unreported_tokens))


@dataclass(frozen=True)
class ReplicaCheck:
    """Why a replica is or is not safe for a request (one line of the decision's table).

    ``risk`` is the union bound Σ α_i used, ``alpha_each`` the risk given to each request with
    a bound table (None when there is none), ``headroom_tokens`` the expected headroom."""

    name: str
    fits: bool
    risk: float
    safe: bool
    headroom_tokens: float
    alpha_each: float | None = None
    #: ``committed(α) + input + U(α) − capacity``: by how much the bound overflows (> 0: no fit).
    overflow_tokens: int = 0


@dataclass(frozen=True)
class Placement:
    """The outcome of :meth:`CapacityPolicy.choose`.

    ``replica`` is ``None`` only when no replica was given. ``fallback`` is true when no
    replica was safe; ``affinity`` when the request stays on the session's last replica;
    ``moved`` when the session leaves it, ``recompute_tokens`` the cached prefix tokens the
    target prefills again because of that move (0 otherwise) and ``left_behind_tokens`` the
    prefixes of the session's other agents it leaves on the old replica (rebuilt later).
    """

    replica: str | None
    fallback: bool
    affinity: bool
    checks: tuple[ReplicaCheck, ...] = field(default=())
    moved: bool = False
    recompute_tokens: int = 0
    left_behind_tokens: int = 0


@dataclass(frozen=True)
class CapacityPolicy:
    """Pythia alg. 2 (union-bound capacity check, risk split over the batch); pure, stateless.

    Parameters
    ----------
    epsilon:
        Largest acceptable bound on P(OOM) for a replica (``Σ α_i ≤ ε``).
    default_alpha:
        ``α`` for a request without a prediction (``1 − coverage`` of the bands, 0.01 for
        the default 99 % coverage).
    affinity_slack:
        Without drain rates, a session leaves its last replica only for one whose expected
        headroom is larger by more than this fraction of capacity (and where, unlike at home,
        the request fits in expectation).
    prefill_s_per_token:
        Seconds to prefill one prompt token on a replica: the price of rebuilding a prefix
        (default: the simulator's calibration on SWE-agent/GLM-4.5 traces, 1.29e-4 s).
    move_cost_factor:
        A move costs this many times the prefill of the session's cached prefix (2: the
        rebuild on the target plus the cached data it displaces there).
    move_margin:
        A session leaves its last replica only when the bound there overflows the capacity by
        more than this share of it (``overflow_tokens > move_margin · C``).
    move_gain_ratio:
        A move must save at least this many times what it costs: ``w_home − w_target >
        move_gain_ratio · move_cost_s`` (2; 1 is the rule before, which moved sessions whose
        saved wait barely passed the rebuild: module doc, "Why the gain must be twice the cost").
    rebuild_delays_target:
        Cost a move's rebuild as load on the target: each request in flight there waits it
        out too (``move_cost_s(cached, n_target)``). False: the moved session's own rebuild
        only (the rule before; it moves more sessions under deep queues).
    left_behind_weight:
        Share of the session's other agents' prefixes on the old replica (each agent's last
        input + expected output, kept by :class:`~policies.bookkeeping.CapacityLedger`) added
        to the tokens a move rebuilds: a multi-agent session that moves rebuilds them on the
        target when those agents run next. 0: the moving call's prefix only (the rule before).
    """

    epsilon: float = 0.05
    default_alpha: float = 0.01
    affinity_slack: float = 0.05
    prefill_s_per_token: float = 1.29e-4
    move_cost_factor: float = 2.0
    move_margin: float = 0.1
    move_gain_ratio: float = 2.0
    rebuild_delays_target: bool = True
    left_behind_weight: float = 1.0

    def check(
        self,
        replica: ReplicaState,
        input_tokens: int,
        predicted_hi: int,
        alpha: float | None = None,
        expected_out: float | None = None,
        upper_bounds: BoundTable = (),
    ) -> ReplicaCheck:
        """Safety test of one replica for one new request (see the module docstring)."""
        a = self.default_alpha if alpha is None else float(alpha)
        exp_out = predicted_hi if expected_out is None else expected_out
        headroom = (replica.capacity_tokens - replica.expected_committed
                    - float(input_tokens) - float(exp_out))
        n_flex = replica.flexible_count + (1 if upper_bounds else 0)
        fixed_alpha = replica.fixed_alpha + (0.0 if upper_bounds else a)
        if n_flex:
            budget = self.epsilon - fixed_alpha
            alpha_each = budget / n_flex if budget > 0 else 0.0
            risk = fixed_alpha + n_flex * alpha_each
            within = budget > 0
            probe = alpha_each if within else 1e-12
            new_bound = (int(input_tokens) + bound_at(upper_bounds, probe) if upper_bounds
                         else int(input_tokens) + int(predicted_hi))
            overflow = replica.committed_at(probe) + new_bound - replica.capacity_tokens
        else:
            alpha_each = None
            risk = fixed_alpha
            within = risk <= self.epsilon + 1e-12
            need = int(input_tokens) + int(predicted_hi)
            overflow = replica.committed_tokens + need - replica.capacity_tokens
        fits = overflow <= 0
        return ReplicaCheck(
            name=replica.name,
            fits=fits,
            risk=risk,
            safe=fits and within,
            headroom_tokens=float(headroom),
            alpha_each=alpha_each,
            overflow_tokens=int(overflow),
        )

    def choose(
        self,
        replicas: Sequence[ReplicaState],
        input_tokens: int,
        predicted_hi: int,
        alpha: float | None = None,
        expected_out: float | None = None,
        last_replica: str | None = None,
        upper_bounds: BoundTable = (),
        cached_tokens: int | None = None,
        left_behind_tokens: int = 0,
    ) -> Placement:
        """Pick a replica for a new request (see the module docstring): the session's last
        replica unless it is unsafe by ``move_margin``, another is safe and the move saves
        more than rebuilding the prefix costs; with no replica safe, the last replica all the
        same; a new session goes to the safe replica with the most expected headroom, else to
        the most headroom as a share of capacity.

        ``cached_tokens`` is the prefix the session holds on ``last_replica`` (default: the
        whole prompt, ``input_tokens``): what a move makes the target prefill again;
        ``left_behind_tokens`` the prefixes of the session's other agents there (rebuilt on the
        target later), added to the move's cost at ``left_behind_weight``."""
        if not replicas:
            return Placement(replica=None, fallback=True, affinity=False)
        checks = tuple(
            self.check(r, input_tokens, predicted_hi, alpha, expected_out, upper_bounds)
            for r in replicas
        )
        by_name = {r.name: r for r in replicas}
        safe = [c for c in checks if c.safe]
        home = next((c for c in checks if c.name == last_replica), None)
        if home is None:        # a new session (or its replica is not a candidate): most headroom
            if safe:
                best = max(safe, key=lambda c: c.headroom_tokens)
            else:
                best = max(checks, key=lambda c: c.headroom_tokens / max(1, by_name[c.name].capacity_tokens))
            return Placement(replica=best.name, fallback=not safe, affinity=False, checks=checks)
        stay = Placement(replica=home.name, fallback=not safe, affinity=True, checks=checks)
        if home.safe or not safe:
            return stay
        home_state = by_name[home.name]
        if home.overflow_tokens <= self.move_margin * home_state.capacity_tokens:
            return stay
        best = max(safe, key=lambda c: c.headroom_tokens)
        cached = input_tokens if cached_tokens is None else cached_tokens
        behind = max(0, int(left_behind_tokens))
        rebuilt = max(0, int(cached)) + self.left_behind_weight * behind
        if not self._worth_moving(home_state, home, by_name[best.name], best, rebuilt):
            return stay
        return Placement(replica=best.name, fallback=False, affinity=False, checks=checks,
                         moved=True, recompute_tokens=max(0, int(cached)), left_behind_tokens=behind)

    def move_cost_s(self, cached_tokens: float, target_requests: int = 0) -> float:
        """``(move_cost_factor + target_requests) · cached_tokens · prefill_s_per_token``
        (``cached_tokens``: what the move rebuilds, :meth:`choose`): the moved session's rebuild, and the same prefill time for each of the ``target_requests``
        in flight on the target (its recompute is load there, shared by all of them)."""
        return ((self.move_cost_factor + max(0, int(target_requests)))
                * max(0.0, float(cached_tokens)) * self.prefill_s_per_token)

    def _worth_moving(self, home: ReplicaState, home_check: ReplicaCheck, target: ReplicaState,
                      target_check: ReplicaCheck, cached_tokens: float) -> bool:
        w_home = home.expected_wait_s(home_check.headroom_tokens)
        w_target = target.expected_wait_s(target_check.headroom_tokens)
        if w_home is not None and w_target is not None:
            n_target = len(target.active) if self.rebuild_delays_target else 0
            return w_home - w_target > self.move_gain_ratio * self.move_cost_s(cached_tokens, n_target)
        slack = self.affinity_slack * target.capacity_tokens
        gain = target_check.headroom_tokens - home_check.headroom_tokens
        return home_check.headroom_tokens < 0 <= target_check.headroom_tokens and gain > slack

    @staticmethod
    def safe_names(placement: Placement) -> list[str]:
        return [c.name for c in placement.checks if c.safe]


def replicas_from_snapshot(
    capacities: dict[str, int],
    active: Iterable[tuple[str, ActiveRequest]],
    reported: dict[str, int] | None = None,
) -> list[ReplicaState]:
    """Build :class:`ReplicaState` objects from flat tables (handy for callers and the simulator).

    ``active`` yields ``(replica_name, request)`` pairs; ``reported`` maps names to the
    worker-reported token counts.
    """
    per: dict[str, list[ActiveRequest]] = {name: [] for name in capacities}
    for name, req in active:
        per.setdefault(name, []).append(req)
    rep = reported or {}
    return [
        ReplicaState(name, int(cap), tuple(per.get(name, ())), int(rep.get(name, 0)))
        for name, cap in capacities.items()
    ]
