"""Remaining output tokens of a session: the work the engine still has to decode for it.

A scheduler that wants to shorten the average workflow completion time serves the workflow with
the least work left first (SRPT). The work an LLM engine spends on a session is, to first order,
the output tokens it still has to decode, so the quantity to predict at each call ``i`` of a
workflow whose calls produce ``o_0 … o_{n−1}`` output tokens is

    R_i = Σ_{j ≥ i} o_j        (this call's output and every later call's)

given only what is observable when call ``i`` arrives: the workflow type, the call index ``i``
(calls done), the agent of this call, and the session's own outputs so far.

The estimator: a per-type **context table** of the empirical distribution of ``R_i`` at a key
(position bucket and agent, exact index, the agent's calls so far, or elapsed time: the candidate
*levels*), backed off to coarser keys below ``min_n`` workflows (and, for an agent whose role
changed at the end of the log, always: :func:`changed_roles`); its point (``p50`` or ``mean``)
scaled by a **session factor** ``r_i = ((S_i + κ·m̄) / (E_i + κ·m̄)) ** β`` (the session's tokens
so far against its agents' means; ``β = 0`` switches it off). Per workflow type the candidate is
chosen by cross-validation by workflow with the one-standard-error rule against the position
median. Selection, tie-breaking and the baselines written beside the model (``position_median``,
``mrl``): docs/workflow-paths.md, "Remaining output tokens". The served candidate is then chosen
among the cross-validated one and those two baselines by the ranking figure itself, the C-index
over concurrent sessions, scored forward in time on the training side, and a richer one serves
only when the training side's held-out pairs put it ahead of each simpler one beyond
:data:`OCCAM_SE` standard errors (:meth:`RemainingTokens._forward`; the C-index functions live
here so that the fit and ``profiler eval`` score it alike).

The serving half, :class:`predictors.served.RemainingTokensTable`, reads the section written by
:meth:`RemainingTokens.to_dict` with numpy alone.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import binom
from sklearn.base import BaseEstimator

from predictors.band_selection import FORWARD_ORIGINS
from predictors.served import (BASELINE_KEYS, MAX_AGENT_CALLS, MAX_ELAPSED_BUCKET, RW_CANDIDATES,
                               RemainingTokensTable, baseline_figures, tie_broken)
from store.folds import group_folds, paired_se

#: Candidate session factors ``(β, κ)``; ``(0, 0)`` is "no factor".
FACTORS = ((0.0, 0.0), (0.5, 1.0), (0.5, 4.0), (1.0, 1.0), (1.0, 4.0), (1.0, 16.0))
#: Candidate table levels (the first key looked up; every level backs off to the position):
#: position bucket, (position bucket, agent), (agent, its calls so far), elapsed-time bucket, exact
#: call index (calls done → residual work of the workflows that ran that long: the ``mrl`` key).
LEVELS = ("position", "agent", "agent_calls", "elapsed", "index")
POINTS = ("p50", "mean")
#: What the forward rule compares, simplest first: the two naive baselines as ``profiler eval``
#: scores them, then the cross-validated candidate (ties broken by calls done → mean residual life).
FORWARD_CANDIDATES = RW_CANDIDATES
#: Occam margin of the served remaining-tokens order: a richer candidate serves only when the
#: training side's held-out pairs (forward blocks and CV folds pooled) put it ahead of each simpler
#: one by more than this many jackknife standard errors (chosen on messy seeds 3–9; docs/workflow-paths.md).
OCCAM_SE = 1.0
#: Fewest training workflows of a type for the forward rule (fewer: the cross-validated choice).
FORWARD_MIN_WORKFLOWS = 20
#: The newest share of a type's workflows (by start) the role check reads: the forward rule's
#: last block.
RECENT_SHARE = round(1.0 - FORWARD_ORIGINS[-1], 6)
#: Family-wise level of the role check over a type's agent keys (one-sided binomial, Bonferroni).
ROLE_ALPHA = 0.01
#: Share of a key's workflows the newest must hold for the key to mark its agent (chosen on messy
#: seeds 3–9, not the reported 0–2: 0.5 also flagged releases well represented in the training
#: side and lost up to 0.018 there; docs/workflow-paths.md).
ROLE_MAJORITY = 0.9


def session_frame(calls: pd.DataFrame) -> pd.DataFrame:
    """Per call: ``i`` (call index in its workflow), ``bucket``, ``R`` (remaining output tokens,
    this call included), ``S`` (tokens written before it) and ``n`` (the workflow's calls).

    ``calls`` holds ``workflow_type_id, workflow_id, agent_id, output_tokens`` in call order
    within each workflow (:func:`fitting.profile_fit.ok_calls`); its ``group_id`` column, when
    there is one, is kept (the selection folds keep a group's workflows together)."""
    cols = ["workflow_type_id", "workflow_id", "agent_id", "output_tokens"]
    df = calls[cols + [c for c in ("t_arrival", "t_finish", "group_id") if c in calls]].copy()
    df["output_tokens"] = df["output_tokens"].astype(float).clip(lower=0)
    g = df.groupby(["workflow_type_id", "workflow_id"], sort=False)["output_tokens"]
    df["i"] = g.cumcount()
    total = g.transform("sum")
    df["S"] = g.cumsum() - df["output_tokens"]
    df["R"] = total - df["S"]
    df["n"] = g.transform("size")
    df["bucket"] = position_buckets(df["i"].to_numpy())
    if "t_arrival" in df:     # seconds since the session's first call, bucketed
        start = df.groupby(["workflow_type_id", "workflow_id"], sort=False)["t_arrival"].transform("min")
        df["e"] = elapsed_buckets(df["t_arrival"].to_numpy(dtype=float) - start.to_numpy(dtype=float))
    else:
        df["e"] = -1
    df["k"] = df.groupby(["workflow_type_id", "workflow_id", "agent_id"], sort=False).cumcount().clip(
        upper=MAX_AGENT_CALLS)
    return df.reset_index(drop=True)


def position_buckets(i: np.ndarray) -> np.ndarray:
    """:func:`synth.remaining.position_bucket` of every index (exact below 8, then half-octaves)."""
    i = np.asarray(i, dtype=np.int64)
    with np.errstate(divide="ignore"):
        tail = 8 + np.floor(2 * np.log2(np.maximum(i, 8) / 8)).astype(np.int64)
    return np.where(i < 8, i, tail)


def elapsed_buckets(seconds: np.ndarray) -> np.ndarray:
    """:func:`predictors.served.elapsed_bucket` of every elapsed time."""
    s = np.maximum(np.asarray(seconds, dtype=float), 0.0)
    return np.minimum(MAX_ELAPSED_BUCKET, np.floor(2 * np.log2(1.0 + s)).astype(np.int64))


def _stats(values: np.ndarray) -> list[float]:
    """``[n, mean, p50, p90]`` of the remaining tokens at one key."""
    p50, p90 = np.quantile(values, [0.5, 0.9])
    return [int(len(values)), float(np.mean(values)), float(p50), float(p90)]


def _keyed(df: pd.DataFrame, by: list[str], name, min_n: int) -> dict[str, list[float]]:
    """``{name(key): _stats(R)}`` per group of ``by`` seen in at least ``min_n`` workflows.

    One grouping gives each group's workflow count and its rows' positions (in frame order,
    so ``R`` reaches :func:`_stats` exactly as a per-group frame would hand it); no group's
    frame is built."""
    grouped = df.groupby(by, sort=True)
    support = grouped["workflow_id"].nunique()
    rows = grouped.indices
    r = df["R"].to_numpy()
    return {name(*(key if isinstance(key, tuple) else (key,))): _stats(r[rows[key]])
            for key, n in support.items() if n >= min_n}


def fit_type_table(df: pd.DataFrame, min_n: int) -> dict[str, Any]:
    """The serving entry of one workflow type from its per-call frame (:func:`session_frame`).
    Position keys are kept whatever their support (they are the last level before the type);
    the keys of an agent whose role changed at the end of the log (:func:`changed_roles`) are
    left out, so its calls back off to the position (``changed_roles`` in the entry names them)."""
    agent_mean = df.groupby("agent_id")["output_tokens"].mean()
    agent_keys = {
        **_keyed(df, ["bucket", "agent_id"], lambda b, a: f"b{int(b)}|{a}", min_n),
        **_keyed(df, ["k", "agent_id"], lambda k, a: f"c{int(k)}|{a}", min_n),
    }
    changed = changed_roles(df, agent_keys, min_n)
    keys: dict[str, list[float]] = {
        "": _stats(df["R"].to_numpy()),
        **_keyed(df, ["bucket"], lambda b: f"b{int(b)}", 1),
        **{k: v for k, v in agent_keys.items() if k.split("|", 1)[1] not in changed},
        **_keyed(df[df["e"] >= 0], ["e"], lambda e: f"e{int(e)}", min_n),
        # exact indices below 8 are their own position buckets (kept above): only later ones
        **_keyed(df[df["i"] >= 8], ["i"], lambda i: f"i{int(i)}", min_n),
    }
    return {"n_workflows": int(df["workflow_id"].nunique()),
            "mean_out": float(df["output_tokens"].mean()),
            "agent_mean": {str(a): float(v) for a, v in agent_mean.items()},
            "buckets": sorted(int(b) for b in df["bucket"].unique()),
            "changed_roles": changed,
            "keys": keys}


def changed_roles(df: pd.DataFrame, agent_keys: dict[str, list[float]], min_n: int) -> list[str]:
    """Agents whose role changed at the end of the log: one of their keys (``b…|agent``,
    ``c…|agent`` in ``agent_keys``) is held (nearly) only by the newest workflows.

    A release that moves an agent (a tester that ran once at the end now runs in the coder
    loop; a new planner) leaves keys that only the newest workflows reach, on the new release's
    scale, beside the agent's old keys, which still hold the old role's remaining work. Mixed,
    they order sessions worse than the position alone (docs/workflow-paths.md, "A release that
    moves an agent"). The check: the newest :data:`RECENT_SHARE` of the type's workflows by start
    (the forward rule's last block) hold ``m`` of a key's ``n`` workflows; under a log whose
    roles do not change ``m ~ Binomial(n, share)``; a key the newest hold nearly alone
    (``m ≥`` :data:`ROLE_MAJORITY` ``· n``) with ``P(X ≥ m)`` below :data:`ROLE_ALPHA` over the
    number of keys tested marks its agent. A release that the training side already holds in
    numbers (its keys reached by older workflows too, as in a random split, whose future is the
    mix the table holds) is left to the table. Needs arrival times and
    ``min_n`` workflows in the newest share; sorted agent names."""
    if "t_arrival" not in df or df["t_arrival"].isna().any() or not agent_keys:
        return []
    wf, names = pd.factorize(df["workflow_id"])
    start = pd.Series(df["t_arrival"].to_numpy(dtype=float)).groupby(wf).min()
    order = pd.DataFrame({"t": start.to_numpy(), "wf": np.asarray(names)}).sort_values(["t", "wf"], kind="stable")
    n_new = int(round(RECENT_SHARE * len(order)))
    if n_new < min_n or n_new >= len(order):
        return []
    newest = np.zeros(len(order), dtype=bool)
    newest[order.index[-n_new:]] = True
    share = n_new / len(order)
    agent, agents = pd.factorize(df["agent_id"])
    held: dict[str, tuple[int, int]] = {}
    n_a, n_w = len(agents), len(order)
    for col, prefix in (("bucket", "b"), ("k", "c")):      # the keys' workflows, each counted once
        x = df[col].to_numpy(dtype=np.int64)
        cell_wf = np.sort((x * n_a + agent) * n_w + wf)
        cell, w = np.divmod(cell_wf[np.r_[True, cell_wf[1:] != cell_wf[:-1]]], n_w)
        first = np.flatnonzero(np.r_[True, cell[1:] != cell[:-1]])     # cell is sorted
        counts = np.diff(np.r_[first, len(cell)])
        for c, n, m in zip(cell[first], counts, np.add.reduceat(newest[w].astype(np.int64), first)):
            if (label := f"{prefix}{int(c // n_a)}|{agents[c % n_a]}") in agent_keys:
                held[label] = (int(n), int(m))
    p = {k: float(binom.sf(m - 1, n, share)) for k, (n, m) in held.items()}
    return sorted({k.split("|", 1)[1] for k, v in p.items()
                   if v < ROLE_ALPHA / len(p) and held[k][1] >= ROLE_MAJORITY * held[k][0]})


def _expected_so_far(df: pd.DataFrame, agent_mean: dict[str, float], mean_out: float) -> np.ndarray:
    """``E_i``: Σ over the calls before ``i`` of their agents' training mean output."""
    m = df["agent_id"].map(agent_mean).fillna(mean_out).to_numpy(dtype=float)
    s = pd.Series(m).groupby([df["workflow_type_id"].to_numpy(), df["workflow_id"].to_numpy()],
                             sort=False).cumsum().to_numpy()
    return s - m


def predict_frame(entry: dict[str, Any], df: pd.DataFrame, level: str, point: str,
                  beta: float, kappa: float, tie_break: str | None = None) -> np.ndarray:
    """``R̂`` of every call of ``df`` (one workflow type) from a type entry (vectorised form of
    :meth:`RemainingTokensTable.predict`; a test checks that both agree)."""
    value = _predict_frame(entry, df, level, point, beta, kappa)
    if tie_break != "index":
        return value
    finer = predict_frame(entry, df, "index", "mean", 0.0, 0.0)
    return tie_broken(value, finer)


def _predict_frame(entry: dict[str, Any], df: pd.DataFrame, level: str, point: str,
                   beta: float, kappa: float) -> np.ndarray:
    table = RemainingTokensTable({"workflow_types": {"_": entry},
                                  "params": {"_": {"level": level, "point": point, "beta": beta,
                                                   "kappa": kappa}}})
    col = 2 if point == "p50" else 1
    none = np.full(len(df), None, dtype=object)
    agents = df["agent_id"].to_numpy() if level in ("agent", "agent_calls") else none
    counts = df["k"].to_numpy() if level == "agent_calls" else np.full(len(df), -1)
    elapsed = df["e"].to_numpy() if level == "elapsed" else np.full(len(df), -1)
    index = df["i"].to_numpy() if level == "index" else np.full(len(df), -1)
    keys = pd.MultiIndex.from_arrays([df["bucket"].to_numpy(), agents, counts, elapsed, index])
    codes, uniques = pd.factorize(keys)
    values = np.array([table.lookup("_", int(b), a, None if k < 0 else int(k), None if e < 0 else int(e),
                                    None if i < 0 else int(i))[col]
                       for b, a, k, e, i in uniques], dtype=float)
    base = values[codes]
    if beta == 0:
        return base
    return base * session_factor(entry, df, _expected_so_far(df, entry["agent_mean"], entry["mean_out"]),
                                 beta, kappa)


def session_factor(entry: dict[str, Any], df: pd.DataFrame, expected: np.ndarray, beta: float,
                   kappa: float) -> np.ndarray:
    """``((S + κ·m̄) / (E + κ·m̄))^β`` per call (``expected`` = ``E``, :func:`_expected_so_far`)."""
    prior = kappa * entry["mean_out"]
    return ((df["S"].to_numpy() + prior) / np.maximum(expected + prior, 1e-9)) ** beta


def _log_err(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.abs(np.log1p(np.maximum(pred, 0.0)) - np.log1p(y))


class RemainingTokens(RemainingTokensTable, BaseEstimator):
    """Remaining output tokens per call, chosen per workflow type by CV (module doc).

    Parameters
    ----------
    cv_folds : folds of the cross-validation by workflow (types with fewer workflows than
        ``2 · cv_folds`` serve the simplest candidate without selection).
    min_n : workflows a ``(bucket, agent)`` key needs to be served (else it backs off).
    random_state : seed of the fold assignment (and of the selection sample).
    max_select_workflows : the selection's cross-validation runs on at most this many workflows
        of a type (a seeded sample; thousands of workflows decide between these few candidates
        as well as millions do); the served table is fit on every workflow.
    forward_origins : rolling origins (shares of a type's workflows by start time) of the forward
        rule (:meth:`_forward`; needs ``t_arrival``); empty: the cross-validated choice serves.

    Fitted attributes: ``workflow_types_`` (type → table entry), ``params_`` (type → chosen
    candidate), ``selection_`` (type → CV errors per candidate), ``baselines_``.
    """

    def __init__(self, cv_folds: int = 5, min_n: int = 5, random_state: int = 0,
                 max_select_workflows: int = 2000,
                 forward_origins: tuple[float, ...] = FORWARD_ORIGINS) -> None:
        self.cv_folds = cv_folds
        self.min_n = min_n
        self.random_state = random_state
        self.max_select_workflows = max_select_workflows
        self.forward_origins = forward_origins

    # ------------------------------------------------------------------ fit
    def fit(self, calls: pd.DataFrame) -> "RemainingTokens":
        """Fit on ``calls`` (``workflow_type_id, workflow_id, agent_id, output_tokens`` in call
        order within each workflow; an optional ``group_id`` column makes the selection folds
        keep each group's workflows together: a task run in several workflows)."""
        df = session_frame(calls)
        self.workflow_types_: dict[str, Any] = {}
        self.params_: dict[str, dict[str, Any]] = {}
        self.selection_: dict[str, Any] = {}
        self.baselines_: dict[str, Any] = {}
        for wt, g in df.groupby("workflow_type_id", sort=True):
            g = g.reset_index(drop=True)
            entry = fit_type_table(g, self.min_n)
            params, self.selection_[str(wt)], cv_parts = self._select(g)
            # equal figures ordered by calls done → mean residual life (the exact-index keys)
            params = {**params, "tie_break": "index"}
            forward = self._forward(g, params, cv_parts)
            if forward is not None:
                self.selection_[str(wt)]["forward"] = forward
                if forward["served"] != "fitted":     # a naive baseline ranks as well forward in time
                    params = {"level": "baseline", "baseline": forward["served"]}
            self.params_[str(wt)] = params
            self.workflow_types_[str(wt)] = entry
            self.baselines_[str(wt)] = fit_baselines(g)
        RemainingTokensTable.__init__(self, self.to_dict())
        return self

    def _select(self, g: pd.DataFrame) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]] | None]:
        """The cross-validated candidate of one type, its record, and the CV folds' held-out pairs
        of it and the baselines (:func:`held_out_pairs`; None without arrival times or forward
        origins): the Occam step of :meth:`_forward` reads them."""
        simplest = {"level": "position", "point": "p50", "beta": 0.0, "kappa": 0.0}
        wfs = g["workflow_id"].unique()
        if len(wfs) < 2 * self.cv_folds:
            return simplest, {"reason": f"{len(wfs)} workflows: too few to validate"}, None
        if "group_id" in g and (n_groups := g["group_id"].nunique()) < 2 * self.cv_folds:
            return simplest, {"reason": f"{n_groups} groups of workflows: too few to validate"}, None
        rng = np.random.default_rng(self.random_state)
        if len(wfs) > self.max_select_workflows:
            wfs = np.sort(rng.choice(wfs, self.max_select_workflows, replace=False))
            g = g[g["workflow_id"].isin(set(wfs))].reset_index(drop=True)
        fold = group_folds(g["group_id"] if "group_id" in g else g["workflow_id"], self.cv_folds, rng)
        levels = LEVELS if (g["e"] >= 0).any() else tuple(lv for lv in LEVELS if lv != "elapsed")
        cands = [{"level": lv, "point": pt, "beta": b, "kappa": k}
                 for lv in levels for pt in POINTS for b, k in FACTORS]
        errs = np.zeros((len(cands), len(g)))
        y = g["R"].to_numpy()
        entries = []
        for f in range(self.cv_folds):
            test = fold == f
            entry = fit_type_table(g[~test], self.min_n)
            entries.append(entry)
            part = g[test]
            expected = _expected_so_far(part, entry["agent_mean"], entry["mean_out"])
            factors = {(b, k): session_factor(entry, part, expected, b, k) for b, k in FACTORS if b}
            bases = {(lv, pt): predict_frame(entry, part, lv, pt, 0.0, 0.0) for lv in levels for pt in POINTS}
            for c, cand in enumerate(cands):
                pred = bases[cand["level"], cand["point"]]
                if cand["beta"]:
                    pred = pred * factors[cand["beta"], cand["kappa"]]
                errs[c, test] = _log_err(pred, y[test])
        # per-workflow mean error: the unit of the paired comparison
        wf_codes = pd.factorize(g["workflow_id"])[0]
        counts = np.bincount(wf_codes)
        per_wf = np.stack([np.bincount(wf_codes, weights=e) / counts for e in errs])
        mean = per_wf.mean(axis=1)
        base = cands.index(simplest)
        best = int(np.argmin(mean))
        diff = per_wf[base] - per_wf[best]
        clusters = None
        if "group_id" in g:   # the SE over groups: a task's trials move together
            wf_group = g.groupby(wf_codes)["group_id"].first().to_numpy()
            codes = pd.factorize(wf_group)[0]
            clusters = np.zeros((codes.max() + 1, len(diff)))
            clusters[codes, np.arange(len(diff))] = 1.0
        gain, se = paired_se(diff, np.ones(len(diff)), clusters)
        chosen = best if gain > se else base
        cv_parts = None
        if self.forward_origins and "t_arrival" in g and not g["t_arrival"].isna().any():
            # the same folds scored on the ranking figure: the Occam step's evidence (:meth:`_forward`)
            params = {**cands[chosen], "tie_break": "index"}
            unit = (g["group_id"] if "group_id" in g else g["workflow_id"]).to_numpy()
            folds = [held_out_pairs(entries[f], fit_baselines(g[fold != f]), g[fold == f].reset_index(drop=True),
                                    params, unit[fold == f]) for f in range(self.cv_folds)]
            cv_parts = [p for p in folds if p is not None]
        return cands[chosen], {
            "metric": "mean |log1p(R̂) − log1p(R)| per workflow, CV by workflow",
            "folds": self.cv_folds, "workflows": int(len(wfs)),
            "simplest_error": float(mean[base]), "best_error": float(mean[best]),
            "best": cands[best], "paired_se": se,
            "se_over": f"{len(clusters)} groups" if clusters is not None else f"{len(diff)} workflows",
            "rule": "best if it beats the simplest by more than one standard error"}, cv_parts

    def _forward(self, g: pd.DataFrame, fitted: dict[str, Any],
                 cv_parts: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
        """The served candidate among :data:`FORWARD_CANDIDATES`, scored forward in time.

        Rolling origin on the training side: at each origin (a share of the type's workflows by
        start time, :attr:`forward_origins`) the table and the baselines are fit on the
        workflows started before it (the cross-validated level, point and factor kept) and rank
        the workflows up to the next origin (the last block: up to the newest). The figure is the
        C-index over pairs of sessions active at the same time, as ``profiler eval`` scores it
        (:func:`c_index_pairs`), not the log error the cross-validation minimises: the priority
        policy ranks waiting sessions by this figure, and a candidate closer in log error can
        order them worse. The pairs of all blocks are pooled; the difference of two candidates
        has the delete-one-session jackknife error (:func:`jackknife_diff`; delete-one-group with a
        ``group_id``: a task's trials move together). The cross-validated
        candidate serves unless it is behind the forward best beyond one standard error (or scores
        every pair exactly as a baseline does: then the simpler serves); then the
        simplest baseline within one standard error of the best (``forward_served``).

        Then the Occam step: that candidate serves only if it is ahead of each simpler one
        (position median, then ``mrl``) by more than :data:`OCCAM_SE` jackknife standard errors
        on every held-out pair the training side has, these forward blocks pooled with the
        cross-validation's folds (``cv_parts``, :meth:`_select`); else the simplest it does not
        beat so serves. Where the training side cannot tell the candidates apart, the simplest
        serves (docs/workflow-paths.md, "The simplest unless the richer is ahead"). ``{served,
        forward_served, workflows, blocks, pairing, c_index: {candidate: C}, vs_best: {candidate:
        [C − C_best, se]}, occam: {vs_simpler: {candidate: [C_served − C, se]}, …}}``; None without
        arrival times, origins or :data:`FORWARD_MIN_WORKFLOWS` workflows."""
        if not self.forward_origins or "t_arrival" not in g or g["t_arrival"].isna().any():
            return None
        starts = g.groupby("workflow_id", sort=False)["t_arrival"].min()
        n_wf = len(starts)
        if n_wf < FORWARD_MIN_WORKFLOWS:
            return None
        if n_wf > self.max_select_workflows:     # a seeded sample over the whole span
            keep = np.random.default_rng(self.random_state).choice(n_wf, self.max_select_workflows, replace=False)
            starts = starts.iloc[np.sort(keep)]
            g = g[g["workflow_id"].isin(set(starts.index))].reset_index(drop=True)
            n_wf = len(starts)
        order = pd.DataFrame({"wf": starts.index, "t": starts.to_numpy()}).sort_values(["t", "wf"], kind="stable")
        rank = g["workflow_id"].map(pd.Series(np.arange(n_wf), index=order["wf"].to_numpy())).to_numpy()
        cuts = sorted({int(round(f * n_wf)) for f in self.forward_origins} | {n_wf})
        # the jackknife's unit: a workflow, or its group (a task's trials move together)
        unit = (g["group_id"] if "group_id" in g else g["workflow_id"]).to_numpy()
        parts, pairing = [], set()
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            if lo < 2 or hi <= lo:
                continue
            rows = (rank >= lo) & (rank < hi)
            past, block = g[rank < lo], g[rows].reset_index(drop=True)
            got = held_out_pairs(fit_type_table(past, self.min_n), fit_baselines(past), block, fitted, unit[rows])
            if got is not None:
                parts.append(got)
                pairing.add(got["pairing"])
        if not parts:
            return None
        pooled, n_units = pool_pairs(parts)
        cs = {c: float(p["score"].mean()) if len(p["score"]) else float("nan") for c, p in pooled.items()}
        best = max(FORWARD_CANDIDATES, key=lambda c: (cs[c], -FORWARD_CANDIDATES.index(c)))
        vs = {c: list(jackknife_diff(pooled[c], pooled[best], n_units) or (cs[c] - cs[best], 0.0))
              for c in FORWARD_CANDIDATES}
        fitted_vs = {c: list(jackknife_diff(pooled["fitted"], pooled[c], n_units) or (0.0, 0.0))
                     for c in FORWARD_CANDIDATES if c != "fitted"}
        ahead = [c for c in FORWARD_CANDIDATES if vs[c][0] >= -vs[c][1]]      # within one se of the best
        # an exact tie (the same score on every pair) goes to the simpler: nothing tells them apart
        same = [c for c in FORWARD_CANDIDATES if np.array_equal(pooled[c]["score"], pooled["fitted"]["score"])]
        forward_served = same[0] if "fitted" in ahead else ahead[0]
        # Occam: the richer candidate serves only when every held-out pair the training side has
        # (these forward blocks and the cross-validation's folds) puts it ahead of each simpler one
        # by more than OCCAM_SE standard errors
        evidence, n_ev = pool_pairs(parts + (cv_parts or []))
        occam = {c: [float(v) for v in jackknife_diff(evidence[forward_served], evidence[c], n_ev) or (0.0, 0.0)]
                 for c in FORWARD_CANDIDATES[:FORWARD_CANDIDATES.index(forward_served)]}
        served = next((c for c, (d, se) in occam.items() if d <= OCCAM_SE * se), forward_served)
        return {"served": served, "forward_served": forward_served, "fitted": fitted, "workflows": int(n_wf),
                "blocks": len(parts), "pairing": sorted(pairing),
                "pairs": int(len(pooled["fitted"]["score"])), "metric": "C-index over concurrent sessions",
                "c_index": cs, "vs_best": vs, "fitted_vs": fitted_vs,
                "occam": {"evidence": "forward blocks" + (" and CV folds" if cv_parts else ""),
                          "pairs": int(len(evidence["fitted"]["score"])),
                          "margin_se": OCCAM_SE, "vs_simpler": occam},
                "rule": "fitted unless behind the best beyond one jackknife se (or tied with a baseline on "
                        "every pair: the simpler); then the simplest (position median, mrl) within one se of the best; "
                        f"then a richer candidate only if ahead of each simpler one by more than {OCCAM_SE:g} se "
                        "on the forward and CV pairs pooled"}

    # ------------------------------------------------------------- artifact
    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "workflow_types": self.workflow_types_, "params": self.params_,
                "selection": self.selection_, "baselines": self.baselines_,
                "fit": {"cv_folds": self.cv_folds, "min_n": self.min_n}}


