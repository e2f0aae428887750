"""Two keep-alive TTLs on the same idle gaps: which covers more, which holds less, beyond noise.

A TTL is judged on two numbers (docs/keep-alive.md): its **coverage** (share of idle gaps that
end within the TTL held) and its **cost**, the KV-seconds held per covered gap
(``Σ min(TTL, gap) / #covered``: a covered gap holds its KV for the gap, a missed one for the
whole TTL). :func:`compare_held` gives A minus B for both, each with its delete-one-workflow
jackknife standard error (the gaps of one workflow are not independent), and
:func:`dominated` says whether B is ahead of A beyond one standard error. One definition for the
fit's forward check (:meth:`predictors.idle_gap.IdleGapModel._forward_check`), ``profiler eval``'s
``keep_alive.vs_baselines`` and ``bench/bench_real.py``'s "dominated" flags.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from predictors.ew_stats import ew_binomial_z
from predictors.served import HELD_TTL_MAX_S, HELD_TTL_MIN_S


def _leave_one_out_ratio(num: np.ndarray, den: np.ndarray, codes: np.ndarray, k: int) -> np.ndarray:
    """``Σ num / Σ den`` without each group in turn (``codes`` 0…k−1; NaN where no ``den`` is left)."""
    n_g = np.bincount(codes, weights=num, minlength=k)
    d_g = np.bincount(codes, weights=den, minlength=k)
    left = den.sum() - d_g
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(left > 0, (num.sum() - n_g) / left, np.nan)


def _jackknife_se(theta: np.ndarray) -> float | None:
    """``sqrt((G − 1)/G · Σ_g (θ₋g − θ̄)²)`` over the finite leave-one-out values (None: < 2)."""
    theta = theta[~np.isnan(theta)]
    if len(theta) < 2:
        return None
    return float(np.sqrt((len(theta) - 1) / len(theta) * np.sum((theta - theta.mean()) ** 2)))


def dominated(dc: float, dc_se: float | None, dk: float, dk_se: float | None) -> bool:
    """Whether B dominates A, from A minus B: coverage ``dc`` and KV-seconds per covered gap
    ``dk`` with their standard errors (None: 0) — B is ahead on one beyond one se and not behind on
    the other beyond one: it covers more by over one se at a cost not above A's beyond one, or
    holds less by over one se at a coverage not below A's beyond one."""
    sc, sk = dc_se or 0.0, dk_se or 0.0
    return bool((dc < -sc and dk >= -sk) or (dk > sk and dc <= sc))


