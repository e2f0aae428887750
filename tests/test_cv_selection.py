"""The shared pieces of every choice made on held-out workflows: the folds by group
(store.folds.group_folds) and the later-slice half-life (predictors.idle_gap.select_half_life)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from predictors.idle_gap import pick_least_decay, pick_narrowest, select_half_life, weighted_coverage_se
from predictors import remaining_tokens
from predictors.remaining_tokens import RemainingTokens
from store.folds import group_folds, paired_se
from synth.sequence_select import BASE_REMAINING, _choose_next, _choose_remaining


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


def test_paired_se_over_equal_groups_is_the_se_of_the_group_means():
    rng = np.random.default_rng(11)
    d = rng.normal(0.0, 1.0, 60)
    members = np.repeat(np.arange(12), 5)                  # 12 groups of 5 workflows
    clusters = (members[None, :] == np.arange(12)[:, None]).astype(float)
    mean, se = paired_se(d, np.ones(60), clusters)
    means = d.reshape(12, 5).mean(axis=1)
    assert mean == pytest.approx(d.mean())
    assert se == pytest.approx(means.std(ddof=1) / math.sqrt(12))
    # no groups: every workflow its own unit (rows standing for several identical workflows)
    assert paired_se(d, np.ones(60))[1] == pytest.approx(d.std(ddof=1) / math.sqrt(60))
    assert paired_se([1.0, 3.0], [2, 1]) == pytest.approx((5 / 3, math.sqrt((2 * (2 / 3) ** 2 + (4 / 3) ** 2) / 2 / 3)))


def test_many_trials_per_task_do_not_make_a_richer_remaining_model_win():
    """Ten tasks, twenty identical trials each: the richer candidate is 0.5 calls better on
    average but ±1 call from task to task. Counted by workflow (200 units) that is 7 standard
    errors; counted by task (the honest unit under ``fit --group-by``) it is 1.5, below the bar,
    so the position median stays."""
    richer = (1, "none", 1, "p50")
    cands = [BASE_REMAINING, richer]
    gain = -0.5 + np.array([1.0, -1.0] * 5)               # per-task difference richer − median
    errors = np.stack([np.full(10, 3.0), 3.0 + gain], axis=1)   # one row per task, per workflow
    weights = np.full(10, 20.0)
    by_workflow = _choose_remaining(cands, errors, weights, calls=200.0, repeats=1)
    assert (by_workflow["order"], by_workflow["position"]) == richer[:2]
    by_task = _choose_remaining(cands, errors, weights, calls=200.0, repeats=1,
                                clusters=np.diag(weights))
    assert (by_task["order"], by_task["point"]) == (0, "p50")


def test_grouped_remaining_tokens_selection_counts_tasks_not_trials(monkeypatch):
    """The same through :class:`RemainingTokens`: ten tasks of twenty near-identical trials. The
    exact-index level is a little better in CV (0.0065 in log error) but within one standard
    error counted over the ten tasks (0.016), so the position median stays; the same folds with
    the error counted over the 200 trials would have served the richer level."""
    rng = np.random.default_rng(2)
    rows = []
    for t in range(10):
        agents = rng.choice(["a", "b"], size=12)
        outs = rng.lognormal(5, 1.0, size=12).astype(int)
        for k in range(20):
            for a, o in zip(agents, outs):
                rows.append({"workflow_type_id": "t", "workflow_id": f"task{t}/trial{k}", "group_id": f"task{t}",
                             "agent_id": a, "output_tokens": int(o * rng.lognormal(0, 0.05))})
    calls = pd.DataFrame(rows)
    grouped = RemainingTokens(cv_folds=5, min_n=3).fit(calls)
    sel = grouped.selection_["t"]
    assert sel["se_over"] == "10 groups"
    assert grouped.params_["t"]["level"] == "position"
    assert sel["best"]["level"] != "position" and sel["simplest_error"] > sel["best_error"]
    # the very same folds and errors, the standard error over trials: the richer level wins
    monkeypatch.setattr(remaining_tokens, "paired_se", lambda d, w, clusters=None: paired_se(d, w))
    by_trial = RemainingTokens(cv_folds=5, min_n=3).fit(calls)
    assert by_trial.params_["t"]["level"] == sel["best"]["level"]


def test_many_trials_per_task_do_not_make_a_longer_next_agent_order_win():
    """The next-agent one-SE rule, same shape: order 8 is 0.3 nats better per workflow on average,
    ±1 from task to task (ten tasks × twenty trials). Over trials order 1 is 4 standard errors
    behind and order 8 is served; over tasks it is within one, and the shorter order is served."""
    grid = [("agent", 1, 1.0, 1.0), ("agent", 8, 1.0, 1.0)]
    w = np.full(10, 20.0)
    per_wf = np.stack([np.full(10, 2.0), 2.0 - (0.3 + np.array([1.0, -1.0] * 5))], axis=1)
    wf_loss = per_wf * w[:, None]
    loss = wf_loss.sum(axis=0)[:, None]
    hits = np.zeros((2, 1))
    by_trial = _choose_next(loss, hits, 200.0, 200.0, False, grid, wf_loss, w)
    assert by_trial["max_order"] == 8
    groups = [{f"task{j}": 20} for j in range(10)]
    by_task = _choose_next(loss, hits, 200.0, 200.0, False, grid, wf_loss, w, groups)
    assert by_task["max_order"] == 1


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


def test_group_folds_of_a_text_series_are_those_of_its_values():
    """A text Series is factorized as it is (Arrow strings, code-point order) instead of as
    Python objects: the folds must be the same, non-ASCII labels and missing ones included."""
    labels = ["wf-10", "wf-9", "é-1", "Z", "a\x1fb", "ab", None, "wf-10", "ß", "zz", "É", "wf-9"] * 7
    series = pd.Series(labels, dtype="str")
    assert isinstance(series.dtype, pd.StringDtype)
    for seed in (0, 1, 7):
        assert np.array_equal(group_folds(series, 3, seed), group_folds(np.asarray(series), 3, seed))
        assert np.array_equal(group_folds(series, 5, seed),
                              group_folds(np.array(labels, dtype=object), 5, seed))