def fit_baselines(g: pd.DataFrame) -> dict[str, Any]:
    """The naive remaining-work predictors of one type (module doc), keyed by call index."""
    pos_median = {str(int(b)): float(v) for b, v in g.groupby("bucket")["R"].median().items()}
    mrl = {str(int(i)): float(v) for i, v in g.groupby("i")["R"].mean().items()}
    return {"position_median": pos_median, "mrl": mrl}


def held_out_pairs(entry: dict[str, Any], base: dict[str, Any], block: pd.DataFrame, fitted: dict[str, Any],
                   unit: np.ndarray) -> dict[str, Any] | None:
    """The scored pairs of every :data:`FORWARD_CANDIDATES` member on ``block`` (held-out calls of one
    type, one frame of :func:`session_frame`), from a table ``entry`` and baselines ``base`` fit
    without it: ``{candidate: {"a", "b", "score"}, "pairing"}``, ``a`` and ``b`` the pair's units
    (``unit``: per row of ``block``, a workflow or group label). None without a pair for ``fitted``."""
    preds = {"fitted": predict_frame(entry, block, fitted["level"], fitted["point"], fitted["beta"],
                                     fitted["kappa"], fitted.get("tie_break")),
             **{name: baseline_figures(base[name], block["bucket" if key == "bucket" else "i"].to_numpy())
                for name, key in BASELINE_KEYS.items()}}
    wf_code = pd.factorize(block["workflow_id"])[0]
    wf_unit = pd.Series(np.asarray(unit, dtype=object)).groupby(wf_code).first().to_numpy()
    t = block["t_arrival"].to_numpy(dtype=float)
    end = np.fmax((block["t_finish"] if "t_finish" in block else block["t_arrival"]).to_numpy(dtype=float), t)
    cidx, how = c_index_pairs(preds, block["R"].to_numpy(), wf_code, t, pd.Series(end).groupby(wf_code).max().to_numpy(),
                              pd.Series(t).groupby(wf_code).min().to_numpy(), "fitted")
    if not cidx["fitted"][1]:
        return None
    return {"pairing": how, **{c: {"a": wf_unit[cidx[c][2]["a"]], "b": wf_unit[cidx[c][2]["b"]],
                                   "score": cidx[c][2]["score"]} for c in FORWARD_CANDIDATES}}


