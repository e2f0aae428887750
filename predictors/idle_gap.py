"""Keep-alive TTL from the idle gap: how long a session's KV cache sits unused after a call.

A session's KV is idle from a call's *finish* to the *next arrival* of the same session
(``gap_after_s`` in the store). The engine (SGLang semantics) keeps a finished call's KV for
``TTL`` seconds, so the TTL that outlasts a share ``q`` of idle gaps is the ``q``-quantile of the
gap distribution: TTL = smallest x₍ₖ₎ with Σ_{i≤k} wᵢ / (Σ wᵢ + 1) ≥ q (weighted split-conformal).

Estimator, per workflow type: levels with backoff ``(wt, agent, tool)`` → ``(wt, agent)`` →
``(wt)``; a finite-sample weighted quantile (an entry whose weights cannot certify ``q`` takes a
longer half-life, then its parent); an online per-session factor ``c`` (normalized conformal
quantile ``c · Q_q(gap / c)``) so slow sessions get more; recency weights ``2^(−age / h)`` with
``h`` chosen on a later slice (:func:`certifies`, :func:`pick_least_decay`); level and prior
weight chosen by K-fold cross-validation by workflow (a session factor only where the plain
quantile does not dominate it there). END calls have no gap (``end_share`` is
kept); gaps ending in a person's turn are left out of the fit.

Why each of these choices (issue 26 and the decay rule): docs/keep-alive.md ("Idle-gap estimator:
the design").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator

from predictors.keep_alive_compare import compare_held, warm_start_state
from predictors.served import (HELD_TTL_DEFAULT_S, HELD_TTL_MAX_S, HELD_TTL_MIN_S, LEVEL_KEYS, LEVELS, MAX_FACTOR, MIN_GAP_S,
                               IdleGapTable)
from store.folds import group_folds

#: Columns :meth:`IdleGapModel.fit` reads.
GAP_COLUMNS = ("workflow_type_id", "workflow_id", "agent_id", "tool", "call_index", "t_arrival", "gap_after_s")


def weighted_conformal_quantile(x: np.ndarray, w: np.ndarray, q: float, w_new: float = 1.0) -> float:
    """Smallest ``x₍ₖ₎`` with ``Σ_{i≤k} w₍ᵢ₎ / (Σ w + w_new) ≥ q``; ``inf`` when none qualifies.

    With unit weights this is the split-conformal order statistic ``x₍⌈(n+1)q⌉₎``."""
    x = np.asarray(x, dtype=float)
    if len(x) == 0:
        return math.inf
    order = np.argsort(x, kind="stable")
    cw = np.cumsum(np.asarray(w, dtype=float)[order])
    k = int(np.searchsorted(cw / (cw[-1] + w_new), q - 1e-12))
    return float(x[order][k]) if k < len(x) else math.inf


def weighted_median(x: np.ndarray, w: np.ndarray) -> float:
    """The weighted median of ``x`` (the smallest ``x₍ₖ₎`` holding half the weight)."""
    order = np.argsort(x, kind="stable")
    cw = np.cumsum(np.asarray(w, dtype=float)[order])
    return float(np.asarray(x, dtype=float)[order][int(np.searchsorted(cw, 0.5 * cw[-1]))])


def recency_weights(workflow_rank: np.ndarray, n_workflows: int, half_life: float | None) -> np.ndarray:
    """``2^(−age / (half_life · n_workflows))``, age = ``n_workflows − 1 − rank`` (1 for all when
    ``half_life`` is None)."""
    rank = np.asarray(workflow_rank, dtype=float)
    if half_life is None or n_workflows <= 1:
        return np.ones_like(rank)
    age = (n_workflows - 1) - rank
    return np.power(0.5, age / max(half_life * n_workflows, 1e-9))


def pick_narrowest(scores: Mapping[Any, tuple[float, float]], quantile: float,
                   narrower_on_ties: bool = True) -> Any:
    """The candidate to keep from ``{candidate: (held-out coverage, mean width)}``: the narrowest
    whose coverage reaches ``quantile``, else the best covered (the narrower of equally covered
    ones, or with ``narrower_on_ties=False`` the first listed); the first candidate when none
    could be scored (coverage NaN)."""
    ok = {k: v for k, v in scores.items() if not math.isnan(v[0])}
    if not ok:
        return next(iter(scores))
    good = [k for k, v in ok.items() if v[0] >= quantile]
    if good:
        return min(good, key=lambda k: ok[k][1])
    return max(ok, key=lambda k: (ok[k][0], -ok[k][1] if narrower_on_ties else 0.0))


def pick_least_decay(scores: Mapping[float | None, tuple[float, float, float, float]],
                     quantile: float) -> float | None:
    """The half-life to keep from ``{half-life: (coverage, cost, se, plain_share)}`` scored on a
    later slice: the cheapest that reaches the quantile — unless no decay also reaches it and
    the decay does not move the quantile beyond its own noise.

    ``coverage`` and ``cost`` (KV-seconds held per covered gap, counting the TTL held after a
    session's last call) are the candidate's on the later slice; ``se`` is the standard error of
    the coverage its weighted training gaps pin its own quantile to
    (:func:`weighted_coverage_se`), and ``plain_share`` the share of those weighted gaps that the
    no-decay TTL covers. First :func:`pick_narrowest` on (coverage, cost): the cheapest candidate
    reaching ``quantile``, else the best covered. Then, one-SE style, no decay (``None``) is kept
    instead of that candidate when no decay reaches ``quantile`` on the later slice too and its
    TTL lies inside the candidate's own confidence band — ``plain_share ≤ q + se``: under the
    candidate's weights the plain TTL covers no more than its quantile could by chance. Recency
    weights shrink the sample, so a decayed quantile within that band has shown no drift; serving
    it fits the newest workflows' chance shape, which a sample of the whole log then misses
    (mini-SWE-agent in 5-fold CV: 0.944 at nominal 0.95 before this rule, 0.9505 after). A real
    shape change puts the plain TTL far outside the band (gaps 10× shorter: the plain TTL covers
    all the candidate's weighted gaps, ``se`` ≈ 0.02) and the decay is kept. When no decay does
    not reach ``quantile`` the later slice's choice stands: under-coverage is drift to act on."""
    best = pick_narrowest({k: v[:2] for k, v in scores.items()}, quantile)
    plain = scores.get(None)
    if best is None or plain is None or math.isnan(plain[0]) or plain[0] < quantile:
        return best
    _, _, se, plain_share = scores[best]
    return None if plain_share <= quantile + se + 1e-12 else best


def weighted_coverage_se(covered: np.ndarray, weights: np.ndarray, workflow: np.ndarray, quantile: float) -> float:
    """Standard error of the weighted share ``c = Σ wᵢ·coveredᵢ / Σ wᵢ`` of gaps a TTL covers,
    clustered by workflow (the linearised variance of a ratio, ``Σ_j (Σ_{i∈j} wᵢ (coveredᵢ −
    c))² / (Σ w)²``), and never less than the binomial error at ``quantile`` of the weights'
    effective sample, ``sqrt(q (1 − q) / n_eff)`` with ``n_eff = (Σw)² / Σw²`` (a quantile that
    is the maximum of a few heavy gaps covers all of them: no spread, but no certainty either).
    At the weighted q-quantile it says how far that quantile's true coverage can sit from q by
    chance — more when recency weights shrink the sample or a workflow's gaps move together."""
    w = np.asarray(weights, dtype=float)
    x = np.asarray(covered, dtype=float)
    total = w.sum()
    if total <= 0 or len(w) == 0:
        return math.nan
    c = float(np.dot(w, x) / total)
    _, codes = np.unique(np.asarray(workflow), return_inverse=True)
    per = np.bincount(codes, weights=w * (x - c))
    binomial = math.sqrt(quantile * (1 - quantile) * float(np.dot(w, w))) / float(total)
    return max(float(math.sqrt(np.dot(per, per)) / total), binomial)


def certifies(weights: np.ndarray, quantile: float, w_new: float = 1.0) -> bool:
    """Whether a sample of these weights can certify the weighted conformal ``quantile`` at all:
    :func:`weighted_conformal_quantile` is finite only when ``Σw / (Σw + w_new) ≥ q``, i.e.
    ``Σw ≥ q / (1 − q) · w_new`` (19 at q = 0.95). Recency weights are 1 for the newest workflow
    and shrink with age, so ``Σw`` is the sample size a decayed fit really has (never more than
    its ``n_eff = (Σw)² / Σw²``); a half-life that leaves less cannot name a q-quantile."""
    return float(np.sum(weights)) >= quantile / (1.0 - quantile) * w_new - 1e-9


def select_half_life(rows: pd.DataFrame, n_workflows: int, half_lives: Sequence[float | None],
                     min_workflows: int, quantile: float,
                     score: Callable[[pd.DataFrame, pd.DataFrame], tuple[float, float]],
                     narrower_on_ties: bool = True,
                     eligible: Callable[[pd.DataFrame], bool] | None = None,
                     pick: Callable[[Mapping[float | None, tuple[float, ...]]], float | None] | None = None
                     ) -> tuple[float | None, dict[float | None, tuple[float, ...]]]:
    """The recency half-life of one workflow type, chosen on a later slice.

    ``rows`` carry ``rank`` (:func:`workflow_ranks`, 0 = oldest of the type's ``n_workflows``).
    Each candidate weighs the oldest 70 % of the workflows by :func:`recency_weights` (column
    ``weight``) and ``score(train, later)`` says how it does on the newest 30 %: (coverage, mean
    width), NaN coverage when nothing there can be scored. The kept one is ``pick(scores)``'s,
    by default :func:`pick_narrowest`'s (list the no-decay ``None`` first: it is kept when nothing
    scores); the idle-gap fit picks by :func:`pick_least_decay` (its score adds a standard error).
    ``eligible(train)``: a decayed candidate whose weighted training slice fails it is not scored
    (NaN: never kept) — the idle-gap fit refuses a half-life whose weights cannot certify its
    quantile (:func:`certifies`), which would otherwise serve the cap and "cover" the later slice
    with it. Returns ``(half-life, scores)``; ``(None, {})`` — no decay, nothing tried — with fewer
    than ``min_workflows`` workflows or a single candidate. The tool-latency and idle-gap fits
    both choose theirs here."""
    cands = list(half_lives)
    if len(cands) <= 1 or n_workflows < min_workflows:
        return None, {}
    cut = int(round(0.7 * n_workflows))
    train, later = rows[rows["rank"] < cut], rows[rows["rank"] >= cut]
    scores = {}
    for h in cands:
        weighted = train.assign(weight=recency_weights(train["rank"].to_numpy(), cut, h))
        if h is not None and eligible is not None and not eligible(weighted):
            scores[h] = (math.nan,) * len(next(iter(scores.values()), (0.0, 0.0)))
            continue
        scores[h] = score(weighted, later)
    if pick is None:
        return pick_narrowest(scores, quantile, narrower_on_ties), scores
    return pick(scores), scores


def workflow_ranks(df: pd.DataFrame) -> pd.Series:
    """Per row: the rank (0 = oldest) of its workflow among its type's workflows by first arrival
    (ties by workflow id).

    Each (type, workflow) pair is grouped once; the ranks are computed on one row per workflow
    and read back by group number (no join of a million rows on two string keys)."""
    keys = ["workflow_type_id", "workflow_id"]
    if df[keys].isna().any(axis=None):
        return _workflow_ranks_by_join(df)
    grouped = df.groupby(keys, sort=False, observed=True)
    codes = grouped.ngroup().to_numpy()
    start = grouped["t_arrival"].min()
    firsts = pd.DataFrame({"wt": start.index.get_level_values(0), "start": start.to_numpy(),
                           "wf": start.index.get_level_values(1)}).sort_values(["wt", "start", "wf"])
    rank = np.empty(len(firsts), dtype=np.int64)
    rank[firsts.index.to_numpy()] = firsts.groupby("wt").cumcount().to_numpy()
    return pd.Series(rank[codes], index=df.index, name="rank")


def _workflow_ranks_by_join(df: pd.DataFrame) -> pd.Series:
    """:func:`workflow_ranks` by a join on the keys, for rows with a missing key (which groupby
    leaves out and the join matches NaN to NaN)."""
    start = df.groupby(["workflow_type_id", "workflow_id"], sort=False)["t_arrival"].transform("min")
    key = pd.DataFrame({"wt": df["workflow_type_id"], "start": start, "wf": df["workflow_id"]})
    firsts = key.drop_duplicates(["wt", "wf"]).sort_values(["wt", "start", "wf"])
    firsts["rank"] = firsts.groupby("wt").cumcount()
    return key.merge(firsts[["wt", "wf", "rank"]], on=["wt", "wf"], how="left")["rank"].set_axis(df.index)


def session_factors(df: pd.DataFrame, median: np.ndarray, prior_weight: float | None) -> np.ndarray:
    """Per row (rows sorted by workflow, call_index): the session factor from *earlier* gaps,
    ``exp(clip(Σ ln(gap/median) / (n + prior_weight), ±ln 8))``; 1 when ``prior_weight`` is None."""
    if prior_weight is None or len(df) == 0:
        return np.ones(len(df))
    gap = df["gap_after_s"].to_numpy(dtype=float)
    has = ~np.isnan(gap)
    ell = np.where(has, np.log(np.maximum(np.nan_to_num(gap, nan=1.0), MIN_GAP_S)
                               / np.maximum(median, MIN_GAP_S)), 0.0)
    wf = df["workflow_id"].to_numpy()
    prev_sum = pd.Series(ell).groupby(wf, sort=False).cumsum().to_numpy() - ell
    prev_n = pd.Series(has.astype(float)).groupby(wf, sort=False).cumsum().to_numpy() - has
    lim = math.log(MAX_FACTOR)
    return np.exp(np.clip(prev_sum / (prev_n + prior_weight), -lim, lim))


def grouped_weighted_quantile(codes: np.ndarray, x: np.ndarray, w: np.ndarray, q: float,
                              w_new: float, n_groups: int, tol: float = 1e-12,
                              x_order: np.ndarray | None = None) -> np.ndarray:
    """:func:`weighted_conformal_quantile` of every group at once (``codes`` 0…n_groups−1, each
    group non-empty): one sort by (group, x), cumulative weights within each group, and the
    first row per group whose share ``cum / (W_g + w_new)`` reaches ``q − tol`` (``inf`` when none).
    With ``w_new = 0`` and ``tol = 0`` it is :func:`weighted_median` at ``q = 0.5``.

    ``x_order``: ``np.argsort(x, kind="stable")`` when the caller has it (it sorts ``x`` once for
    several groupings of the same rows). A stable sort of the codes along it is the order
    ``np.lexsort((x, codes))`` gives — ties in both keys keep row order either way, so the
    cumulative weights are summed in the same order and the result is the same to the bit — and
    costs a radix sort of small integers instead of a float sort."""
    if x_order is None:
        order = np.lexsort((x, codes))
    else:
        small = np.min_scalar_type(max(n_groups - 1, 0))
        order = x_order[np.argsort(codes[x_order].astype(small), kind="stable")]
    c, xs, ws = codes[order], x[order], w[order]
    n = np.bincount(c, minlength=n_groups)
    starts = np.concatenate(([0], np.cumsum(n)[:-1]))
    cw = np.cumsum(ws)
    before = cw[starts] - ws[starts]
    within = cw - before[c]
    total = within[starts + n - 1]
    hit = within >= (q - tol) * (total[c] + w_new)
    idx = np.where(hit, np.arange(len(c)), len(c))
    first = np.minimum.reduceat(idx, starts)
    out = np.full(n_groups, math.inf)
    ok = first < starts + n
    out[ok] = xs[first[ok]]
    return out


@dataclass(frozen=True)
class _Grouping:
    """The rows of one level grouped: each row's group code, and per group its keys, ``n`` and
    ``n_eff`` (``(Σw)² / Σw²``). It depends on the rows, their keys and weights only, so the
    tables of several prior weights (which differ in ``z`` alone) share one."""

    codes: np.ndarray
    table: pd.DataFrame
    n_groups: int


def _grouping(df: pd.DataFrame, level: str) -> _Grouping:
    grouped = df.groupby(LEVEL_KEYS[level], sort=True, observed=True)
    codes = grouped.ngroup().to_numpy()
    size = grouped.size()
    n_groups = len(size)
    w = df["weight"].to_numpy(dtype=float)
    sw = np.bincount(codes, weights=w, minlength=n_groups)
    sw2 = np.bincount(codes, weights=w * w, minlength=n_groups)
    table = size.rename("n").reset_index()
    table["n_eff"] = sw ** 2 / sw2
    return _Grouping(codes, table, n_groups)


def _level_table(df: pd.DataFrame, level: str, value: str | None, q: float, min_samples: int,
                 p50: pd.DataFrame | None = None, with_p50: bool = True,
                 grouping: _Grouping | None = None,
                 orders: Mapping[str, np.ndarray] | None = None) -> pd.DataFrame:
    """One row per key of ``level`` with ≥ ``min_samples`` gaps: n, n_eff, p50 of raw gaps,
    conformal q-quantile of ``value`` (every group at once: :func:`grouped_weighted_quantile`).
    ``value`` None skips the quantile (NaN); ``p50``: a table of the same rows and level whose
    ``p50_s`` is reused instead of sorting again; ``with_p50=False`` leaves ``p50_s`` NaN.
    ``grouping``: :func:`_grouping` of ``df`` at ``level``, when already made; ``orders``: column
    -> its stable argsort over ``df``'s rows, for the columns sorted (``gap_after_s``, ``value``)."""
    keys = LEVEL_KEYS[level]
    columns = [*keys, "n", "n_eff", "p50_s", "q_z"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    g = grouping if grouping is not None else _grouping(df, level)
    orders = orders or {}
    codes, n_groups = g.codes, g.n_groups
    w = df["weight"].to_numpy(dtype=float)
    table = g.table.copy()
    keep = (table["n"] >= min_samples).to_numpy()
    if p50 is not None or not with_p50:
        table["p50_s"] = np.nan
        if p50 is not None:
            table.loc[keep, "p50_s"] = p50["p50_s"].to_numpy(dtype=float)
    else:
        table["p50_s"] = grouped_weighted_quantile(codes, df["gap_after_s"].to_numpy(dtype=float), w,
                                                   0.5, 0.0, n_groups, tol=0.0,
                                                   x_order=orders.get("gap_after_s"))
    table["q_z"] = (grouped_weighted_quantile(codes, df[value].to_numpy(dtype=float), w, q, 1.0, n_groups,
                                              x_order=orders.get(value))
                    if value is not None else np.nan)
    return table[keep].reset_index(drop=True)[columns]


def _stable_order(column: pd.Series) -> np.ndarray:
    """``np.argsort`` of the column's values as floats, stable (ties keep row order)."""
    return np.argsort(column.to_numpy(dtype=float), kind="stable")


def _lookup_codes(df: pd.DataFrame, table: pd.DataFrame, keys: list[str], column: str) -> np.ndarray | None:
    """``table[column]`` at each row's ``keys`` through the categorical codes the rows and the
    table share (a dense array indexed by the mixed-radix code: no join); None when a key column
    is not categorical in both, or their categories differ, or the code space is too large."""
    sizes = []
    for k in keys:
        a, b = df[k].dtype, table[k].dtype
        if not (isinstance(a, pd.CategoricalDtype) and isinstance(b, pd.CategoricalDtype)
                and a.categories.equals(b.categories)):
            return None
        sizes.append(len(a.categories))
    if int(np.prod(sizes, dtype=np.int64)) > 5_000_000:
        return None

    def flat(frame: pd.DataFrame) -> np.ndarray | None:
        code = np.zeros(len(frame), dtype=np.int64)
        for k, size in zip(keys, sizes):
            c = frame[k].cat.codes.to_numpy(dtype=np.int64)
            if len(c) and c.min() < 0:  # a missing key: let the join handle it
                return None
            code = code * size + c
        return code
    rows, at = flat(df), flat(table)
    if rows is None or at is None:
        return None
    dense = np.full(int(np.prod(sizes, dtype=np.int64)), np.nan)
    dense[at] = table[column].to_numpy(dtype=float)
    return dense[rows]


def _json_safe(value: Any) -> Any:
    """A deep copy of ``value`` with NaN/inf floats as None."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _fill_uncertified(table: pd.DataFrame, source: pd.DataFrame, keys: Sequence[str], label: str,
                      usable: Callable[[np.ndarray], np.ndarray]) -> None:
    """In place: every entry of ``table`` whose ``q_z`` is not finite (uncertified) takes
    ``source``'s ``q_z`` at the same ``keys`` where ``usable`` accepts it, and ``backed_off`` =
    ``label`` says so."""
    bad = ~np.isfinite(table["q_z"].to_numpy(dtype=float))
    if not bad.any():
        return
    got = table[list(keys)].merge(source[[*keys, "q_z"]], how="left", on=list(keys))["q_z"].to_numpy(dtype=float)
    fill = bad & usable(got)
    table.loc[fill, "q_z"] = got[fill]
    table.loc[fill, "backed_off"] = label


class IdleGapModel(IdleGapTable, BaseEstimator):
    """Idle-gap TTL per (workflow type, agent, tool) with backoff, session correction and recency.

    Parameters
    ----------
    quantile : share of idle gaps the TTL should outlast (0.95).
    max_ttl_s : cap of the TTL (also served when too few gaps certify the quantile).
    min_samples : fewest gaps for an entry of a level (19 is the least for a finite 0.95 quantile).
    folds : K of the cross-validation by workflow.
    prior_weights : candidate prior weights of the session correction (None = no correction).
    half_lives : candidate half-lives as a fraction of the type's workflows (None = no decay).
    min_workflows_drift : fewest workflows of a type for the half-life to be chosen at all.
    max_cv_workflows : the choices (half-life, level, prior weight) are validated on a seeded sample
        of at most this many workflows per type (0 = all); the final fit uses every workflow.
    forward_origins : rolling origins (shares of a type's workflows by start time) of the forward
        check of the choice against the pooled per-type quantile (:meth:`_forward_check`); empty:
        no check.
    random_state : seed of the fold assignment.

    Fitted attributes: ``workflow_types_`` ({wt: {level, tool_level, prior_weight, half_life,
    half_life_workflows, end_share, n, scores, forward, entries: {level: [{keys…, n, p50_s, ttl_z}]}}}).
    """

    def __init__(self, quantile: float = 0.95, max_ttl_s: float | None = 600.0, min_samples: int = 19,
                 folds: int = 5, prior_weights: Sequence[float | None] = (None, 1.0, 4.0, 16.0),
                 half_lives: Sequence[float | None] = (None, 0.5, 0.2, 0.05), min_workflows_drift: int = 20,
                 max_cv_workflows: int = 5000,
                 forward_origins: Sequence[float] = (0.5, 0.6, 0.7, 0.8, 0.9), random_state: int = 0):
        self.quantile = quantile
        self.max_ttl_s = max_ttl_s
        self.min_samples = min_samples
        self.folds = folds
        self.prior_weights = prior_weights
        self.half_lives = half_lives
        self.min_workflows_drift = min_workflows_drift
        self.max_cv_workflows = max_cv_workflows
        self.forward_origins = forward_origins
        self.random_state = random_state

    # ------------------------------------------------------------------ pieces
    def _cap(self, ttl: np.ndarray) -> np.ndarray:
        cap = math.inf if self.max_ttl_s is None else float(self.max_ttl_s)
        return np.minimum(np.nan_to_num(np.asarray(ttl, dtype=float), nan=cap, posinf=cap), cap)

    def _tables(self, train: pd.DataFrame, prior_weight: float | None) -> dict[str, pd.DataFrame]:
        """Entries of every level fit on ``train`` (gap rows, sorted, with ``weight``)."""
        return self._tables_by_prior(train, (prior_weight,), full=True)[prior_weight]

    def _tables_by_prior(self, train: pd.DataFrame, prior_weights: Sequence[float | None],
                         full: bool = False) -> dict[Any, dict[str, pd.DataFrame]]:
        """:meth:`_tables` for several prior weights of the same ``train``: the medians (which do
        not depend on the prior weight) are computed once and reused. ``full`` also computes the
        tool level's median (recorded in the profile; the served TTL never reads it)."""
        arrival = [lv for lv in LEVELS if lv != "tool"]
        # shared by every table below: the grouping of each level, and the sort of the gaps
        groups = {lv: _grouping(train, lv) for lv in LEVELS} if len(train) else {}
        gap_order = {"gap_after_s": _stable_order(train["gap_after_s"])}
        med = {lv: _level_table(train, lv, None, 0.5, self.min_samples, grouping=groups.get(lv),
                                orders=gap_order) for lv in arrival}
        med["tool"] = pd.DataFrame(columns=[*LEVEL_KEYS["tool"], "p50_s"])
        med_row = self._row_values(train, med, "agent", "p50_s")
        out = {}
        for w in prior_weights:
            t = train.assign(z=train["gap_after_s"] / session_factors(train, med_row, w))
            orders = {**gap_order, "z": _stable_order(t["z"])}
            tables = {lv: _level_table(t, lv, "z", self.quantile, self.min_samples,
                                       p50=med[lv] if lv != "tool" else None,
                                       with_p50=lv != "tool" or full, grouping=groups.get(lv), orders=orders)
                      for lv in LEVELS}
            out[w] = self._back_off_uncertified(t, tables, orders["z"])
        return out

    def _back_off_uncertified(self, t: pd.DataFrame, tables: dict[str, pd.DataFrame],
                              z_order: np.ndarray) -> dict[str, pd.DataFrame]:
        """Entries whose recency-weighted quantile is not certified (``q_z`` inf: their weights
        sum to less than q / (1 − q), :func:`certifies`) are not served the cap. Each first tries
        its own gaps under a longer half-life — weights ``w^(1/2^k)`` are those of a half-life
        2^k times as long — up to 16× and then unweighted; only an entry whose plain gaps cannot
        certify q either (``min_samples`` below q / (1 − q)) takes its parent's quantile (a tool
        its agent's, an agent its type's), and a type then keeps the cap, as before. Such an
        entry keeps its median (the session correction's reference). ``backed_off`` (a column)
        says where the served quantile came from ("" = its own, "half-life x4", "unweighted",
        or a parent level). Without decay every entry of ≥ 19 gaps certifies 0.95: only a
        weighted fit changes."""
        out = {lv: tb.assign(backed_off="") for lv, tb in tables.items()}
        w = t["weight"].to_numpy(dtype=float)
        ladder = ((0.5, "half-life x2"), (0.25, "half-life x4"), (0.125, "half-life x8"),
                  (0.0625, "half-life x16"), (0.0, "unweighted"))
        for lv in ("workflow_type", "agent", "tool"):
            for power, label in ladder:
                if not len(out[lv]) or np.isfinite(out[lv]["q_z"].to_numpy(dtype=float)).all():
                    break
                alt = _level_table(t.assign(weight=np.power(w, power)), lv, "z", self.quantile,
                                   self.min_samples, with_p50=False, orders={"z": z_order})
                _fill_uncertified(out[lv], alt, LEVEL_KEYS[lv], label, np.isfinite)
        for lv, parent in (("agent", "workflow_type"), ("tool", "agent")):
            # the parent's quantile, even the cap (inf) of a type that cannot certify q either
            _fill_uncertified(out[lv], out[parent], LEVEL_KEYS[parent], parent,
                              lambda q: ~np.isnan(q))
        return out

    def _row_values(self, df: pd.DataFrame, tables: Mapping[str, pd.DataFrame], level: str,
                    column: str) -> np.ndarray:
        """``column`` of each row's entry at ``level``, backing off to coarser levels (NaN if none)."""
        out = np.full(len(df), np.nan)
        for lv in LEVELS[LEVELS.index(level):]:
            t = tables[lv]
            if t.empty:
                continue
            keys = LEVEL_KEYS[lv]
            vals = _lookup_codes(df, t, keys, column)
            if vals is None:  # plain string keys: a left join
                vals = df[keys].merge(t[[*keys, column]], on=keys, how="left")[column].to_numpy(dtype=float)
            out = np.where(np.isnan(out), vals, out)
        return out

    def _predict_rows(self, df: pd.DataFrame, tables: Mapping[str, pd.DataFrame], level: str,
                      prior_weight: float | None) -> np.ndarray:
        """Served TTL per row of ``df`` (sorted by workflow, call_index; END rows included so the
        session factor sees the order), with the session factor of earlier gaps."""
        med = self._row_values(df, tables, "agent", "p50_s")
        c = session_factors(df, np.nan_to_num(med, nan=1.0), prior_weight)
        return self._cap(c * self._row_values(df, tables, level, "q_z"))

    def _score(self, df: pd.DataFrame, ttl: np.ndarray) -> tuple[float, float]:
        gap = df["gap_after_s"].to_numpy(dtype=float)
        has = ~np.isnan(gap)
        if not has.any():
            return math.nan, math.nan
        return float(np.mean(gap[has] <= ttl[has])), float(np.mean(ttl[has]))

    def _cost(self, df: pd.DataFrame, ttl: np.ndarray) -> tuple[float, float]:
        """(coverage of the rows with a gap, KV-seconds held per covered gap), the cost as
        ``profiler eval`` reports it with the session ends (``kv_s_per_covered_gap_with_ends``):
        ``(Σ min(TTL, gap) + Σ_END TTL) / #covered`` — a covered gap holds its KV for the gap, a
        missed one for the whole TTL, a session's last call for the whole TTL for nothing (so a
        TTL longer than the gaps need costs there). ``inf`` when nothing is covered."""
        gap = df["gap_after_s"].to_numpy(dtype=float)
        has = ~np.isnan(gap)
        if not has.any():
            return math.nan, math.nan
        covered = gap[has] <= ttl[has]
        held = float(np.minimum(ttl[has], gap[has]).sum() + ttl[~has].sum())
        return float(covered.mean()), held / float(covered.sum()) if covered.any() else math.inf

    def _pick(self, scores: Mapping[Any, tuple[float, float]]) -> Any:
        """Narrowest candidate whose coverage reaches the quantile, else the best covered."""
        return pick_narrowest(scores, self.quantile)

    def _choose_half_life(self, g: pd.DataFrame, n_wf: int) -> tuple[float | None, dict]:
        """Half-life by a later slice (:func:`select_half_life`), each candidate scored at the
        arrival level (agent or workflow type) it does best at (:func:`pick_narrowest`): an
        agent's few gaps may certify no more than their maximum under any weighting, while the
        type's many follow the drift. Judged on coverage *and* cost, and on whether a decay moves
        the quantile beyond its noise at all: each candidate's score is (later-slice coverage,
        KV-seconds held per covered gap with the session ends, the standard error of its own
        weighted quantile's coverage, the share of its weighted training gaps the no-decay TTL
        covers) and :func:`pick_least_decay` keeps one."""
        plain: dict[str, np.ndarray] = {}

        def fit_score(train: pd.DataFrame, later: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
            """(TTL of the training gaps, TTL of the later slice's rows) at the candidate's level."""
            tables = self._tables_by_prior(train, (None,))[None]
            ttl = {lv: self._predict_rows(later, tables, lv, None) for lv in ("agent", "workflow_type")}
            level = self._pick({lv: self._score(later, t) for lv, t in ttl.items()})
            return self._predict_rows(train, tables, level, None), ttl[level]

        def score(train: pd.DataFrame, later: pd.DataFrame) -> tuple[float, float, float, float]:
            train = train[train["gap_after_s"].notna()]
            own, ttl = fit_score(train, later)
            if "ttl" not in plain:   # the no-decay TTL of the same training gaps, once
                plain["ttl"] = fit_score(train.assign(weight=1.0), later)[0]
            gap, w = train["gap_after_s"].to_numpy(dtype=float), train["weight"].to_numpy(dtype=float)
            se = weighted_coverage_se(gap <= own, w, train["workflow_id"].to_numpy(), self.quantile)
            return (*self._cost(later, ttl), se, float(np.dot(w, gap < plain["ttl"]) / w.sum()))

        def eligible(train: pd.DataFrame) -> bool:   # the type's own weighted quantile is finite
            return certifies(train.loc[train["gap_after_s"].notna(), "weight"].to_numpy(), self.quantile)
        h, scores = select_half_life(g, n_wf, self.half_lives, self.min_workflows_drift, self.quantile, score,
                                     eligible=eligible, pick=lambda s: pick_least_decay(s, self.quantile))
        return h, {str(k): list(v) for k, v in scores.items()}

    def _give_up(self, gap: np.ndarray) -> dict[str, float | None]:
        """The give-up TTL's figures of one type's gaps: ``past_cap_share`` (share of gaps longer
        than the policy's cap, which no held TTL covers) and ``coverable_quantile_s`` (the
        conformal quantile of the gaps within the cap; None when they are too few to certify it).
        Holding the cap for a gap past it holds KV for nothing; a TTL at the quantile of the
        coverable gaps keeps the KV for those only (served online where it is ahead:
        :mod:`predictors.keep_alive_selection`)."""
        within = gap[gap <= HELD_TTL_MAX_S]
        q = weighted_conformal_quantile(within, np.ones(len(within)), self.quantile)
        return {"past_cap_share": float(1 - len(within) / len(gap)) if len(gap) else 0.0,
                "coverable_quantile_s": q if math.isfinite(q) else None}

    def _cross_validate(self, g: pd.DataFrame) -> tuple[dict[tuple[str, Any], tuple[float, float]],
                                                        dict[tuple[str, Any], np.ndarray]]:
        """K-fold by workflow: (level, prior weight) -> (coverage, mean TTL) on held-out folds, and
        each candidate's TTL per row of ``g`` (held-out, capped) for :meth:`_plain_unless_ahead`."""
        k = min(self.folds, int(g["workflow_id"].nunique()))
        fold = group_folds(g["workflow_id"], k, self.random_state)
        preds: dict[tuple[str, Any], np.ndarray] = {(lv, w): np.full(len(g), np.nan)
                                                    for lv in LEVELS for w in self.prior_weights}
        for f in range(k):
            tr, va = g[(fold != f)], g[fold == f]
            by_prior = self._tables_by_prior(tr[tr["gap_after_s"].notna()], self.prior_weights)
            for w in self.prior_weights:
                tables = by_prior[w]
                for lv in LEVELS:
                    preds[(lv, w)][fold == f] = self._predict_rows(va, tables, lv, w)
        return {key: self._score(g, p) for key, p in preds.items()}, preds

    def _plain_unless_ahead(self, arrival: tuple[str, Any], preds: Mapping[tuple[str, Any], np.ndarray],
                            g: pd.DataFrame) -> tuple[str, Any]:
        """``arrival`` (level, prior weight), or the same level without the session factor where
        that one dominates it on the validation folds: covers more beyond one standard error at a
        cost not above beyond one, or holds less beyond one at a coverage not below beyond one
        (:func:`compare_held`: TTLs held as the keep/drop policy holds them, KV-seconds per covered
        gap with the session ends, paired delete-one-workflow jackknife on the same gaps).

        The mean TTL the choice narrows cannot see what a session factor costs: it shortens the
        TTL of fast sessions, which saves nothing on the gaps they cover (a covered gap holds only
        its own length), and lengthens that of slow ones, whose gaps it still misses holding the
        longer TTL. On mini-SWE-agent the factor won by 0.7 s of mean TTL and lost to the plain
        quantile in coverage and KV-seconds per covered gap, on validation and on the test side
        (docs/keep-alive.md). The level is kept: its mean TTL is the scale of each agent's TTL."""
        level, w = arrival
        plain = (level, None)
        if w is None or plain not in preds:
            return arrival
        gap = g["gap_after_s"].to_numpy(dtype=float)
        has = ~np.isnan(gap)
        wf = g["workflow_id"].to_numpy()
        a, b = (np.clip(preds[k], HELD_TTL_MIN_S, HELD_TTL_MAX_S) for k in (arrival, plain))
        vs = compare_held(gap[has], a[has], b[has], wf[has], ends=(a[~has], b[~has], wf[~has]))
        return plain if vs["dominated"] else arrival

    def _forward_check(self, g: pd.DataFrame, n_wf: int, half_life: float | None, level: str,
                       prior_weight: float | None) -> tuple[dict[str, Any] | None, pd.DataFrame | None]:
        """The chosen TTL against the pooled per-type quantile, scored forward in time.

        Rolling origin on the training side: at each origin (a share of the type's workflows by
        start time, :attr:`forward_origins`) both candidates are fit on the workflows started
        before it — ``chosen`` = the chosen (half-life, level, prior weight), ``pooled`` = one
        unweighted conformal quantile of the type's gaps, no session factor (the ``idle_gap_p95``
        baseline's estimate, certified) — and serve the workflows up to the next origin (the last
        block: up to the newest). TTLs are held as the keep/drop policy holds them (0.5–120 s).
        ``pooled`` serves when it is ahead forward beyond one standard error (jackknife by
        workflow): it covers more at no more KV-seconds per covered gap (the TTL held after a
        session's last call counted, as the half-life choice counts it), or it reaches the
        quantile and holds less at a coverage not below beyond one (the cheapest at nominal, as
        the half-life choice keeps), or ``chosen`` stays under the quantile and ``pooled`` covers
        more. Where an entry
        has few gaps, or the gaps drift, a finer or decayed fit keeps its past shape while the
        pooled quantile is wider in the right place. (Serving the pooled one unless the chosen is
        ahead beyond noise — the simpler by default — covered less on SWE-agent's and the
        drifting team's futures: docs/keep-alive.md.) Returns ``{served, gaps, scores:
        {candidate: {coverage, kv_s_per_covered_gap}}, diff, diff_se, kv_s_diff, kv_s_diff_se}``
        (pooled minus chosen), and the replay the online selector's warm start is seeded from: the
        scored rows (``agent_id, t_arrival, gap_after_s``) with the TTL each keep-alive candidate
        would have served from the prefix (``fitted``: the one that serves, ``idle_gap_p95``: the
        prefix's plain quantile, ``give_up``: its coverable quantile, NaN where no prefix gap runs
        past the cap); (None, None) when too few workflows (``min_workflows_drift``) or no origin
        has a certifiable prefix."""
        if not self.forward_origins or n_wf < self.min_workflows_drift:
            return None, None
        cuts = sorted({int(round(f * n_wf)) for f in self.forward_origins} | {n_wf})
        rank = g["rank"].to_numpy()
        parts: dict[str, list[np.ndarray]] = {"chosen": [], "pooled": [], "idle_gap_p95": [], "give_up": []}
        scored: list[pd.DataFrame] = []
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            prefix = g[(rank < lo) & g["gap_after_s"].notna().to_numpy()]
            block = g[(rank >= lo) & (rank < hi)]
            if not certifies(np.ones(len(prefix)), self.quantile) or block["gap_after_s"].isna().all():
                continue
            chosen = prefix.assign(weight=recency_weights(prefix["rank"].to_numpy(), lo, half_life))
            tables = self._tables_by_prior(chosen, (prior_weight,))[prior_weight]
            parts["chosen"].append(self._predict_rows(block, tables, level, prior_weight))
            # the type level, unweighted, no session factor: one conformal quantile of the gaps
            pooled = (weighted_conformal_quantile(prefix["gap_after_s"].to_numpy(dtype=float), np.ones(len(prefix)),
                                                  self.quantile) if len(prefix) >= self.min_samples else math.inf)
            parts["pooled"].append(self._cap(np.full(len(block), pooled)))
            # the selector's other candidates as the prefix would have served them (warm start)
            gaps = prefix["gap_after_s"].to_numpy(dtype=float)
            give_up = self._give_up(gaps)
            parts["idle_gap_p95"].append(np.full(len(block), float(np.quantile(gaps, self.quantile))))
            parts["give_up"].append(np.full(len(block), (give_up["coverable_quantile_s"] or math.nan)
                                            if give_up["past_cap_share"] else math.nan))
            scored.append(block)
        if not scored:
            return None, None
        rows = pd.concat(scored)
        ttl = {k: np.clip(np.concatenate(parts[k]), HELD_TTL_MIN_S, HELD_TTL_MAX_S) for k in ("chosen", "pooled")}
        gap = rows["gap_after_s"].to_numpy(dtype=float)
        has = ~np.isnan(gap)
        wf = rows["workflow_id"].to_numpy()[has]
        # pooled minus chosen; "dominated": the chosen is ahead beyond one standard error
        ends = (ttl["chosen"][~has], ttl["pooled"][~has], rows["workflow_id"].to_numpy()[~has])
        vs = compare_held(gap[has], ttl["chosen"][has], ttl["pooled"][has], wf, ends=ends)   # chosen − pooled
        scores = {k: dict(zip(("coverage", "kv_s_per_covered_gap"), self._cost(rows, t))) for k, t in ttl.items()}
        sc, sk = vs["coverage_diff_se"] or 0.0, vs["kv_s_diff_se"] or 0.0
        dc, dk = vs["coverage_diff"], vs["kv_s_diff"] if vs["kv_s_diff"] is not None else 0.0
        ahead = (-dc > sc and dk >= -sk                                                  # covers more
                 or dk > sk and dc <= sc and scores["pooled"]["coverage"] >= self.quantile  # cheaper at nominal
                 or scores["chosen"]["coverage"] < self.quantile and -dc > sc)          # chosen short
        served = "pooled" if ahead else "chosen"
        replay = rows[["agent_id", "t_arrival", "gap_after_s"]].assign(
            fitted=ttl[served], idle_gap_p95=np.concatenate(parts["idle_gap_p95"]),
            give_up=np.concatenate(parts["give_up"]))
        return {"served": served, "gaps": int(has.sum()),
                "scores": scores, "diff": -vs["coverage_diff"], "diff_se": vs["coverage_diff_se"],
                "kv_s_diff": None if vs["kv_s_diff"] is None else -vs["kv_s_diff"],
                "kv_s_diff_se": vs["kv_s_diff_se"]}, replay

    # --------------------------------------------------------------------- fit
    def _warm_start(self, wt: str, replay: pd.DataFrame | None,
                    tool_ttls: Mapping[tuple[str, str], float] | None) -> dict[str, Any] | None:
        """The online keep-alive selector's evidence for type ``wt`` from the forward replay of
        the training side (:meth:`_forward_check`), oldest call first: every candidate scored on
        the gaps the rolling origins served (:func:`predictors.keep_alive_selection.warm_start_state`),
        the tool candidate at the agent's tool TTL (``tool_ttls``; the policy's default without
        one, as the Predictor serves it). The server's selector decides from it which candidate
        serves first (:meth:`predictors.keep_alive_selection.KeepAliveSelector.warm_start`)."""
        if replay is None or replay.empty:
            return None
        replay = replay.sort_values("t_arrival", kind="stable")
        by_agent = {a: v for (w, a), v in (tool_ttls or {}).items() if w == wt}
        tool = replay["agent_id"].astype(str).map(by_agent).astype(float).fillna(HELD_TTL_DEFAULT_S).to_numpy()
        ttls = np.column_stack([replay["fitted"], replay["idle_gap_p95"], tool, replay["give_up"]])
        return warm_start_state(replay["gap_after_s"].to_numpy(dtype=float), ttls)

    def fit(self, calls: pd.DataFrame, tool_ttls: Mapping[tuple[str, str], float] | None = None) -> "IdleGapModel":
        """``calls``: one row per call with :data:`GAP_COLUMNS` (``gap_after_s`` NaN = END);
        ``tool_ttls``: the keep-alive TTL of each (workflow type, agent)'s tool (``retain_s``), the
        online selector's ``tool_p95`` candidate in its warm start (None: the policy's default)."""
        df = calls.loc[:, list(GAP_COLUMNS)].copy()
        df["tool"] = df["tool"].fillna("").astype(str)
        df["gap_after_s"] = pd.to_numeric(df["gap_after_s"], errors="coerce")
        df.loc[df["gap_after_s"] < 0, "gap_after_s"] = np.nan
        df["rank"] = workflow_ranks(df) if len(df) else pd.Series(dtype=float)
        df = df.sort_values(["workflow_type_id", "workflow_id", "call_index"], kind="stable").reset_index(drop=True)
        # categorical keys (categories sorted like the strings): groupby and merges take codes
        df = df.astype({"workflow_type_id": "category", "agent_id": "category", "tool": "category"})
        self.workflow_types_: dict[str, dict[str, Any]] = {}
        for wt, g in df.groupby("workflow_type_id", sort=True, observed=True):
            g = g.reset_index(drop=True)
            n_wf = int(g["workflow_id"].nunique())
            gaps = int(g["gap_after_s"].notna().sum())
            info: dict[str, Any] = {"n": gaps, "workflows": n_wf,
                                    "end_share": float(1 - gaps / len(g)) if len(g) else 0.0,
                                    # the naive baseline: one plain quantile of the type's gaps
                                    "baseline_quantile_s": float(np.quantile(g["gap_after_s"].dropna(),
                                                                             self.quantile)) if gaps else None,
                                    **self._give_up(g["gap_after_s"].dropna().to_numpy(dtype=float))}
            if gaps == 0:
                self.workflow_types_[wt] = {**info, "level": "none", "reason": "no idle gaps (no call "
                                            "follows another)", "entries": {lv: [] for lv in LEVELS}}
                continue
            sample = g
            if 0 < self.max_cv_workflows < n_wf:
                keep = np.random.default_rng(self.random_state).choice(
                    np.sort(g["workflow_id"].unique()), self.max_cv_workflows, replace=False)
                sample = g[g["workflow_id"].isin(keep)]
            h, h_scores = self._choose_half_life(sample, n_wf)
            g = g.assign(weight=recency_weights(g["rank"].to_numpy(), n_wf, h))
            if n_wf >= 2:
                scores, held = self._cross_validate(g.loc[sample.index])
                narrowest = self._pick({k: v for k, v in scores.items() if k[0] != "tool"})
                arrival = self._plain_unless_ahead(narrowest, held, g.loc[sample.index])
                level, w = arrival
                tool_level = (scores[("tool", w)][0] >= self.quantile
                              and scores[("tool", w)][1] < scores[arrival][1])
                reason = "cross-validation by workflow"
                if arrival != narrowest:
                    reason += "; no session factor: the plain quantile dominated it in validation"
            else:
                scores, level, w, tool_level = {}, "workflow_type", None, False
                reason = "one workflow: no validation, workflow-type level"
            forward, replay = self._forward_check(g.loc[sample.index], n_wf, h, level, w)
            warm = self._warm_start(wt, replay, tool_ttls)
            if forward and forward["served"] == "pooled":   # the pooled per-type quantile serves
                h, level, w, tool_level = None, "workflow_type", None, False
                g = g.assign(weight=1.0)
                reason += "; the pooled per-type quantile: ahead forward in time"
            tables = self._tables(g[g["gap_after_s"].notna()], w)
            if tables["workflow_type"].empty:
                reason += f"; fewer than {self.min_samples} gaps: no idle-gap TTL (the tool-latency TTL applies)"
            info.update({
                "level": level, "tool_level": bool(tool_level), "prior_weight": w, "reason": reason,
                "half_life": h, "half_life_workflows": None if h is None else float(h * n_wf),
                "half_life_scores": h_scores,
                "forward": forward,
                "selection_warm_start": warm,
                "scores": {f"{lv}/{pw}": {"coverage": v[0], "mean_ttl_s": v[1]} for (lv, pw), v in scores.items()},
                # entries whose weighted quantile was not certified, by where theirs came from
                "backed_off": {lv: {str(k): int(v) for k, v in t["backed_off"].value_counts().items() if k}
                               for lv, t in tables.items()},
                "entries": {lv: [{**{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()
                                     if k != "q_z" and not (k == "backed_off" and v == "")},
                                  "ttl_z": float(r["q_z"])}
                                 for r in t.to_dict("records")] for lv, t in tables.items()},
            })
            self.workflow_types_[wt] = info
        self._index()
        return self

    # ------------------------------------------------------------------- serve
    # entry / median / prior_weight / _index / from_dict: predictors.served.IdleGapTable
    def ttl(self, wt: str, agent: str | None = None, tool: str | None = None, factor: float = 1.0) -> float | None:
        """Served TTL (s): ``factor · Q_q(z)`` of the entry, capped; None when the type has none."""
        e, _ = self.entry(wt, agent, tool)
        if e is None:
            return None
        return float(self._cap(np.array([factor * e["ttl_z"]]))[0])

    def predict_sessions(self, calls: pd.DataFrame) -> np.ndarray:
        """TTL served at each call's arrival when replaying held-out sessions in call order (the
        session factor from each session's own earlier gaps). ``calls`` as in :meth:`fit`; the
        result follows the rows of ``calls``."""
        df = calls.loc[:, list(GAP_COLUMNS)].copy()
        df["tool"] = df["tool"].fillna("").astype(str)
        df["_row"] = np.arange(len(df))
        df = df.sort_values(["workflow_type_id", "workflow_id", "call_index"], kind="stable").reset_index(drop=True)
        # categorical keys (categories sorted like the strings): groupby and merges take codes
        df = df.astype({"workflow_type_id": "category", "agent_id": "category", "tool": "category"})
        out = np.full(len(df), np.nan)
        for wt, g in df.groupby("workflow_type_id", sort=False):
            info = self.workflow_types_.get(wt)
            if info is None or info.get("level") == "none":
                continue
            tables = {lv: pd.DataFrame(info["entries"][lv], columns=[*LEVEL_KEYS[lv], "n", "n_eff", "p50_s", "ttl_z"])
                      .rename(columns={"ttl_z": "q_z"}).fillna({"q_z": math.inf}) for lv in LEVELS}
            out[g.index.to_numpy()] = self._predict_rows(g, tables, info["level"], info.get("prior_weight"))
        result = np.full(len(df), np.nan)
        result[df["_row"].to_numpy()] = out
        return result

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: non-finite floats (an uncertified TTL, an unscored candidate) become None."""
        return _json_safe({"params": {**self.get_params(), "prior_weights": list(self.prior_weights),
                                      "half_lives": list(self.half_lives)},
                           "workflow_types": self.workflow_types_})
