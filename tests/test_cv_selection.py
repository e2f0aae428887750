"""The shared pieces of every choice made on held-out workflows: the folds by group
(store.folds.group_folds) and the later-slice half-life (predictors.idle_gap.select_half_life)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from predictors.idle_gap import pick_least_decay, pick_narrowest, select_half_life, weighted_coverage_se
from store.folds import group_folds


def test_folds_keep_groups_whole_and_balanced():
    rng = np.random.default_rng(7)
    groups = rng.choice([f"wf{i:03d}" for i in range(53)], size=2000)
    fold = group_folds(groups, 5, seed=3)
    per_group = pd.Series(fold).groupby(groups).nunique()
    assert (per_group == 1).all()                                   # a workflow sits in one fold
    sizes = np.bincount(pd.Series(fold).groupby(groups).first().to_numpy(), minlength=5)
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == 53     # groups dealt round-robin


def test_folds_depend_on_the_seed_not_on_row_order():
    groups = np.array([f"w{i % 17}" for i in range(170)], dtype=object)
    fold = group_folds(groups, 4, seed=1)
    order = np.random.default_rng(0).permutation(len(groups))
    assert (group_folds(groups[order], 4, seed=1) == fold[order]).all()
    assert (group_folds(groups, 4, seed=1) == fold).all()
    assert not (group_folds(groups, 4, seed=2) == fold).all()


def test_folds_continue_a_generator_stream():
    """A caller that subsampled with its generator first gets the folds of the continued stream."""
    groups = np.array(list("abcdefghij"))
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    a.choice(10, 3, replace=False)
    b.choice(10, 3, replace=False)
    assert (group_folds(groups, 3, a) == (b.permutation(10) % 3)).all()
    c = np.random.default_rng(5)
    c.choice(10, 3, replace=False)
    assert not (group_folds(groups, 3, np.random.default_rng(5)) == group_folds(groups, 3, c)).all()


def test_pick_narrowest_rules():
    scores = {None: (0.96, 10.0), 0.5: (0.97, 8.0), 0.2: (0.90, 5.0)}
    assert pick_narrowest(scores, 0.95) == 0.5                      # narrowest that reaches nominal
    short = {None: (0.90, 9.0), 0.5: (0.93, 8.0), 0.2: (0.93, 6.0)}
    assert pick_narrowest(short, 0.95) == 0.2                       # best covered, narrower of equals
    assert pick_narrowest(short, 0.95, narrower_on_ties=False) == 0.5   # ... or the first listed
    assert pick_narrowest({None: (math.nan, math.nan), 0.5: (math.nan, math.nan)}, 0.95) is None


def test_select_half_life_scores_the_later_slice():
    """Latencies drift up over 40 workflows: weighing recent workflows more covers the later ones."""
    ranks = np.repeat(np.arange(40), 10)
    rows = pd.DataFrame({"rank": ranks, "x": ranks * 1.0 + np.tile(np.arange(10) / 10, 40)})
    seen = {}

    def score(train: pd.DataFrame, later: pd.DataFrame) -> tuple[float, float]:
        assert train["rank"].max() < 28 <= later["rank"].min()         # 70 % oldest vs the rest
        p95 = float(np.average(train["x"], weights=train["weight"])) + 2 * float(train["x"].std())
        seen[len(seen)] = train["weight"].to_numpy()
        return float(np.mean(later["x"] <= p95)), p95

    h, scores = select_half_life(rows, 40, (None, 0.5, 0.05), 20, 0.95, score)
    assert set(scores) == {None, 0.5, 0.05} and (seen[0] == 1).all() and seen[2][0] < seen[2][-1]
    assert h == max(scores, key=lambda k: scores[k][0])                # none reaches 0.95 here
    assert select_half_life(rows, 19, (None, 0.5), 20, 0.95, score) == (None, {})   # too few workflows
    assert select_half_life(rows, 40, (None,), 20, 0.95, score) == (None, {})       # nothing to choose


@pytest.mark.parametrize("k", [2, 5])
def test_one_fold_per_group_label_even_for_pairs(k):
    wt = np.array(["a", "a", "b", "b", "b"])
    wf = np.array(["1", "1", "1", "2", "2"])                            # workflow ids repeat across types
    keys = np.char.add(np.char.add(wt, "\x1f"), wf)
    fold = group_folds(keys, k, 0)
    assert fold[0] == fold[1] and fold[3] == fold[4] and len(np.unique(keys)) == 3


def test_pick_least_decay_keeps_no_decay_inside_the_candidates_band():
    """Coverage and cost: the cheapest candidate reaching nominal, unless no decay reaches it too
    and its TTL sits inside that candidate's quantile band (share below it ≤ q + se)."""
    # mini-SWE-like: the 5 % half-life is a second cheaper, but the plain TTL is within its noise
    near = {None: (0.972, 6.62, 0.004, 0.950), 0.5: (0.972, 6.62, 0.004, 0.951), 0.05: (0.969, 6.59, 0.007, 0.955)}
    assert pick_narrowest({k: v[:2] for k, v in near.items()}, 0.95) == 0.05
    assert pick_least_decay(near, 0.95) is None
    # gaps 10x shorter lately: the plain TTL is above nearly all of the candidate's weighted gaps
    shrunk = {**near, 0.05: (0.982, 1.32, 0.019, 0.998)}
    assert pick_least_decay(shrunk, 0.95) == 0.05
    # no decay under nominal on the later slice: the best covered decay stands, band or not
    grown = {None: (0.86, 13.5, 0.010, 0.950), 0.2: (0.92, 13.3, 0.010, 0.95), 0.05: (0.952, 13.3, 0.019, 0.95)}
    assert pick_least_decay(grown, 0.95) == 0.05
    # without a no-decay candidate it is pick_narrowest on (coverage, cost)
    assert pick_least_decay({0.2: (0.96, 5.0, 0.01, 0.9), 0.05: (0.955, 4.0, 0.01, 0.9)}, 0.95) == 0.05


def test_weighted_coverage_se_clusters_by_workflow_and_has_a_binomial_floor():
    rng = np.random.default_rng(0)
    covered = rng.random(2000) < 0.95
    w = np.ones(2000)
    flat = weighted_coverage_se(covered, w, np.arange(2000), 0.95)
    assert flat == pytest.approx(math.sqrt(0.95 * 0.05 / 2000), rel=0.15)
    # 100 workflows of 20 gaps that move together (a workflow is all covered or all missed)
    together = np.repeat(rng.random(100) < 0.95, 20)
    assert weighted_coverage_se(together, w, np.repeat(np.arange(100), 20), 0.95) > 3 * flat
    # every gap covered (a quantile at the maximum of few heavy gaps): not zero, n_eff's binomial error
    heavy = np.power(0.5, np.arange(40)[::-1] / 2.0)
    n_eff = heavy.sum() ** 2 / (heavy ** 2).sum()
    assert weighted_coverage_se(np.ones(40, bool), heavy, np.arange(40), 0.95) == pytest.approx(
        math.sqrt(0.95 * 0.05 / n_eff))
