"""Online calibration of served output-length bands: adaptive conformal inference per agent.

A band fit on last month's workflows holds its coverage only while the workload stays put; every
refit comes too late for the calls in between. Adaptive conformal inference (Gibbs & Candès,
2021) keeps the long-run miss rate at its target whatever the drift by moving the level at which
the band is served after each outcome, here on ``log α`` (a multiplicative step):

    ln α_{t+1} = clip(ln α_t + κ · (α − err_t), ln α_min, ln α_max)  ⇒  misses ≤ α·T + ln(α/α_min)/κ.

**From a level to a band**: the fitted band ``[lo, hi]`` is stretched by the agent's own tail
ratio ``r_t = U(α_t / 2) / U(α / 2)`` from its ``output_len_upper`` table (:func:`table_upper`),
``r = 1`` at the nominal level, capped at ``MAX_STRETCH``. Keys are (workflow type, agent), with
``UNSEEN_AGENT`` and a ``POOLED_AGENT`` key per type that a cold key is served at.
A miss inside a run of misses steps further (``κ·(1 − α)·(1 + m)``), so a few-dozen-call key
under drift still widens; only misses step further, so the bound holds.

**Keep-alive TTL**: a second, one-sided instance of the loop at the idle-gap model's nominal,
one outcome per idle gap, stretching along :func:`keep_alive_table` (never flatter than
:data:`MIN_TAIL_SLOPE`), served through a dead band (:meth:`OnlineCalibrator.gated_stretch`) for a
type whose training-side future showed its fitted TTL above nominal, elsewhere never below the
fitted TTL (:meth:`OnlineCalibrator.served_stretch`). **Never dominated by the
global band** (issue 37): each key serves its
own band or the global band, whichever the interval score puts ahead by :data:`ARM_MARGIN`
paired standard errors (:meth:`OnlineCalibrator.record`).

A new profile keeps the levels unless the caller :meth:`reset` s them. O(1) per outcome and band.
The derivation, the bounds and the figures behind each rule (issue 26, issue 37):
docs/evaluation.md ("Online calibration: the design").
"""
from __future__ import annotations

import math
import threading
from typing import Any, NamedTuple, Sequence

from predictors.ew_stats import ew_binomial_z, ew_z
from predictors.served import Band