def pool_pairs(parts: list[dict[str, Any]]) -> tuple[dict[str, dict[str, np.ndarray]], int]:
    """The pairs of several :func:`held_out_pairs` results pooled per candidate, their unit labels
    coded ``0 … n−1`` over all of them (a unit in several parts is one unit of the jackknife);
    ``(pooled, n)``."""
    labels = np.concatenate([np.concatenate([p[c][k] for c in FORWARD_CANDIDATES for k in ("a", "b")])
                             for p in parts]) if parts else np.zeros(0, dtype=object)
    codes, uniques = pd.factorize(pd.Series(labels, dtype=object))
    out: dict[str, dict[str, list[np.ndarray]]] = {c: {"a": [], "b": [], "score": []} for c in FORWARD_CANDIDATES}
    pos = 0
    for p in parts:
        for c in FORWARD_CANDIDATES:
            for k in ("a", "b"):
                n = len(p[c][k])
                out[c][k].append(codes[pos:pos + n])
                pos += n
            out[c]["score"].append(p[c]["score"])
    pooled = {c: {k: (np.concatenate(v[k]) if v[k] else np.zeros(0, dtype=int if k != "score" else float))
                  for k in ("a", "b", "score")} for c, v in out.items()}
    return pooled, len(uniques)


# ----------------------------------------------------- the ranking figure (C-index)
#: Other active sessions each held-out call is compared with (sampled, seeded).
PAIRS_PER_CALL = 20
#: Fewer concurrent pairs than this (logs of runs done one at a time): pair on aligned starts.
MIN_PAIRS = 100


