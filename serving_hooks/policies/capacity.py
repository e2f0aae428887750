"""Capacity-safe replica choice (Pythia algorithm 2): union bound over predicted upper bounds.

The rule
--------
Every active request ``i`` on a replica will hold at most ``input_i + hi_i`` KV tokens, where
``hi_i`` is the upper end of its predicted output band; that bound is wrong (the output runs
past ``hi_i``) with probability ``α_i`` (``1 − coverage`` of the band). A replica with KV
capacity ``C`` (SGLang's ``max_total_num_tokens``) is *safe* for a new request ``n`` when

    committed + input_n + hi_n ≤ C        (the bounds fit), and
    Σ_{i ∈ active ∪ {n}} α_i ≤ ε          (union bound: P(any bound broken) ≤ Σ α_i),

since running out of KV needs at least one request to break its bound, so
``P(OOM) ≤ P(∪_i {out_i > hi_i}) ≤ Σ_i α_i``. ``committed`` is what the replica already holds
or has promised:

    committed = max( Σ_active (input_i + hi_i),  reported + Σ_{i sent after the report} (input_i + hi_i) )

— the tracked bounds of the requests we sent, or the worker's own count (which also sees
traffic that did not come through us) plus what we sent since that count was taken.

Among safe replicas the choice maximises the expected headroom ``C − committed − input_n −
E[out_n]``; replicas within ``affinity_slack`` (a fraction of the best one's capacity) of the
best count as tied, and the tie goes to the replica the session last ran on (its prefix is
probably cached there). With no safe replica the least-loaded one (largest headroom as a
share of capacity) is returned and the decision says ``fallback=True``, so the caller can
count it in a metric.

Worked example: capacity 1000 with two active requests of ``300 + 200`` each has committed
``2 · 500 = 1000`` tokens, so a new ``100 + 50`` does not fit there. With ``α = 0.02`` per
request and ``ε = 0.05``, a third request is refused even on an empty, huge replica:
``3 · 0.02 = 0.06 > 0.05``.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ActiveRequest:
    """One request running (or queued) on a replica, with its predicted KV bound."""

    request_id: str
    input_tokens: int
    predicted_hi: int
    alpha: float
    session_id: str | None = None

    @property
    def bound_tokens(self) -> int:
        """``input + hi``: the most KV this request should ever hold (w.p. ``1 − α``)."""
        return int(self.input_tokens) + int(self.predicted_hi)


@dataclass(frozen=True)
class ReplicaState:
    """What is known about one replica at decision time.

    ``capacity_tokens`` is ``max_total_num_tokens``; ``reported_tokens`` the worker's own count
    of tokens in use or promised (``num_total_tokens`` of ``GET /v1/loads``: used + waiting);
    ``unreported_tokens`` the bounds of the active requests sent after that count was taken.
    """

    name: str
    capacity_tokens: int
    active: tuple[ActiveRequest, ...] = ()
    reported_tokens: int = 0
    unreported_tokens: int = 0

    @property
    def tracked_tokens(self) -> int:
        return sum(r.bound_tokens for r in self.active)

    @property
    def committed_tokens(self) -> int:
        """``max(Σ_active (input + hi), reported + unreported)``."""
        return max(self.tracked_tokens, int(self.reported_tokens) + int(self.unreported_tokens))

    @property
    def alpha_sum(self) -> float:
        return sum(r.alpha for r in self.active)


@dataclass(frozen=True)
class ReplicaCheck:
    """Why a replica is or is not safe for a request (one line of the decision's table)."""

    name: str
    fits: bool
    risk: float
    safe: bool
    headroom_tokens: float


@dataclass(frozen=True)
class Placement:
    """The outcome of :meth:`CapacityPolicy.choose`.

    ``replica`` is ``None`` only when no replica was given. ``fallback`` is true when no
    replica was safe and the least-loaded one was picked; ``affinity`` when the session's
    previous replica won a tie.
    """

    replica: str | None
    fallback: bool
    affinity: bool
    checks: tuple[ReplicaCheck, ...] = field(default=())


@dataclass(frozen=True)
class CapacityPolicy:
    """Pythia alg. 2 (union-bound capacity check); pure, stateless.

    Parameters
    ----------
    epsilon:
        Largest acceptable bound on P(OOM) for a replica (``Σ α_i ≤ ε``).
    default_alpha:
        ``α`` for a request without a prediction (``1 − coverage`` of the bands, 0.01 for
        the default 99 % coverage).
    affinity_slack:
        Replicas whose expected headroom is within this fraction of the best replica's
        capacity are tied; ties go to the session's last replica.
    """

    epsilon: float = 0.05
    default_alpha: float = 0.01
    affinity_slack: float = 0.05

    def check(
        self,
        replica: ReplicaState,
        input_tokens: int,
        predicted_hi: int,
        alpha: float | None = None,
        expected_out: float | None = None,
    ) -> ReplicaCheck:
        """Safety test of one replica for one new request (see the module docstring)."""
        a = self.default_alpha if alpha is None else float(alpha)
        need = int(input_tokens) + int(predicted_hi)
        fits = replica.committed_tokens + need <= replica.capacity_tokens
        risk = replica.alpha_sum + a
        exp_out = predicted_hi if expected_out is None else expected_out
        headroom = replica.capacity_tokens - replica.committed_tokens - input_tokens - exp_out
        return ReplicaCheck(
            name=replica.name,
            fits=fits,
            risk=risk,
            safe=fits and risk <= self.epsilon + 1e-12,
            headroom_tokens=float(headroom),
        )

    def choose(
        self,
        replicas: Sequence[ReplicaState],
        input_tokens: int,
        predicted_hi: int,
        alpha: float | None = None,
        expected_out: float | None = None,
        last_replica: str | None = None,
    ) -> Placement:
        """Pick a replica for a new request: safest-with-most-headroom, else least-loaded."""
        if not replicas:
            return Placement(replica=None, fallback=True, affinity=False)
        checks = tuple(
            self.check(r, input_tokens, predicted_hi, alpha, expected_out) for r in replicas
        )
        by_name = {r.name: r for r in replicas}
        safe = [c for c in checks if c.safe]
        if safe:
            best = max(safe, key=lambda c: c.headroom_tokens)
            slack = self.affinity_slack * by_name[best.name].capacity_tokens
            if last_replica is not None and last_replica != best.name:
                for c in safe:
                    if c.name == last_replica and c.headroom_tokens >= best.headroom_tokens - slack:
                        return Placement(replica=c.name, fallback=False, affinity=True, checks=checks)
            return Placement(
                replica=best.name, fallback=False, affinity=best.name == last_replica, checks=checks
            )
        least = max(
            checks,
            key=lambda c: c.headroom_tokens / max(1, by_name[c.name].capacity_tokens),
        )
        return Placement(replica=least.name, fallback=True, affinity=False, checks=checks)

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
