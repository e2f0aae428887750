"""Online choice of the served keep-alive TTL among candidates: never dominated on the gaps seen.

The fit serves one idle-gap TTL per call (the session-corrected quantile, stretched online by the
keep-alive level: :mod:`predictors.online_calibration`). On a log that drifts, or where its
entries keep a past shape, a simpler TTL can be ahead on the server's own outcomes: the plain
per-type p95 of the training gaps (``idle_gap_p95``), the tool's p95 (``tool_p95``, the policy's
10 s default without one), or, for a type many of whose gaps run past the policy's cap, a TTL that
gives up on those (``give_up``: the quantile of the training gaps that end within the cap, which a
held TTL can cover at all; holding the cap for the rest only holds KV for nothing).

**Outcomes.** Every served call carries the TTL each candidate would have served; when its
session's next call arrives, the idle gap ``g`` scores them all on the same gap, as
``profiler eval`` does: candidate ``c`` covers it when ``g ≤ held(c)`` (held as the keep/drop
policy holds it, 0.5–120 s) and holds ``min(held(c), g)`` KV-seconds.

**Decision.** Per workflow type, exponentially weighted sums (half-life :data:`HALF_LIFE`
outcomes) of the vector ``x = (covered_c, kv_c)`` over the candidates and of ``x xᵀ`` give, for
each candidate against the fitted one, the coverage difference and the KV-seconds-per-covered-gap
difference (a ratio: its standard error by the delta method, the linearisation the jackknife of
``profiler eval`` approximates), each over ``n_eff = (Σw)² / Σw²`` outcomes.

**Warm start.** The sums do not start at zero: the fit replays the training side forward in time
(the idle-gap fit's rolling origins: each block of workflows served the TTLs fitted on those
before it) and stores the sums over that replay in the profile
(``idle_gap.workflow_types.<type>.selection_warm_start``, :func:`predictors.keep_alive_compare.warm_start_state`);
:meth:`KeepAliveSelector.warm_start` seeds each type from it on every profile load, so the first
call is served the candidate the training side's future puts ahead and a stationary type pays no
exploration. The replay's ``fitted`` TTL is the fit's own, without the online level. After
:data:`MIN_OUTCOMES` effective outcomes, each outcome re-decides: the candidate *ahead* of the
fitted one beyond :data:`MARGIN` standard errors serves — it covers more at a cost not above
beyond the margin, or holds less at a coverage not below beyond it and reaches nominal on the
gaps seen (the fit's forward rule) — the one with the largest coverage z among several, else the
fitted one. The keep-alive level keeps learning on the fitted candidate's own hits whichever
serves (as the band's own arm does). Constants chosen on the training side of the time splits
(``bench/bench_keep_alive_select.py --side train``); off by default (``Predictor``).

O(k²) per outcome and O(k) per served call for k ≤ 4 candidates; memory O(k²) per type.
Measured in docs/keep-alive.md ("Online choice among keep-alive candidates").
"""
from __future__ import annotations

import math
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from predictors.online_calibration import KEEP_ALIVE_NOMINAL
from predictors.keep_alive_compare import WARM_START_HALF_LIFE
from predictors.served import held_ttl_s

#: The candidates, in the order their TTLs are carried (index 0: the fitted TTL, served first).
CANDIDATES = ("fitted", "idle_gap_p95", "tool_p95", "give_up")
#: Half-life of the evidence, in idle gaps of the type (100 and 300 switched back and forth more).
HALF_LIFE = WARM_START_HALF_LIFE
#: Standard errors a candidate must be ahead by to be switched to (2 since the warm start: chosen
#: on the train side, where 1 switched back and forth on SWE-agent and mini-SWE).
MARGIN = 2.0
#: Effective outcomes of the type before any switch (20 took a p95 below nominal on messy's train side).
MIN_OUTCOMES = 30.0
#: The most effective gaps the fit's warm start counts for (inf: all of the training side's replay).
WARM_GAPS = math.inf


class _TypeState:
    """One type's evidence: EW ``Σw``, ``Σw²``, ``Σw x`` and ``Σw x xᵀ`` over ``x = (covered, kv)``."""

    __slots__ = ("sw", "sw2", "s1", "s2", "served", "switches", "outcomes", "served_calls")

    def __init__(self, k: int) -> None:
        self.sw = self.sw2 = 0.0
        self.s1 = np.zeros(2 * k)
        self.s2 = np.zeros((2 * k, 2 * k))
        self.served = 0           # index of the candidate served now
        self.switches = 0
        self.outcomes = 0
        self.served_calls = np.zeros(k, dtype=np.int64)