def concordance_pairs(preds: dict[str, np.ndarray], truth: np.ndarray, wf_code: np.ndarray,
                      t_arrival: np.ndarray, wf_end: np.ndarray,
                      seed: int = 0) -> dict[str, tuple[float | None, int, dict[str, np.ndarray]]]:
    """The C-index of each prediction over pairs of sessions active at the same time: at every
    call's arrival the arriving session against up to :data:`PAIRS_PER_CALL` other sessions then
    active (first call arrived, ``wf_end`` not passed), each at its latest call; ties of a
    prediction score ½, ties of ``truth`` are skipped (``scoring.remaining_eval``'s module doc).
    ``(C, pairs, {"a", "b", "score"})`` per name, ``a`` and ``b`` the two sessions (``wf_code``)
    of every scored pair and ``score`` its 0, ½ or 1 (what :func:`jackknife_diff` needs)."""
    rng = np.random.default_rng(seed)
    order = np.argsort(t_arrival, kind="stable")
    latest: dict[int, int] = {}            # session -> row of its latest call so far
    pairs_a: list[int] = []
    pairs_b: list[int] = []
    for row in order:
        t, wf = t_arrival[row], wf_code[row]
        latest[wf] = row
        latest = {w: r for w, r in latest.items() if wf_end[w] >= t}   # finished sessions leave
        others = [w for w in latest if w != wf]
        if len(others) > PAIRS_PER_CALL:
            others = list(rng.choice(others, PAIRS_PER_CALL, replace=False))
        pairs_a.extend([row] * len(others))
        pairs_b.extend(latest[w] for w in others)
    a, b = np.array(pairs_a, dtype=int), np.array(pairs_b, dtype=int)
    out: dict[str, tuple[float | None, int, dict[str, np.ndarray]]] = {}
    empty = {"a": np.zeros(0, dtype=int), "b": np.zeros(0, dtype=int), "score": np.zeros(0)}
    for name, p in preds.items():
        if len(a) == 0:
            out[name] = (None, 0, empty)
            continue
        ok = ~np.isnan(p[a]) & ~np.isnan(p[b]) & (truth[a] != truth[b])
        if not ok.any():
            out[name] = (None, 0, empty)
            continue
        sign_true = np.sign(truth[a][ok] - truth[b][ok])
        sign_pred = np.sign(p[a][ok] - p[b][ok])
        score = np.where(sign_pred == 0, 0.5, (sign_pred == sign_true).astype(float))
        out[name] = (float(score.mean()), int(ok.sum()),
                     {"a": wf_code[a[ok]], "b": wf_code[b[ok]], "score": score})
    return out