#: κ: the step of ln α per unit of (α − err). A miss multiplies the level by e^{−κ(1−α)} ≈ 0.82;
#: it takes ≈ 1/α hits to undo it (so the level is steady when misses are α of outcomes). Chosen on
#: time-ordered splits (bench/bench_online_calibration.py, docs/output-length.md): 0.1–0.3 held
#: coverage ≥ 0.98 on the drifting ``messy`` log at 0.75–0.96× the per-agent empirical width;
#: 0.5 and 1.0 over-widened after bursts of misses (1.25×), and every rate left the stationary
#: logs within 0.001 of the static coverage.
DEFAULT_RATE = 0.2
#: α_min = α / MIN_ALPHA_RATIO; α_max = min(MAX_ALPHA, α · MAX_ALPHA_RATIO).
MIN_ALPHA_RATIO = 100.0
MAX_ALPHA_RATIO = 4.0
MAX_ALPHA = 0.4
#: The most a band end moves from the fitted one: ``r ∈ [1 / MAX_STRETCH, MAX_STRETCH]``.
MAX_STRETCH = 4.0
#: H: the memory (in outcomes of one key) of the recent-miss count that escalates the step after a
#: miss: the k-th miss within ~H outcomes steps ln α by κ·k·(1 − α) instead of κ·(1 − α) (0: off).
#: Chosen on the train side of the time splits (docs/evaluation.md), never on the reported test side.
ESCALATION_HORIZON = 50.0
#: The keep-alive TTL's instance (:func:`keep_alive_calibrator`): its step and escalation memory.
#: H = 10 keeps the expected recent misses at the nominal level where the band's H = 50 keeps
#: them at α = 0.01 (α · H = 0.5): at α = 0.05 an H of 50 escalates nearly every miss and the level
#: settles above nominal. κ is the band's. H was chosen on the *train* side of the time splits
#: (each set's training workflows split by time again, 70/30: fit on the first part, replay the
#: rest; docs/keep-alive.md), never on the reported test side: at κ = 0.2, H = 10 held 0.953–0.969
#: on SWE-agent, mini-SWE-agent and three messy seeds (static 0.837–0.953); H = 50 0.960–0.976 at
#: up to 1.3× the mean TTL; plain ACI (H = 0) 0.926–0.950.
KEEP_ALIVE_RATE = DEFAULT_RATE
KEEP_ALIVE_ESCALATION_HORIZON = 10.0
#: The keep-alive level's dead band (:meth:`OnlineCalibrator.gated_stretch`): the level's stretch
#: is served only while the *fitted* TTL's own miss rate, exponentially weighted with this
#: half-life (in outcomes of one key), lies above α by more than ``KEEP_ALIVE_DEAD_BAND_Z`` binomial
#: standard errors; otherwise the fitted TTL is served as it is (z = 0: off, the level always
#: served). z = 1 is the project's "beyond one standard error"; the half-life was chosen on the
#: *train* side of the time splits, never on the reported test side (docs/keep-alive.md).
KEEP_ALIVE_DEAD_BAND_Z = 1.0
KEEP_ALIVE_DEAD_BAND_HALF_LIFE = 30.0
#: The dead band serves a workflow type only where the fit's forward replay of its training side
#: (the profile's ``selection_warm_start``) shows the fitted TTL covering more than nominal beyond
#: this many binomial standard errors (:func:`predictors.keep_alive_compare.fitted_holds_forward`):
#: elsewhere the future the fit could check needed the level, and it is served as before. Chosen
#: on the train side of the time splits among 1, 1.5, 2, 3: at 1 drift-team's second type qualifies
#: and loses 0.7 pt (dominated by the band off); 1.5 is the least that makes no set worse.
KEEP_ALIVE_DEAD_BAND_FORWARD_Z = 1.5
#: The least stretch the keep-alive level is *served* at (:meth:`OnlineCalibrator.served_stretch`;
#: the level itself still moves over ``[1 / MAX_STRETCH, MAX_STRETCH]`` and learns on its own TTL):
#: 1 serves nothing shorter than the fitted TTL. A level below 1 trades coverage for no KV time: a
#: shorter TTL saves only on the gaps it misses (a covered gap holds its own length), and a miss
#: holds the whole TTL for nothing, so on a stream the fitted TTL over-covers the level's walk down
#: to nominal is dominated by a constant TTL (SWE-agent's random split: 0.963 / 0.66 KV-s per covered
#: gap against the plain p95's 0.979 / 0.65). Chosen on the train side of both splits
#: (docs/keep-alive.md); 1 / MAX_STRETCH (0.25) is the level unfloored, as before.
KEEP_ALIVE_MIN_SERVED_STRETCH = 1.0
#: The flattest tail a keep-alive table is given (:func:`keep_alive_table`): ``U ∝ α^(−s)`` with
#: ``s = ln MAX_STRETCH / ln MIN_ALPHA_RATIO`` (≈ 0.30), so the level's full range (α … α_min)
#: can reach the full stretch; steeper fitted tails are kept as they are.
MIN_TAIL_SLOPE = math.log(MAX_STRETCH) / math.log(MIN_ALPHA_RATIO)
#: The keep-alive TTL's nominal before a profile says its own (the idle-gap model's default quantile).
KEEP_ALIVE_NOMINAL = 0.95
#: The second arm (the global band, docs/evaluation.md): half-life of the evidence in outcomes of one key,
#: the paired z it must pass to switch (either way: one standard error, the fit's TOLERANCE_Z),
#: and the effective outcomes before any switch. Measured in docs/output-length.md.
ARM_HALF_LIFE = 50.0
ARM_MARGIN = 1.0
ARM_MIN_OUTCOMES = 5.0
#: The arms' names as :meth:`OnlineCalibrator.status` reports them.
OWN_ARM, GLOBAL_ARM = "own", "global"
#: The key of a workflow type's pooled level (every outcome of the type); a (type, agent) key
#: that has had no outcome yet starts from it instead of from the nominal level.
POOLED_AGENT = "\x00pooled"