class KeepAliveSelector:
    """Per workflow type, which keep-alive candidate is served (module doc). Thread-safe.

    Parameters
    ----------
    half_life : idle gaps of the type after which an outcome's weight halves.
    margin : standard errors a candidate must be ahead by (coverage or KV-seconds per covered gap).
    min_outcomes : effective outcomes of the type before any switch.
    nominal : the TTL's nominal coverage: a candidate is switched to for holding less only where
        its coverage on the gaps seen reaches it.
    warm : start each type from the fit's forward replay of the training side stored in the
        profile (:meth:`warm_start`); False: from no evidence (the fitted candidate serves until
        ``min_outcomes`` gaps are seen).
    warm_gaps : the warm start counts as at most this many effective gaps (its sums scaled down,
        its means kept), so the server's own gaps outweigh the training side's after as many.
    """

    def __init__(self, half_life: float = HALF_LIFE, margin: float = MARGIN,
                 min_outcomes: float = MIN_OUTCOMES, nominal: float = KEEP_ALIVE_NOMINAL,
                 warm: bool = True, warm_gaps: float = WARM_GAPS) -> None:
        if half_life <= 0 or margin < 0:
            raise ValueError(f"half_life must be positive and margin >= 0, got {half_life}, {margin}")
        self.margin = float(margin)
        #: the TTL's nominal coverage (the profile's idle-gap quantile; the Predictor sets it)
        self.nominal = float(nominal)
        self.min_outcomes = float(min_outcomes)
        #: seed each type from the profile's forward replay (:meth:`warm_start`); False: start empty
        self.warm = bool(warm)
        #: the most effective gaps the warm start's evidence counts for (its weight, not its means)
        self.warm_gaps = float(warm_gaps)
        self._decay = 2.0 ** (-1.0 / float(half_life))
        self._k = len(CANDIDATES)
        self._types: dict[str, _TypeState] = {}
        self._lock = threading.Lock()

    def choose(self, wt: str, ttls: Sequence[float | None]) -> int:
        """The index of the candidate served to a call of type ``wt`` whose candidates' TTLs are
        ``ttls`` (in :data:`CANDIDATES` order; None: not offered for this call, never served)."""
        with self._lock:
            st = self._types.setdefault(wt, _TypeState(self._k))
            i = st.served if ttls[st.served] is not None else 0
            st.served_calls[i] += 1
            return i

    def record(self, wt: str, gap_s: float, ttls: Sequence[float | None]) -> None:
        """One idle gap ``gap_s`` after a call of type ``wt`` served with candidates' TTLs ``ttls``
        (as carried from :meth:`choose`'s call; a candidate not offered is scored as the fitted
        one, so its difference is zero on that gap)."""
        if not ttls or ttls[0] is None or not math.isfinite(gap_s):
            return
        held = np.array([held_ttl_s(t if t is not None else ttls[0]) for t in ttls], dtype=float)
        x = np.concatenate(((gap_s <= held).astype(float), np.minimum(held, gap_s)))
        with self._lock:
            st = self._types.setdefault(wt, _TypeState(self._k))
            k = self._decay
            st.sw, st.sw2 = k * st.sw + 1.0, k * k * st.sw2 + 1.0
            st.s1 = k * st.s1 + x
            st.s2 = k * st.s2 + np.outer(x, x)
            st.outcomes += 1
            best = self._decide(st)
            if best is not None and best != st.served:
                st.served, st.switches = best, st.switches + 1

    def _decide(self, st: _TypeState) -> int | None:
        """The candidate ``st``'s evidence serves (the largest coverage z among those ahead of the
        fitted one, else the fitted one); None before :attr:`min_outcomes` effective outcomes."""
        if st.sw2 <= 0 or st.sw * st.sw / st.sw2 < self.min_outcomes:
            return None
        best, best_z = 0, 0.0
        for c in range(1, self._k):
            z = self._ahead(st, c)
            if z is not None and (best == 0 or z > best_z):
                best, best_z = c, z
        return best

    def warm_start(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        """Seed each type's evidence with the fit's forward replay of the training side
        (:func:`warm_start_state`; the profile's ``idle_gap.workflow_types.<type>.selection_warm_start``),
        so the served candidate starts from what the training side's future said instead of from
        the fitted one at zero evidence. A type without one starts empty; so does every type
        with ``warm=False``."""
        if not self.warm:
            return
        with self._lock:
            for wt, d in states.items():
                if not d or len(d.get("s1") or ()) != 2 * self._k:
                    continue
                st = _TypeState(self._k)
                sw, sw2 = float(d["sw"]), float(d["sw2"])
                f = min(1.0, self.warm_gaps * sw2 / (sw * sw)) if sw > 0 else 1.0   # n_eff -> f · n_eff
                st.sw, st.sw2 = f * sw, f * sw2
                st.s1 = f * np.asarray(d["s1"], dtype=float)
                st.s2 = f * np.asarray(d["s2"], dtype=float).reshape(2 * self._k, 2 * self._k)
                st.served = self._decide(st) or 0
                self._types[wt] = st

    def _ahead(self, st: _TypeState, c: int) -> float | None:
        """Candidate ``c``'s coverage z over the fitted one when ``c`` is ahead of it beyond
        :attr:`margin` standard errors: it covers more at a KV-seconds-per-covered-gap not above
        the fitted one's beyond the margin, or holds less at a coverage not below beyond it and
        reaches nominal on the gaps seen (the fit's forward rule); None when not ahead."""
        v = self._versus(st, c, 0)
        if v is None:
            return None
        dc, sc, dk, sk = v
        m = self.margin
        more = dc > m * sc and dk <= m * sk
        cheaper = dk < -m * sk and dc >= -m * sc and st.s1[c] / st.sw >= self.nominal
        if not (more or cheaper):
            return None
        return dc / sc if sc > 0 else (math.inf if dc > 0 else 0.0)

    def _versus(self, st: _TypeState, a: int, b: int) -> tuple[float, float, float, float] | None:
        """Candidate ``a`` minus ``b``: (coverage, its se, KV-seconds per covered gap, its se);
        None while either covers nothing."""
        k = self._k
        mean = st.s1 / st.sw
        cov = st.s2 / st.sw - np.outer(mean, mean)
        n_eff = st.sw * st.sw / st.sw2
        ca, cb = mean[a], mean[b]
        if ca <= 0 or cb <= 0 or n_eff <= 1:
            return None
        ra, rb = mean[k + a] / ca, mean[k + b] / cb
        g = np.zeros(2 * k)                 # coverage difference: covered_a − covered_b
        g[a], g[b] = 1.0, -1.0
        sc = math.sqrt(max(float(g @ cov @ g), 0.0) / n_eff)
        h = np.zeros(2 * k)                 # gradient of ratio_a − ratio_b in the means
        h[k + a], h[a] = 1.0 / ca, -ra / ca
        h[k + b], h[b] = h[k + b] - 1.0 / cb, h[b] + rb / cb
        sk = math.sqrt(max(float(h @ cov @ h), 0.0) / n_eff)
        return ca - cb, sc, ra - rb, sk

    def served(self, wt: str) -> str:
        """The name of the candidate type ``wt`` is served now."""
        st = self._types.get(wt)
        return CANDIDATES[0 if st is None else st.served]

    def reset(self) -> None:
        """Forget every type's evidence (a new profile: its candidates are new)."""
        with self._lock:
            self._types.clear()

    def status(self) -> dict[str, dict[str, Any]]:
        """Per type: ``served`` (the candidate now), ``switches``, ``outcomes`` (idle gaps scored),
        ``served_calls`` per candidate, and per candidate its EW ``coverage`` and
        ``kv_s_per_covered_gap`` on the gaps seen."""
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for wt, st in sorted(self._types.items()):
                mean = st.s1 / st.sw if st.sw > 0 else np.full(len(st.s1), np.nan)
                k = self._k
                out[wt] = {"served": CANDIDATES[st.served], "switches": st.switches, "outcomes": st.outcomes,
                           "served_calls": {c: int(n) for c, n in zip(CANDIDATES, st.served_calls)},
                           "candidates": {c: {"coverage": float(mean[i]) if st.sw > 0 else None,
                                              "kv_s_per_covered_gap": (float(mean[k + i] / mean[i])
                                                                       if mean[i] > 0 else None)}
                                          for i, c in enumerate(CANDIDATES)}}
        return out