def jackknife_diff(ours: dict[str, np.ndarray], other: dict[str, np.ndarray],
                   n_sessions: int) -> tuple[float, float] | None:
    """``(C_ours − C_other, its standard error)``, the error by the delete-one-session jackknife:
    every held-out session (workflow) is left out in turn with all the pairs it is in, both
    C-indices recomputed, and ``se² = (W−1)/W · Σ_w (D_−w − D̄)²`` over the ``W`` sessions in a
    pair. Pairs that share a session are not independent; the jackknife over sessions accounts
    for that, where a binomial error over pairs would be far too small. None without pairs."""
    def loo(pairs: dict[str, np.ndarray]) -> tuple[float, np.ndarray]:
        score, a, b = pairs["score"], pairs["a"], pairs["b"]
        total, n = float(score.sum()), float(len(score))
        s_w = np.bincount(a, score, n_sessions) + np.bincount(b, score, n_sessions)
        n_w = np.bincount(a, minlength=n_sessions) + np.bincount(b, minlength=n_sessions)
        left = n - n_w
        return total / n, np.where(left > 0, (total - s_w) / np.maximum(left, 1), np.nan)
    if len(ours["score"]) == 0 or len(other["score"]) == 0:
        return None
    c1, l1 = loo(ours)
    c2, l2 = loo(other)
    seen = np.zeros(n_sessions, dtype=bool)
    for pairs in (ours, other):
        seen[pairs["a"]] = seen[pairs["b"]] = True
    d = (l1 - l2)[seen & ~np.isnan(l1) & ~np.isnan(l2)]
    w = len(d)
    if w < 2:
        return c1 - c2, 0.0
    return c1 - c2, float(np.sqrt((w - 1) / w * np.sum((d - d.mean()) ** 2)))


def c_index_pairs(preds: dict[str, np.ndarray], truth: np.ndarray, wf_code: np.ndarray, t_arrival: np.ndarray,
                  wf_end: np.ndarray, wf_start: np.ndarray, key: str,
                  aligned: dict[str, np.ndarray] | None = None) -> tuple[dict[str, Any], str]:
    """:func:`concordance_pairs` over pairs of sessions active at the same time; when ``key``'s
    prediction has fewer than :data:`MIN_PAIRS` such pairs (sessions that never overlapped: runs
    done one at a time), over pairs as if every session had started together (``aligned``
    replaces predictions that change then). ``(C-indices, "concurrent" | "aligned_start")``."""
    cidx = concordance_pairs(preds, truth, wf_code, t_arrival, wf_end)
    if cidx[key][1] >= MIN_PAIRS:
        return cidx, "concurrent"
    start = wf_start[wf_code]
    return (concordance_pairs({**preds, **(aligned or {})}, truth, wf_code, t_arrival - start, wf_end - wf_start),
            "aligned_start")
