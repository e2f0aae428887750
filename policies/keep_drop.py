"""Speculative keep/drop of a session's KV prefix (Pythia alg. 1 with a SAGA-style TTL).

When a call finishes, its session's KV prefix (the history the next call will extend) gets a
rank for the radix cache's eviction order:

* **kept** (``KEEP``) when the predicted path goes on (``p_end < drop_end_p``; without it,
  ``expected_remaining_calls ≥ min_remaining_calls``) and comes back to this lineage
  (``revisit_p ≥ min_revisit_p``), until ``now + clip(TTL, min_ttl_s, max_ttl_s)``, the TTL being
  the quantile of the session's idle gap (``keep_alive_ttl_s``), else of the tool's latency;
* **dropped** (``DROP``, evicted first) when the path predicts the end, or does not come back to
  this lineage, or the call is announced as its session's last (``session_end``);
* **neutral** (``NEUTRAL``, plain LRU) without a prediction.

A kept prefix falls back to ``NEUTRAL`` once ``retain_until`` has passed, so a retention never
pins memory forever; the eviction order is ``(rank at now, last access)``, smallest first.
Keeping is off by default (``keep_idle=False``: a call that would be kept stays ``NEUTRAL``);
why, with the simulator runs that chose it: docs/keep-alive.md, "The keep/drop rule".
``revisit_p`` is read from the graph predictions by :func:`revisit_probability`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

from statistics import NormalDist

from predictors.served import HELD_TTL_DEFAULT_S, HELD_TTL_MAX_S, HELD_TTL_MIN_S
from predictors.contract import Annotation


class RetentionRank(IntEnum):
    """Eviction class; smaller is evicted first."""

    DROP = 0
    NEUTRAL = 1
    KEEP = 2


@dataclass(frozen=True)
class Retention:
    """Keep/drop decision for one session prefix, valid from ``decided_at``."""

    rank: RetentionRank
    retain_until: float
    decided_at: float
    reason: str

    def rank_at(self, now: float) -> RetentionRank:
        """The rank in force at ``now``: a KEEP whose TTL ran out is NEUTRAL again."""
        if self.rank == RetentionRank.KEEP and now >= self.retain_until:
            return RetentionRank.NEUTRAL
        return self.rank

    @property
    def ttl_s(self) -> float:
        return max(0.0, self.retain_until - self.decided_at)


def lognormal_quantile(mu: float, sigma: float, q: float = 0.95) -> float:
    """``Q_q`` of a lognormal: ``exp(μ + σ · Φ⁻¹(q))`` (scipy's ``lognorm(s=σ, scale=e^μ).ppf``,
    computed with the standard library so the serving path loads no scipy). The one copy: the
    tool-latency fit calls scipy's vectorized ``lognorm.ppf`` directly."""
    return math.exp(mu + sigma * NormalDist().inv_cdf(q))


def revisit_probability(ann: Annotation, lineage: str = "session") -> float:
    """Probability that a later call of this session reuses the finished call's prefix.

    * ``lineage="session"`` (default; agents that extend one conversation, like SWE-agent):
      any later call of the workflow reuses it, so the probability is ``1 − p_end`` (the
      automaton's probability that another call follows) when known, else
      ``min(1, E[remaining calls])`` (an upper bound on P(at least one more call) that is
      exact for 0 and saturates at 1).
    * ``lineage="agent"``: only a later call of the same agent reuses it: the next-agent
      probability when the next agent is this one, else 1 when the graph's expected
      distance to this agent is within the remaining calls, else 0.
    """
    remaining = ann.expected_remaining_calls or 0.0
    if lineage == "session":
        if ann.p_end is not None:
            return max(0.0, min(1.0, 1.0 - ann.p_end))
        return max(0.0, min(1.0, remaining))
    if lineage != "agent":
        raise ValueError(f"lineage must be 'session' or 'agent', got {lineage!r}")
    for nxt in ann.next_agents:
        if nxt.agent_id == ann.agent_id:
            return nxt.p
    distance = ann.expected_distance.get(ann.agent_id or "")
    if distance is not None and distance <= max(1.0, remaining):
        return 1.0
    return 0.0


