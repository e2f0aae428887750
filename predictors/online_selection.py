"""Online selection of the served remaining-work figure: follow drift between refits.

The fit chooses, per workflow type, the remaining-output-tokens candidate that cross-validation
finds best (:mod:`predictors.remaining_tokens`, the one-standard-error rule); the *simplest*
candidate (the position median, ties broken by calls done → mean residual life) is its fallback.
A release after the training data can change the very structure a richer candidate keys on (an
agent's loop, the work per call), and then the fitted figure ranks sessions worse than the
simplest one until the next refit. This unit watches that from outcomes the server really sees.

**Outcomes.** When a session ends (the client says so, or it goes idle for good), the true
remaining work ``R_i = Σ_{j≥i} o_j`` of each of its calls is known, and so are the two figures the
server computed at each call's arrival: ``f_i`` (fitted) and ``b_i`` (fallback). Each ended session
gives one paired score

    d = mean over pairs (i, k) of  [c(b; i, k) − c(f; i, k)]

where ``k`` runs over the calls of *other* recently ended sessions of the type (a ring buffer
of ``buffer`` calls) that were their session's latest call when call ``i`` arrived (``t_k ≤ t_i``
< the arrival after ``k`` or its session's end), or the other way round: the pairs a scheduler
faces, sessions waiting at the same moment, as ``profiler eval`` pairs them
(:mod:`scoring.remaining_eval`). ``c(x; i, k) = 1`` if ``x`` orders the pair as ``R`` does, ½ on
a tie of ``x``, 0 otherwise (pairs with ``R_i = R_k`` skipped): the concordance index over the
session's pairs. ``d > 0``: the fallback ranked this session's calls better. (Concordance and not the log1p error: a figure off by a constant
factor ranks exactly as well, and the log error would switch away from it; what the switch must
protect is the order.)

**Decision.** Per type, an exponentially weighted mean and variance of ``d`` over ended sessions
(weight ``2^(−age / half_life)``, age in sessions) give a paired z-score

    z = m̄ / sqrt(v / n_eff),      n_eff = (Σ w)² / Σ w²,

and the type is served the fallback once ``z > margin`` (with ``n_eff ≥ min_sessions``), the fitted
figure again once ``z < −margin``. On a stationary log the fitted candidate is the one the
training data found at least as good, so ``m̄ ≤ 0`` up to noise and the margin (a one-sided
test at about ``Φ(−margin)`` per look) keeps it from switching; a type whose fitted candidate *is*
the simplest one has ``d ≡ 0`` and never switches.

O(min(calls, MAX_SCORED) × buffer) per ended session (about 4 ms at most, under the
Predictor's lock), O(1) per served figure; memory: ``buffer`` calls per workflow type. Parameters chosen on training data only (docs/workflow-paths.md).
"""
from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from predictors.ew_stats import ew_z

#: Half-life of the evidence, in ended sessions of the type.
HALF_LIFE = 20.0
#: z the paired evidence must pass to switch (either way).
MARGIN = 3.0
#: Effective sessions of evidence before any switch.
MIN_SESSIONS = 8.0
#: Calls of recently ended sessions a new session's calls are paired with (per type).
BUFFER = 512
#: Calls of one ended session scored (evenly spaced over a longer one: the cost stays bounded).
MAX_SCORED = 128


@dataclass
class _TypeState:
    """Evidence of one workflow type: EW sums of ``d`` and the buffer of recent calls."""

    sw: float = 0.0          # Σ w
    sw2: float = 0.0         # Σ w²
    swd: float = 0.0         # Σ w d
    swd2: float = 0.0        # Σ w d²
    sessions: int = 0
    fallback: bool = False
    switches: int = 0
    buffer: deque = field(default_factory=lambda: deque(maxlen=BUFFER))   # (f, b, R, t, u) of ended calls


def concordance_diff(f: np.ndarray, b: np.ndarray, r: np.ndarray,
                     f2: np.ndarray, b2: np.ndarray, r2: np.ndarray,
                     concurrent: np.ndarray | None = None) -> tuple[float, int]:
    """``(Σ [c(b) − c(f)], pairs)`` over every pair (row of the first arrays, row of the second)
    with different truths ``r`` (and ``concurrent[row, row2]`` when given): the concordance gain
    of ``b`` over ``f`` (module doc)."""
    dr = np.sign(r[:, None] - r2[None, :])
    ok = dr != 0
    if concurrent is not None:
        ok &= concurrent
    if not ok.any():
        return 0.0, 0

    def conc(x: np.ndarray, x2: np.ndarray) -> np.ndarray:
        dx = np.sign(x[:, None] - x2[None, :])
        return np.where(dx == 0, 0.5, (dx == dr).astype(float))
    return float((conc(b, b2) - conc(f, f2))[ok].sum()), int(ok.sum())