class BandArms(NamedTuple):
    """The two bands a call could be served (:meth:`OnlineCalibrator.arms`): its own at the key's
    adapted level and the global band as fitted (None without one, or when its own is global)."""

    own: Band
    alternative: Band | None


def certified_pairs(table: Sequence[tuple[float, int]]) -> list[tuple[float, float]]:
    """The ``(α, U)`` pairs of a bound table that are order statistics, largest α first: the
    entries at the table's top value are dropped when it repeats at the small-α end (that is the
    entry's ceiling, served below ``certified_alpha``, not a quantile of the data)."""
    pairs = sorted(((float(a), float(u)) for a, u in table if a > 0 and u > 0), reverse=True)
    if len(pairs) > 2 and pairs[-1][1] == pairs[-2][1]:
        top = pairs[-1][1]
        pairs = [p for p in pairs if p[1] != top] or pairs[:1]
    return pairs


def keep_alive_slope(p50_s: float | None, ttl_s: float | None, alpha: float,
                     min_slope: float = MIN_TAIL_SLOPE) -> float | None:
    """The tail slope ``s`` of an idle-gap entry's two-point table (its median gap at 0.5 and its
    ``1 − α`` quantile): ``U(a) ∝ a^(−s)``, ``s = ln(ttl / p50) / ln(0.5 / α)``, at least
    ``min_slope``. A recency-weighted entry can have its quantile at its median (messy's router:
    2.005 s and 2.005 s), and a table without a tail could not lengthen the TTL however many gaps
    it missed; the same floor serves an entry without a median. None (no stretch) for an
    uncertified (infinite) or non-positive quantile."""
    if ttl_s is None or not math.isfinite(ttl_s) or ttl_s <= 0 or not 0.0 < alpha < 0.5:
        return None
    if p50_s is None or not 0.0 < p50_s < ttl_s:
        return float(min_slope)
    return max(float(min_slope), math.log(ttl_s / p50_s) / math.log(0.5 / alpha))


def keep_alive_table(p50_s: float | None, ttl_s: float | None, alpha: float,
                     min_slope: float = MIN_TAIL_SLOPE) -> tuple:
    """The two-point bound table ``((0.5, p50'), (α, ttl))`` of an idle-gap entry, its median
    lowered where needed to give the tail :func:`keep_alive_slope` (empty where that is None):
    :meth:`OnlineCalibrator.stretch` on it equals :meth:`OnlineCalibrator.power_stretch` with
    that slope, which serving uses (O(1), no table walk)."""
    s = keep_alive_slope(p50_s, ttl_s, alpha, min_slope)
    if s is None:
        return ()
    return ((0.5, float(ttl_s) * (alpha / 0.5) ** s), (float(alpha), float(ttl_s)))


