"""Load that settles: bursty gamma arrivals, the measured window, seeds with their spread."""
from __future__ import annotations

import numpy as np
import pytest

from simulator.runner import gamma_gaps, measured_mask


@pytest.mark.parametrize("cv", [0.0, 1.0, 4.0])
def test_gamma_gaps_have_the_asked_mean_and_cv(cv):
    g = gamma_gaps(200_000, rate=2.0, cv=cv, seed=3)
    assert g.mean() == pytest.approx(0.5, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(cv, abs=0.1 * max(cv, 0.1))


def test_gamma_gaps_reject_a_negative_cv():
    with pytest.raises(ValueError, match="--arrival-cv"):
        gamma_gaps(10, 1.0, -1.0, 0)


def test_bursty_arrivals_come_in_clumps():
    # CV 4: half of the gaps are tiny, the mean is carried by a few very long ones
    g = gamma_gaps(100_000, rate=1.0, cv=4.0, seed=1)
    assert np.median(g) < 0.01 and g.max() > 50


def test_measured_window_leaves_out_warmup_and_tail_by_arrival_rank():
    arrival = np.arange(100, dtype=float)[::-1]           # arrival order is reversed index
    m = measured_mask(arrival, "poisson", None, 0.2, 0.2)
    assert m.sum() == 60
    ranks = 99 - np.flatnonzero(m)
    assert ranks.min() == 20 and ranks.max() == 79


def test_closed_population_window_skips_the_ramp_and_the_drain():
    arrival = np.arange(300, dtype=float)
    m = measured_mask(arrival, "closed", 80, 0.1, 0.1)
    assert np.flatnonzero(m).min() == 80 and np.flatnonzero(m).max() == 219