def compare_held(gap: np.ndarray, held_a: np.ndarray, held_b: np.ndarray, groups: np.ndarray,
                 ends: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """A minus B on the same idle gaps, TTLs as held (already bounded as the policy holds them):
    ``coverage_diff``, ``kv_s_diff`` (KV-seconds per covered gap; None when either covers none),
    each with ``…_se`` (delete-one-workflow jackknife; ``groups`` = each gap's workflow), and
    ``dominated`` (:func:`dominated`: B ahead of A beyond one standard error). ``ends`` =
    ``(held_a, held_b, groups)`` at the sessions' last calls adds the TTL each holds there for
    nothing to the KV-seconds (``profiler eval``'s ``kv_s_per_covered_gap_with_ends``)."""
    gap, held_a, held_b = (np.asarray(x, dtype=float) for x in (gap, held_a, held_b))
    out: dict[str, Any] = {"coverage_diff": None, "coverage_diff_se": None, "kv_s_diff": None,
                           "kv_s_diff_se": None, "dominated": False}
    if not len(gap):
        return out
    _, codes = np.unique(np.asarray(groups).astype(str), return_inverse=True)
    k = int(codes.max()) + 1
    ca, cb = (gap <= held_a).astype(float), (gap <= held_b).astype(float)
    one = np.ones(len(gap))
    dc = float(ca.mean() - cb.mean())
    dc_se = _jackknife_se(_leave_one_out_ratio(ca, one, codes, k) - _leave_one_out_ratio(cb, one, codes, k))
    out.update(coverage_diff=dc, coverage_diff_se=dc_se)
    if ca.any() and cb.any():
        ka, kb = np.minimum(held_a, gap), np.minimum(held_b, gap)
        if ends is not None and len(ends[0]):
            end_codes = np.searchsorted(np.unique(np.asarray(groups).astype(str)), np.asarray(ends[2]).astype(str))
            known = end_codes < k   # an end whose workflow has no gap here: counted, not resampled
            ka = np.concatenate((ka, np.asarray(ends[0], dtype=float)[known]))
            kb = np.concatenate((kb, np.asarray(ends[1], dtype=float)[known]))
            ca, cb = np.concatenate((ca, np.zeros(known.sum()))), np.concatenate((cb, np.zeros(known.sum())))
            codes = np.concatenate((codes, end_codes[known]))
        dk = float(ka.sum() / ca.sum() - kb.sum() / cb.sum())
        dk_se = _jackknife_se(_leave_one_out_ratio(ka, ca, codes, k) - _leave_one_out_ratio(kb, cb, codes, k))
        out.update(kv_s_diff=dk, kv_s_diff_se=dk_se, dominated=dominated(dc, dc_se, dk, dk_se))
    return out


#: Half-life (idle gaps of the type) of the warm start's weights: the online selector's own
#: (``predictors.keep_alive_selection.HALF_LIFE`` is this one).
WARM_START_HALF_LIFE = 1000.0


def warm_start_state(gaps: np.ndarray, ttls: np.ndarray, half_life: float = WARM_START_HALF_LIFE) -> dict[str, Any] | None:
    """One type's keep-alive selector evidence after replaying, oldest first, the idle gaps
    ``gaps`` (n,) served the candidates' TTLs ``ttls`` (n, k, in the selector's ``CANDIDATES``
    order; NaN: not offered, scored as the fitted one, as the selector's ``record`` does, and held
    as the keep/drop policy holds them, 0.5–120 s): the exponentially
    weighted sums the selector keeps (``sw``, ``sw2``, ``s1``, ``s2``), in closed form — the
    ``i``-th of ``n`` outcomes weighs ``2^(−(n−1−i)/half_life)`` — plus ``gaps``. None without a
    gap. The fit calls it on its rolling-origin replay of the training side
    (:meth:`predictors.idle_gap.IdleGapModel.fit`); stored in the profile, it seeds the server's
    selector (:meth:`predictors.keep_alive_selection.KeepAliveSelector.warm_start`)."""
    gaps = np.asarray(gaps, dtype=float)
    ttls = np.asarray(ttls, dtype=float)
    keep = np.isfinite(gaps) & np.isfinite(ttls[:, 0])
    gaps, ttls = gaps[keep], ttls[keep]
    if not len(gaps):
        return None
    ttls = np.where(np.isnan(ttls), ttls[:, :1], ttls)
    held = np.clip(ttls, HELD_TTL_MIN_S, HELD_TTL_MAX_S)
    x = np.concatenate(((gaps[:, None] <= held).astype(float), np.minimum(held, gaps[:, None])), axis=1)
    w = 2.0 ** (-(len(gaps) - 1 - np.arange(len(gaps))) / float(half_life))
    return {"sw": float(w.sum()), "sw2": float((w * w).sum()), "s1": (w @ x).tolist(),
            "s2": ((x * w[:, None]).T @ x).tolist(), "gaps": int(len(gaps))}


def fitted_holds_forward(state: Any, nominal: float, z: float = 1.0) -> bool:
    """Whether the training side's forward replay (:func:`warm_start_state`, the profile's
    ``selection_warm_start`` of a type) shows the fitted TTL (the first candidate) covering more
    than ``nominal`` beyond ``z`` binomial standard errors (``sqrt(q(1 − q) / n_eff)``): where it
    does, the future the fit could check did not need the online level, and the server serves the
    level only through its dead band (:meth:`predictors.online_calibration.OnlineCalibrator.gated_stretch`).
    False without a replay."""
    if not state or not state.get("s1"):
        return False
    zf = ew_binomial_z(float(state.get("sw") or 0.0), float(state.get("sw2") or 0.0), float(state["s1"][0]), nominal)
    return zf is not None and zf > z