def table_upper(table: Sequence[tuple[float, int]], alpha: float) -> float | None:
    """U(α) from ``((α_i, U_i), …)``: ln U linear in ln α between the certified risks
    (:func:`certified_pairs`), flat above the largest, and below the smallest extended along the
    slope of its last two (a power-law tail: an agent with n calls certifies nothing below
    α = 1/(n + 1), yet its band must be able to widen). None for a table without a positive bound."""
    pairs = certified_pairs(table)
    if not pairs:
        return None
    if alpha >= pairs[0][0]:
        return pairs[0][1]
    for (a_hi, u_hi), (a_lo, u_lo) in zip(pairs, pairs[1:]):
        if a_lo <= alpha <= a_hi:
            w = (math.log(a_hi) - math.log(alpha)) / (math.log(a_hi) - math.log(a_lo))
            return math.exp((1 - w) * math.log(u_hi) + w * math.log(u_lo))
    if len(pairs) < 2:
        return pairs[-1][1]
    (a1, u1), (a2, u2) = pairs[-2], pairs[-1]
    slope = (math.log(u2) - math.log(u1)) / (math.log(a2) - math.log(a1))
    return math.exp(min(math.log(u2) + slope * (math.log(alpha) - math.log(a2)), 700.0))


def interval_score(lo: float, hi: float, y: float, alpha: float) -> float:
    """The interval score of the central ``1 − alpha`` band ``[lo, hi]`` at outcome ``y``:
    ``(hi − lo) + (2/α)·(lo − y)⁺ + (2/α)·(y − hi)⁺`` (lower is better; docs/evaluation.md)."""
    return (hi - lo) + (2.0 / alpha) * (max(lo - y, 0.0) + max(y - hi, 0.0))


class _Arms:
    """One key's second arm: the global band's outcomes and misses, the EW sums of
    ``d = S_own − S_global``, which arm is served and how often it switched."""

    __slots__ = ("outcomes", "misses", "sw", "sw2", "swd", "swd2", "sww", "alt", "switches", "served_alt",
                 "served")

    def __init__(self) -> None:
        self.outcomes = self.misses = 0
        self.sw = self.sw2 = self.swd = self.swd2 = self.sww = 0.0   # sww: EW Σ (own − global width)
        self.alt = False
        self.switches = 0
        self.served_alt = self.served = 0    # bands served from the global arm / in all

    def z(self) -> float | None:
        return ew_z(self.sw, self.sw2, self.swd, self.swd2)


def keep_alive_calibrator(nominal: float = KEEP_ALIVE_NOMINAL, **kwargs: Any) -> "OnlineCalibrator":
    """The keep-alive TTL's calibrator: one-sided, at the keep-alive defaults (docs/evaluation.md)."""
    kwargs.setdefault("rate", KEEP_ALIVE_RATE)
    kwargs.setdefault("escalation_horizon", KEEP_ALIVE_ESCALATION_HORIZON)
    kwargs.setdefault("dead_band_z", KEEP_ALIVE_DEAD_BAND_Z)
    kwargs.setdefault("dead_band_half_life", KEEP_ALIVE_DEAD_BAND_HALF_LIFE)
    kwargs.setdefault("dead_band_forward_z", KEEP_ALIVE_DEAD_BAND_FORWARD_Z)
    kwargs.setdefault("min_served_stretch", KEEP_ALIVE_MIN_SERVED_STRETCH)
    return OnlineCalibrator(nominal, tails=1, **kwargs)


