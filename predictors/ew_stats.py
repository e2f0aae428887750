"""Exponentially weighted paired statistics that the online selectors share.

An online selector scores two candidates on each outcome and switches when one is ahead
beyond noise. It keeps exponentially weighted sums of the paired difference d: Σw, Σw², Σw·d and
Σw·d². From these, z = mean / sqrt(var / n_eff), with n_eff = (Σw)² / Σw² the effective number of
outcomes. The band's global arm (:mod:`predictors.online_calibration`) and the remaining-work
choice (:mod:`predictors.online_selection`) both read this one function. A weighted *rate* of
0/1 outcomes (a TTL's hits or misses) is judged against a nominal ``p`` by the binomial
:func:`ew_binomial_z` instead: z = (Σw·x / Σw − p) / sqrt(p(1 − p) / n_eff).
"""
from __future__ import annotations

import math


def ew_z(sw: float, sw2: float, swd: float, swd2: float) -> float | None:
    """z of the weighted mean difference (None: no outcome yet, or a spread of zero with mean 0;
    ±inf: a non-zero mean with no spread)."""
    if sw <= 0:
        return None
    mean = swd / sw
    var = max(swd2 / sw - mean * mean, 0.0)
    n_eff = sw * sw / sw2
    if var <= 0 or n_eff <= 1:
        return None if mean == 0 else math.copysign(math.inf, mean)
    return mean / math.sqrt(var / n_eff)


def ew_binomial_z(sw: float, sw2: float, swx: float, p: float) -> float | None:
    """Binomial z of the weighted rate ``swx / sw`` of 0/1 outcomes against ``p`` over
    ``n_eff = sw² / sw2`` outcomes (None: no outcome yet)."""
    if sw <= 0 or sw2 <= 0:
        return None
    n_eff = sw * sw / sw2
    return (swx / sw - p) / math.sqrt(p * (1.0 - p) / n_eff)