@dataclass(frozen=True)
class KeepDropPolicy:
    """Pythia alg. 1 keep/drop with a SAGA TTL; pure: ``now`` is always passed in.

    Parameters
    ----------
    min_remaining_calls:
        Below this expected number of remaining calls the session is considered finished
        (used when the prediction carries no ``p_end``).
    drop_end_p:
        From this probability that no call follows (``p_end``) the session is finished
        (0.7 = 1 − ``min_revisit_p``: the end is predicted more than twice as likely as a
        return).
    min_revisit_p:
        Below this revisit probability the prefix is not worth keeping.
    quantile:
        Tool-latency quantile used as TTL (0.95: SAGA's p95).
    min_ttl_s, max_ttl_s:
        Bounds of the TTL (defaults: :data:`predictors.served.HELD_TTL_MIN_S` / ``HELD_TTL_MAX_S``,
        the bounds the online keep-alive level judges outcomes against); ``default_ttl_s`` is used
        when the tool's latency is unknown.
    lineage:
        What counts as a revisit (see :func:`revisit_probability`).
    keep_idle:
        Keep a prefix for its TTL (``KEEP``); False (default): such a call is ``NEUTRAL``
        (module docstring, "Keeping is off by default").
    """

    min_remaining_calls: float = 0.5
    drop_end_p: float = 0.7
    min_revisit_p: float = 0.3
    quantile: float = 0.95
    min_ttl_s: float = HELD_TTL_MIN_S
    max_ttl_s: float = HELD_TTL_MAX_S
    default_ttl_s: float = HELD_TTL_DEFAULT_S
    lineage: str = "session"
    keep_idle: bool = False

    def ttl_s(
        self,
        tool_p95_s: float | None = None,
        mu: float | None = None,
        sigma: float | None = None,
    ) -> float:
        """TTL for the tool just called, bounded to ``[min_ttl_s, max_ttl_s]``.

        From the fitted lognormal ``(mu, sigma)`` when given (quantile :attr:`quantile`),
        else from the profile's ``p95_s``, else :attr:`default_ttl_s`.
        """
        if mu is not None and sigma is not None:
            raw = lognormal_quantile(mu, sigma, self.quantile)
        elif tool_p95_s is not None:
            raw = float(tool_p95_s)
        else:
            raw = self.default_ttl_s
        return min(self.max_ttl_s, max(self.min_ttl_s, raw))

    def decide(
        self,
        now: float,
        known: bool,
        remaining_calls: float | None,
        revisit_p: float,
        tool_p95_s: float | None = None,
        tool_mu: float | None = None,
        tool_sigma: float | None = None,
        p_end: float | None = None,
        session_end: bool = False,
    ) -> Retention:
        """Keep/drop decision at the completion of a call (see the module docstring)."""
        if session_end:
            return Retention(RetentionRank.DROP, now, now, "session ends")
        if not known or remaining_calls is None:
            return Retention(RetentionRank.NEUTRAL, now, now, "no prediction")
        ends = (p_end >= self.drop_end_p) if p_end is not None else (
            remaining_calls < self.min_remaining_calls)
        if ends:
            return Retention(RetentionRank.DROP, now, now, "path ends")
        if revisit_p < self.min_revisit_p:
            return Retention(RetentionRank.DROP, now, now, "path does not revisit")
        ttl = self.ttl_s(tool_p95_s, tool_mu, tool_sigma)
        if not self.keep_idle:
            return Retention(RetentionRank.NEUTRAL, now, now, f"keeping off (would retain {ttl:.2f}s)")
        return Retention(RetentionRank.KEEP, now + ttl, now, f"retain {ttl:.2f}s")

    def decide_annotation(self, ann: Annotation, now: float, tool: str | None = None) -> Retention:
        """:meth:`decide` from one call's :class:`Annotation` (the gateway's, or the plugin's
        read back from custom_params).

        The TTL before bounding is, first available: ``keep_alive_ttl_s`` (the idle-gap
        quantile, what the KV actually waits for), ``retain_s`` (the predictor's tool-latency
        quantile), the p95 of ``tool`` (None: the agent's most frequent tool,
        :meth:`Annotation.tool_p95_of`).
        """
        ttl = next((v for v in (ann.keep_alive_ttl_s, ann.retain_s) if v is not None),
                   ann.tool_p95_of(tool))
        return self.decide(
            now,
            ann.known,
            ann.expected_remaining_calls,
            revisit_probability(ann, self.lineage),
            tool_p95_s=ttl,
            p_end=ann.p_end,
            session_end=ann.session_end is True,
        )