class OnlineCalibrator:
    """Per-key adaptive level of the served output-length band (docs/evaluation.md).

    Parameters
    ----------
    nominal : target coverage ``1 − α`` (the profile's; :meth:`set_nominal` follows a new one).
    rate : κ, the step of ln α per outcome.
    min_alpha_ratio, max_alpha_ratio, max_alpha : the bounds of the level
        (``α / min_alpha_ratio`` … ``min(max_alpha, α · max_alpha_ratio)``).
    max_stretch : bound of the band's stretch factor ``r`` (and of ``1 / r``).
    escalation_horizon : H, the memory of the recent-miss count (0: plain ACI steps).
    tails : 2 for a two-sided band (each end at risk ``α_t / 2``: the output length), 1 for a
        one-sided bound (risk ``α_t``: the keep-alive TTL).
    arm_half_life, arm_margin, arm_min_outcomes : the switch between a key's own band and the
        global one (:meth:`serve`, :meth:`record`; docs/evaluation.md).
    dead_band_z, dead_band_half_life : the dead band of :meth:`gated_stretch` (0: off, the
        stretch is always served; the keep-alive instance's, docs/keep-alive.md).
    dead_band_forward_z : the training side's evidence a type needs to be served through the
        dead band (:func:`predictors.keep_alive_compare.fitted_holds_forward`; the Predictor reads it).
    min_served_stretch : the least stretch :meth:`served_stretch` serves (0: the level as it is).
    """

    def __init__(self, nominal: float = 0.99, *, rate: float = DEFAULT_RATE,
                 min_alpha_ratio: float = MIN_ALPHA_RATIO, max_alpha_ratio: float = MAX_ALPHA_RATIO,
                 max_alpha: float = MAX_ALPHA, max_stretch: float = MAX_STRETCH,
                 escalation_horizon: float = ESCALATION_HORIZON, tails: int = 2,
                 arm_half_life: float = ARM_HALF_LIFE, arm_margin: float = ARM_MARGIN,
                 arm_min_outcomes: float = ARM_MIN_OUTCOMES, dead_band_z: float = 0.0,
                 dead_band_half_life: float = KEEP_ALIVE_DEAD_BAND_HALF_LIFE,
                 dead_band_forward_z: float = KEEP_ALIVE_DEAD_BAND_FORWARD_Z,
                 min_served_stretch: float = 0.0) -> None:
        if not 0.0 < nominal < 1.0:
            raise ValueError(f"nominal coverage must be in (0, 1), got {nominal}")
        if rate <= 0 or min_alpha_ratio < 1 or max_alpha_ratio < 1 or max_stretch < 1:
            raise ValueError("rate must be positive; alpha ratios and max_stretch at least 1")
        self.rate = float(rate)
        self.min_alpha_ratio = float(min_alpha_ratio)
        self.max_alpha_ratio = float(max_alpha_ratio)
        self.max_alpha = float(max_alpha)
        self.max_stretch = float(max_stretch)
        if escalation_horizon < 0:
            raise ValueError(f"escalation_horizon must be >= 0, got {escalation_horizon}")
        self.escalation_horizon = float(escalation_horizon)
        if arm_half_life <= 0 or arm_margin < 0:
            raise ValueError(f"arm_half_life must be positive and arm_margin >= 0, got "
                             f"{arm_half_life}, {arm_margin}")
        self.arm_margin = float(arm_margin)
        self.arm_min_outcomes = float(arm_min_outcomes)
        self._arm_decay = 2.0 ** (-1.0 / float(arm_half_life))
        #: key -> its second arm (keys served a band with a global alternative only)
        self._arms: dict[tuple[str, str], _Arms] = {}
        if tails not in (1, 2):
            raise ValueError(f"tails must be 1 or 2, got {tails}")
        self.tails = int(tails)
        self.nominal = float(nominal)
        #: key -> [ln α_t, outcomes, misses, recent misses (decayed with horizon H)]
        self._state: dict[tuple[str, str], list] = {}
        if dead_band_z < 0 or dead_band_half_life <= 0:
            raise ValueError(f"dead_band_z must be >= 0 and dead_band_half_life positive, got "
                             f"{dead_band_z}, {dead_band_half_life}")
        self.dead_band_z = float(dead_band_z)
        self.dead_band_forward_z = float(dead_band_forward_z)
        if min_served_stretch < 0:
            raise ValueError(f"min_served_stretch must be >= 0, got {min_served_stretch}")
        self.min_served_stretch = float(min_served_stretch)
        self._band_decay = 2.0 ** (-1.0 / float(dead_band_half_life))
        #: key -> [Σw, Σw², Σw·miss] of the fitted (unstretched) TTL's outcomes (dead band only)
        self._fitted: dict[tuple[str, str], list] = {}
        self._lock = threading.Lock()

    @property
    def alpha(self) -> float:
        """The target miss rate ``1 − nominal``."""
        return 1.0 - self.nominal

    def bounds(self) -> tuple[float, float]:
        """``(α_min, α_max)``."""
        a = self.alpha
        return a / self.min_alpha_ratio, max(a, min(self.max_alpha, a * self.max_alpha_ratio))

    def set_nominal(self, nominal: float | None) -> None:
        """A new profile's nominal coverage; levels already adapted keep their ratio to α."""
        if nominal is None or not 0.0 < nominal < 1.0 or nominal == self.nominal:
            return
        with self._lock:
            shift = math.log(1.0 - nominal) - math.log(self.alpha)
            for st in self._state.values():
                st[0] += shift
            self.nominal = float(nominal)

    def reset(self) -> None:
        """Forget every adapted level (all keys back to the nominal one)."""
        with self._lock:
            self._state.clear()
            self._arms.clear()
            self._fitted.clear()

    def level(self, key: tuple[str, str]) -> float:
        """α_t of ``key``; before its first outcome, its type's pooled level (the nominal α before
        the type's first outcome)."""
        st = self._state.get(key) or self._state.get((key[0], POOLED_AGENT))
        return math.exp(st[0]) if st is not None else self.alpha

    def _step(self, st: list, hit: bool) -> None:
        """One outcome on a state ``[ln α, outcomes, misses, recent]`` (see :meth:`update`)."""
        a = self.alpha
        lo, hi = self.bounds()
        recent = st[3]
        if self.escalation_horizon > 0:
            st[3] = recent * (1.0 - 1.0 / max(1.0, self.escalation_horizon)) + (not hit)
        step = self.rate * a if hit else -self.rate * (1.0 - a) * (1.0 + (recent if self.escalation_horizon > 0 else 0.0))
        st[0] = min(math.log(hi), max(math.log(lo), st[0] + step))
        st[1] += 1
        st[2] += not hit

    def stretch(self, key: tuple[str, str], table: Sequence[tuple[float, int]],
                level: float | None = None) -> float:
        """``r_t = U(α_t/2) / U(α/2)`` from the agent's upper-bound table (``U(α_t) / U(α)`` with
        ``tails=1``), within the bounds; 1 when the level is nominal or the table is empty.
        ``level``: this α_t instead of the key's (the global arm's, :meth:`serve`)."""
        a_t = self.level(key) if level is None else level
        if a_t == self.alpha or not table:
            return 1.0
        u_t, u_0 = table_upper(table, a_t / self.tails), table_upper(table, self.alpha / self.tails)
        if u_t is None or u_0 is None:
            return 1.0
        return min(self.max_stretch, max(1.0 / self.max_stretch, u_t / u_0))

    def power_stretch(self, key: tuple[str, str], slope: float | None) -> float:
        """:meth:`stretch` along a power-law table ``U(a) ∝ a^(−slope)`` below 0.5, flat above (an
        idle-gap entry's, :func:`keep_alive_table`): ``r_t = (min(α_t', 0.5) / α')^(−slope)``
        with ``α' = α / tails``, within the bounds; 1 at the nominal level or without a slope."""
        a_t = self.level(key)
        if slope is None or a_t == self.alpha:
            return 1.0
        a0 = self.alpha / self.tails
        r = math.exp(-slope * (math.log(min(a_t / self.tails, 0.5)) - math.log(a0)))
        return min(self.max_stretch, max(1.0 / self.max_stretch, r))

    def fitted_departure(self, key: tuple[str, str]) -> float:
        """The binomial z of the fitted TTL's exponentially weighted miss rate against α at
        ``key`` (its type's pooled one before the key's first outcome): ``(m − α) / sqrt(α(1 − α)
        / n_eff)``, positive when it misses more than nominal; 0 before any outcome."""
        st = self._fitted.get(key) or self._fitted.get((key[0], POOLED_AGENT))
        z = None if st is None else ew_binomial_z(st[0], st[1], st[2], self.alpha)
        return 0.0 if z is None else z

    def gated_stretch(self, key: tuple[str, str], stretch: float) -> float:
        """The stretch served of the level's ``stretch`` through the dead band: the level's
        (never below 1) while the fitted TTL misses more than α beyond ``dead_band_z`` binomial
        standard errors (:meth:`fitted_departure`), else 1 (the fitted TTL). A stream the fitted
        TTL covers at nominal keeps it (a moving TTL covers less than a constant one of the same
        mean); a drifting one gets the level, already adapted in the background (it learns on its
        own stretched TTL's hits whichever is served). ``stretch`` itself when the band is off."""
        if self.dead_band_z <= 0:
            return stretch
        return max(stretch, 1.0) if self.fitted_departure(key) > self.dead_band_z else 1.0

    def served_stretch(self, key: tuple[str, str], stretch: float, banded: bool) -> float:
        """The stretch served of the level's ``stretch`` at ``key``: through the dead band
        (:meth:`gated_stretch`) for a ``banded`` type, else the level's, never below
        ``min_served_stretch`` (a level under the fitted TTL trades coverage for no KV time)."""
        if banded and self.dead_band_z > 0:
            return self.gated_stretch(key, stretch)
        return max(stretch, self.min_served_stretch)

    def record_fitted(self, key: tuple[str, str], hit: bool) -> None:
        """One outcome of the *fitted* (unstretched) TTL at ``key`` (and its type's pooled key),
        the evidence of the dead band (:meth:`gated_stretch`); nothing when the band is off."""
        if self.dead_band_z <= 0:
            return
        k = self._band_decay
        pooled = (key[0], POOLED_AGENT)
        with self._lock:
            pst = self._fitted.get(pooled)
            if pst is None:
                pst = self._fitted[pooled] = [0.0, 0.0, 0.0]
            st = self._fitted.get(key)
            if st is None:       # a key's evidence starts from its type's (as its level does)
                st = self._fitted[key] = list(pst)
            for x in (st, pst):
                x[0], x[1], x[2] = k * x[0] + 1.0, k * k * x[1] + 1.0, k * x[2] + (not hit)

    def adjust(self, key: tuple[str, str], band: Band,
               table: Sequence[tuple[float, int]], level: float | None = None) -> Band:
        """The band ``(lo, hi, level)`` served at ``key``'s adapted level (or at ``level``):
        ``[lo / r, hi · r]`` rounded outward (the fitted band itself when ``r = 1``)."""
        r = self.stretch(key, table, level)
        if r == 1.0:
            return band
        new_lo = int(math.floor(band.lo / r))
        new_hi = max(new_lo, int(math.ceil(band.hi * r)))
        return Band(new_lo, new_hi, band.level)

    def arms(self, key: tuple[str, str], band: Band, table: Sequence[tuple[float, int]],
             alternative: Band | None = None) -> BandArms:
        """``(own arm, global arm)``: ``band`` at the key's level (:meth:`adjust`) and the global
        band ``alternative`` as fitted (None without one, or when the key's own band is the
        global one)."""
        own = self.adjust(key, band, table)
        if alternative is None or band.level == "global":
            return BandArms(own, None)
        return BandArms(own, alternative)

    def serve(self, key: tuple[str, str], arms: BandArms) -> Band:
        """The band served at ``key`` of its :meth:`arms`: the global one while the key's evidence
        says it is ahead (docs/evaluation.md), else its own."""
        own, alt = arms
        if alt is None:
            return own
        with self._lock:
            st = self._arms.get(key)
            if st is None:
                st = self._arms[key] = _Arms()
            st.served += 1
            st.served_alt += st.alt
            return alt if st.alt else own

    def record(self, key: tuple[str, str], out: float, arms: BandArms) -> None:
        """One outcome ``out`` of a call served at ``key`` with these :meth:`arms` (as computed at
        its arrival): the key's level steps on its own arm's hit (:meth:`update`), and the interval
        scores' difference feeds the switch between the arms (docs/evaluation.md)."""
        own, alt = arms
        self.update(key, own.lo <= out <= own.hi)
        if alt is None:
            return
        a = self.alpha
        d = interval_score(own.lo, own.hi, out, a) - interval_score(alt.lo, alt.hi, out, a)
        with self._lock:
            st = self._arms.get(key)
            if st is None:
                st = self._arms[key] = _Arms()
            st.outcomes += 1
            st.misses += not alt.lo <= out <= alt.hi
            k = self._arm_decay
            st.sw, st.sw2 = k * st.sw + 1.0, k * k * st.sw2 + 1.0
            st.swd, st.swd2 = k * st.swd + d, k * st.swd2 + d * d
            st.sww = k * st.sww + (own.hi - own.lo) - (alt.hi - alt.lo)
            z = st.z()
            n_eff = st.sw * st.sw / st.sw2
            # toward the narrower arm only once its misses could have shown (1/α outcomes)
            to_narrower = (st.sww > 0) != st.alt
            if z is None or n_eff < max(self.arm_min_outcomes, 1.0 / a if to_narrower else 0.0):
                return
            if not st.alt and z > self.arm_margin:
                st.alt, st.switches = True, st.switches + 1
            elif st.alt and z < -self.arm_margin:
                st.alt, st.switches = False, st.switches + 1

    def update(self, key: tuple[str, str], hit: bool) -> float:
        """One observed outcome of a band served at ``key``; returns the new level α_{t+1}.

        A hit raises ln α by ``κ·α``; a miss lowers it by ``κ·(1 − α)·(1 + m)``, ``m`` the key's
        recent misses (each decayed by ``1 − 1/H`` per outcome): a lone miss steps as plain ACI, a
        run of misses (drift) widens the band fast. The steps only grow on misses, so the bound of
        the bound in docs/evaluation.md holds (each miss steps at least κ(1 − α)). The type's pooled
        level takes the same step; a key's first outcome starts from it (a cold agent of a drifting
        type starts wide)."""
        pooled = (key[0], POOLED_AGENT)
        with self._lock:
            pst = self._state.get(pooled)
            if pst is None:
                pst = self._state[pooled] = [math.log(self.alpha), 0, 0, 0.0]
            st = self._state.get(key)
            if st is None:
                st = self._state[key] = [pst[0], 0, 0, 0.0]
            self._step(st, hit)
            if key != pooled:
                self._step(pst, hit)
            return math.exp(st[0])

    def status(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per workflow type, per agent: ``level`` (α_t), ``served_coverage`` (1 − α_t),
        ``outcomes`` and ``coverage`` (share of them inside the own arm's band), ``arm`` (the arm
        served now: ``own`` or ``global``), ``switches`` between arms, ``served`` bands with a
        global arm beside them and ``served_global`` of them from it, and ``global_coverage``
        (share of its outcomes inside the global arm's band; None without one)."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        with self._lock:
            for (wt, agent), st in sorted(self._state.items()):
                if agent == POOLED_AGENT:
                    continue
                arms = self._arms.get((wt, agent))
                out.setdefault(wt, {})[agent] = {
                    "level": math.exp(st[0]), "served_coverage": 1.0 - math.exp(st[0]),
                    "outcomes": st[1], "coverage": 1.0 - st[2] / st[1] if st[1] else None,
                    "arm": GLOBAL_ARM if arms is not None and arms.alt else OWN_ARM,
                    "switches": arms.switches if arms is not None else 0,
                    "served": arms.served if arms is not None else 0,
                    "served_global": arms.served_alt if arms is not None else 0,
                    "global_coverage": (1.0 - arms.misses / arms.outcomes
                                        if arms is not None and arms.outcomes else None)}
        return out
