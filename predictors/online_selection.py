"""Online selection of the served remaining-work order: follow drift between refits.

The fit chooses, per workflow type, the remaining-output-tokens figure it serves among
:data:`~predictors.served.RW_CANDIDATES`: the position median, ``mrl`` (calls done → mean residual
life) and the cross-validated table candidate (``fitted``), by the C-index scored forward in time
on the training side (:meth:`predictors.remaining_tokens.RemainingTokens._forward`). A release
after the training data can change the very structure a richer candidate keys on (an agent's
loop, the work per call), and then another candidate ranks sessions better until the next refit.
This unit keeps scoring the same candidates on the outcomes the server really sees and switches
the served one when another is ahead beyond noise.

**Outcomes.** When a session ends (the client says so, or it goes idle for good), the true
remaining work ``R_i = Σ_{j≥i} o_j`` of each of its calls is known, and so is every candidate's
figure ``x_i`` computed at the call's arrival. Each ended session gives, per candidate, its
concordance over the session's pairs

    C(x) = mean over pairs (i, k) of c(x; i, k)

where ``k`` runs over the calls of *other* recently ended sessions of the type (a ring buffer
of ``buffer`` calls) that were their session's latest call when call ``i`` arrived (``t_k ≤ t_i``
< the arrival after ``k`` or its session's end), or the other way round: the pairs a scheduler
faces, as ``profiler eval`` pairs them (:mod:`scoring.remaining_eval`; a session that overlapped
none is paired as if every session had started together). ``c(x; i, k) = 1`` if ``x`` orders the
pair as ``R`` does, ½ on a tie of ``x``, 0 otherwise (ties of ``R`` skipped). Each pair of
candidates ``(j, k)`` gets the session's paired score ``d_jk = C(x_k) − C(x_j)`` (concordance, not
an error: what the switch must protect is the order).

**Decision.** Per type and pair, an exponentially weighted mean and variance of ``d`` over ended
sessions (weight ``2^(−age / half_life)``, age in sessions) give a paired z-score

    z = m̄ / sqrt(v / n_eff),      n_eff = (Σ w)² / Σ w²   (:func:`predictors.ew_stats.ew_z`).

A type starts on the candidate the fit serves; once ``n_eff ≥ min_sessions`` it moves to the
candidate with the largest ``z`` over the served one if that ``z > margin``. On a stationary log the
served candidate is the one the training data found at least as good, so every ``m̄ ≤ 0`` up to
noise and the margin (a one-sided test at about ``Φ(−margin)`` per look and candidate) keeps it
from switching; candidates that order every pair alike have ``d ≡ 0`` and never switch.

Cost: O(candidates × min(calls, MAX_SCORED) × buffer) per ended session, O(1) per served figure,
``buffer`` calls of memory per type. Parameters chosen on training data only (docs/workflow-paths.md).
"""
from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from predictors.ew_stats import ew_z
from predictors.served import RW_CANDIDATES

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
    """Evidence of one workflow type: EW sums of every pair's ``d`` and the buffer of recent calls."""

    served: int                 # index of the served candidate
    start: int                  # the fit's candidate
    sw: float = 0.0             # Σ w
    sw2: float = 0.0            # Σ w²
    swd: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))    # Σ w d_jk (antisymmetric, K × K)
    swd2: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))   # Σ w d_jk² (symmetric)
    sessions: int = 0
    switches: int = 0
    served_sessions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))  # per candidate
    aligned: int = 0            # ended sessions scored on aligned starts (no concurrent pair)
    buffer: deque = field(default_factory=lambda: deque(maxlen=BUFFER))   # (x_0 … x_{K−1}, R, t, u, start) of ended calls