class RemainingSelector:
    """Per workflow type, whether the served remaining work is the fitted or the fallback figure
    (module doc). Thread-safe; O(1) to read.

    Parameters
    ----------
    half_life : sessions after which an outcome's weight halves.
    margin : paired z the evidence must pass to switch, either way.
    min_sessions : effective sessions of evidence before any switch.
    buffer : calls of recently ended sessions kept per type (the pairs' other sides).
    """

    def __init__(self, half_life: float = HALF_LIFE, margin: float = MARGIN,
                 min_sessions: float = MIN_SESSIONS, buffer: int = BUFFER) -> None:
        if half_life <= 0 or margin < 0 or buffer < 1:
            raise ValueError(f"half_life and buffer must be positive and margin >= 0, got "
                             f"{half_life}, {buffer}, {margin}")
        self.half_life = float(half_life)
        self.margin = float(margin)
        self.min_sessions = float(min_sessions)
        self.buffer = int(buffer)
        self._decay = 2.0 ** (-1.0 / self.half_life)
        self._types: dict[str, _TypeState] = {}
        self._lock = threading.Lock()

    def serves_fallback(self, wt: str) -> bool:
        """Whether type ``wt`` is served the fallback figure now."""
        st = self._types.get(wt)
        return st is not None and st.fallback

    def z(self, wt: str) -> float | None:
        """The paired z of type ``wt`` (positive: the fallback ranks better); None before any
        outcome or with no spread yet."""
        st = self._types.get(wt)
        return None if st is None else self._z(st)

    @staticmethod
    def _z(st: _TypeState) -> float | None:
        return ew_z(st.sw, st.sw2, st.swd, st.swd2)

    def record(self, wt: str, fitted: Sequence[float], fallback: Sequence[float],
               truth: Sequence[float], arrivals: Sequence[float], ended_at: float) -> float | None:
        """One ended session of type ``wt``: per call (in arrival order) the two figures served
        at its arrival, its true remaining work and its arrival time; ``ended_at`` the session's
        end. Returns its score ``d`` (None: no concurrent pair to score)."""
        f, b, r, t = (np.asarray(x, dtype=float) for x in (fitted, fallback, truth, arrivals))
        # each call is its session's latest from its arrival to the next one's (or the end)
        u = np.append(t[1:], max(float(ended_at), float(t[-1]) if len(t) else 0.0))
        ok = ~(np.isnan(f) | np.isnan(b) | np.isnan(r) | np.isnan(t))
        f, b, r, t, u = f[ok], b[ok], r[ok], t[ok], u[ok]
        if not len(f):
            return None
        if len(f) > MAX_SCORED:
            keep = np.linspace(0, len(f) - 1, MAX_SCORED).round().astype(int)
            f, b, r, t, u = f[keep], b[keep], r[keep], t[keep], u[keep]
        with self._lock:
            st = self._types.setdefault(wt, _TypeState(buffer=deque(maxlen=self.buffer)))
            d = None
            if st.buffer:
                o = np.array(st.buffer, dtype=float)
                ot, ou = o[None, :, 3], o[None, :, 4]
                # either call arrived while the other was its session's latest
                concurrent = ((ot <= t[:, None]) & (t[:, None] < ou)) | ((t[:, None] <= ot) & (ot < u[:, None]))
                gain, n = concordance_diff(f, b, r, o[:, 0], o[:, 1], o[:, 2], concurrent)
                if n:
                    d = gain / n
                    self._update(st, d)
            st.buffer.extend(zip(f.tolist(), b.tolist(), r.tolist(), t.tolist(), u.tolist()))
            return d

    def _update(self, st: _TypeState, d: float) -> None:
        k = self._decay
        st.sw, st.sw2 = k * st.sw + 1.0, k * k * st.sw2 + 1.0
        st.swd, st.swd2 = k * st.swd + d, k * st.swd2 + d * d
        st.sessions += 1
        z = self._z(st)
        if z is None or st.sw * st.sw / st.sw2 < self.min_sessions:
            return
        if not st.fallback and z > self.margin:
            st.fallback, st.switches = True, st.switches + 1
        elif st.fallback and z < -self.margin:
            st.fallback, st.switches = False, st.switches + 1

    def reset(self) -> None:
        """Forget every type's evidence (a new profile: its fitted candidates are new)."""
        with self._lock:
            self._types.clear()

    def status(self) -> dict[str, dict[str, Any]]:
        """Per type: ``{"served": "fitted" | "fallback", "z", "sessions", "switches"}`` (``z``
        None before any spread: every scored session gave the same ``d``)."""
        with self._lock:
            out = {}
            for wt, st in self._types.items():
                z = self._z(st)
                out[wt] = {"served": "fallback" if st.fallback else "fitted",
                           "z": z if z is not None and math.isfinite(z) else None,
                           "sessions": st.sessions, "switches": st.switches}
            return out