def concordance_scores(x: np.ndarray, r: np.ndarray, x2: np.ndarray, r2: np.ndarray,
                       concurrent: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """``(Σ c(x_k) per candidate k, pairs)`` over every pair (row of the first arrays, row of the
    second) with different truths ``r`` (and ``concurrent[row, row2]`` when given); ``x`` and ``x2``
    hold one column per candidate (module doc)."""
    dr = np.sign(r[:, None] - r2[None, :])
    ok = dr != 0
    if concurrent is not None:
        ok &= concurrent
    n = int(ok.sum())
    if not n:
        return np.zeros(x.shape[1]), 0
    dx = np.sign(x[:, None, :] - x2[None, :, :])[ok]               # pairs × candidates
    conc = np.where(dx == 0, 0.5, (dx == dr[ok][:, None]).astype(float))
    return conc.sum(axis=0), n


def _overlap(t: np.ndarray, u: np.ndarray, t2: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """``[row, row2]``: either call arrived while the other was its session's latest (call ``i``
    is from ``t_i`` to ``u_i``)."""
    t, u, t2, u2 = t[:, None], u[:, None], t2[None, :], u2[None, :]
    return ((t2 <= t) & (t < u2)) | ((t <= t2) & (t2 < u))


def concordance_diff(f: np.ndarray, b: np.ndarray, r: np.ndarray,
                     f2: np.ndarray, b2: np.ndarray, r2: np.ndarray,
                     concurrent: np.ndarray | None = None) -> tuple[float, int]:
    """``(Σ [c(b) − c(f)], pairs)``: :func:`concordance_scores` of two candidates as one gain."""
    sums, n = concordance_scores(np.stack([f, b], axis=1), r, np.stack([f2, b2], axis=1), r2, concurrent)
    return float(sums[1] - sums[0]), n


class RemainingSelector:
    """Per workflow type, which remaining-work candidate is served (module doc). Thread-safe;
    O(1) to read.

    Parameters
    ----------
    half_life : sessions after which an outcome's weight halves.
    margin : paired z a candidate must reach over the served one to be served instead.
    min_sessions : effective sessions of evidence before any switch.
    buffer : calls of recently ended sessions kept per type (the pairs' other sides).
    candidates : the candidates' names, in the column order of :meth:`record`'s figures.
    """

    def __init__(self, half_life: float = HALF_LIFE, margin: float = MARGIN,
                 min_sessions: float = MIN_SESSIONS, buffer: int = BUFFER,
                 candidates: Sequence[str] = RW_CANDIDATES) -> None:
        if half_life <= 0 or margin < 0 or buffer < 1 or len(candidates) < 2:
            raise ValueError(f"half_life and buffer must be positive, margin >= 0 and at least two candidates, "
                             f"got {half_life}, {buffer}, {margin}, {list(candidates)}")
        self.half_life = float(half_life)
        self.margin = float(margin)
        self.min_sessions = float(min_sessions)
        self.buffer = int(buffer)
        self.candidates = tuple(candidates)
        self._decay = 2.0 ** (-1.0 / self.half_life)
        self._types: dict[str, _TypeState] = {}
        self._lock = threading.Lock()

    def served(self, wt: str) -> str | None:
        """The candidate type ``wt`` is served now (None: no outcome yet, the fit's choice)."""
        st = self._types.get(wt)
        return None if st is None else self.candidates[st.served]

    def z(self, wt: str) -> dict[str, float | None] | None:
        """Per other candidate, its paired z over the served one (positive: it ranks better);
        None before any outcome."""
        st = self._types.get(wt)
        return None if st is None else self._zs(st)

    def _zs(self, st: _TypeState) -> dict[str, float | None]:
        s = st.served
        return {c: ew_z(st.sw, st.sw2, float(st.swd[s, k]), float(st.swd2[s, k]))
                for k, c in enumerate(self.candidates) if k != s}

    def record(self, wt: str, figures: Any, truth: Sequence[float], arrivals: Sequence[float],
               ended_at: float, start: str = "fitted") -> dict[str, float] | None:
        """One ended session of type ``wt``: per call (in arrival order) every candidate's figure
        at its arrival (``figures``: calls × candidates), its true remaining work and its arrival
        time; ``ended_at`` the session's end; ``start`` the candidate the fit serves (the type's
        first served one). Returns the session's C per candidate (None: no concurrent pair)."""
        x = np.asarray(figures, dtype=float).reshape(-1, len(self.candidates))
        r, t = (np.asarray(v, dtype=float) for v in (truth, arrivals))
        # each call is its session's latest from its arrival to the next one's (or the end)
        u = np.append(t[1:], max(float(ended_at), float(t[-1]) if len(t) else 0.0))
        t0 = float(np.nanmin(t)) if len(t) and not np.isnan(t).all() else 0.0    # the session's start
        ok = ~(np.isnan(x).any(axis=1) | np.isnan(r) | np.isnan(t))
        x, r, t, u = x[ok], r[ok], t[ok], u[ok]
        if not len(r):
            return None
        if len(r) > MAX_SCORED:
            keep = np.linspace(0, len(r) - 1, MAX_SCORED).round().astype(int)
            x, r, t, u = x[keep], r[keep], t[keep], u[keep]
        k = len(self.candidates)
        with self._lock:
            st = self._types.get(wt)
            if st is None:
                first = self.candidates.index(start) if start in self.candidates else k - 1
                st = self._types[wt] = _TypeState(served=first, start=first, swd=np.zeros((k, k)),
                                                  swd2=np.zeros((k, k)), served_sessions=np.zeros(k, dtype=int),
                                                  buffer=deque(maxlen=self.buffer))
            out = None
            if st.buffer:
                o = np.array(st.buffer, dtype=float)
                sums, n = concordance_scores(x, r, o[:, :k], o[:, k],
                                             _overlap(t, u, o[:, k + 1], o[:, k + 2]))
                if not n:    # it overlapped none of them: pair on aligned starts, as eval does
                    sums, n = concordance_scores(x, r, o[:, :k], o[:, k],
                                                 _overlap(t - t0, u - t0, o[:, k + 1] - o[:, k + 3],
                                                          o[:, k + 2] - o[:, k + 3]))
                    st.aligned += bool(n)
                if n:
                    c = sums / n
                    self._update(st, c)
                    out = dict(zip(self.candidates, c.tolist()))
            st.buffer.extend(np.column_stack([x, r, t, u, np.full(len(r), t0)]).tolist())
            return out

    def _update(self, st: _TypeState, c: np.ndarray) -> None:
        d = c[None, :] - c[:, None]                 # d[j, k] = C(k) − C(j)
        w = self._decay
        st.sw, st.sw2 = w * st.sw + 1.0, w * w * st.sw2 + 1.0
        st.swd, st.swd2 = w * st.swd + d, w * st.swd2 + d * d
        st.sessions += 1
        st.served_sessions[st.served] += 1
        if st.sw * st.sw / st.sw2 < self.min_sessions:
            return
        zs = {k: z for k, z in ((self.candidates.index(c), z) for c, z in self._zs(st).items()) if z is not None}
        if not zs:
            return
        best = max(zs, key=lambda k: (zs[k], -k))    # ties: the simpler (earlier) candidate
        if zs[best] > self.margin:
            st.served, st.switches = best, st.switches + 1

    def reset(self) -> None:
        """Forget every type's evidence (a new profile: its fitted candidates are new)."""
        with self._lock:
            self._types.clear()

    def status(self) -> dict[str, dict[str, Any]]:
        """Per type: ``{"served", "start", "z": {candidate: z over the served one}, "sessions",
        "aligned" (of them scored on aligned starts), "switches", "served_sessions": {candidate: ended sessions scored while it served}}``
        (a ``z`` is None before any spread: every scored session gave the same ``d``)."""
        with self._lock:
            out = {}
            for wt, st in self._types.items():
                out[wt] = {"served": self.candidates[st.served], "start": self.candidates[st.start],
                           "z": {c: z if z is not None and math.isfinite(z) else None
                                 for c, z in self._zs(st).items()},
                           "sessions": st.sessions, "aligned": st.aligned, "switches": st.switches,
                           "served_sessions": dict(zip(self.candidates, st.served_sessions.tolist()))}
            return out
