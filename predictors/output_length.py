"""Output-length intervals per (workflow type, agent), each chosen by validation.

For a target coverage ``1 − α`` (default 0.99) each agent gets a band ``[lo, hi]`` such that a
new call of that agent produces between ``lo`` and ``hi`` tokens with probability ≥ 1 − α.

**Which band.** Every node of the hierarchy (global → workflow type → agent) fits several
candidates — split-conformal order statistics, their small-n finite-sample correction, the plain
empirical quantiles, a lognormal prediction interval, the parent level's band and, for agents, a
conformalized quantile tree on the previous output, input tokens and call index — and keeps the
narrowest whose coverage on held-out workflows (K-fold *by workflow*) reaches nominal
(:mod:`predictors.band_selection` has the candidates, the tolerance and the rule;
:mod:`predictors.quantile_tree` the conditional model). No call-count threshold decides: a band
is wider than its parent's only when validation rejects the parent. Each entry records what was
chosen and why (``selection``: held-out coverage and width of every candidate). Then one
miscoverage budget is shared within each workflow type (:meth:`OutputLengthIntervals._allocate`):
the type's pooled held-out coverage is held to nominal and spent where its bands are widest. An agent that
cannot be validated (fewer than 3 calls, or all in one workflow) is *degenerate*: it is served
its parent's entry and ``fallback_reason`` says why.

**Ceiling.** No band end and no U(α) exceeds ``ceiling`` = min(``max_output_tokens``,
⌈2 · max observed length⌉) (:data:`predictors.band_selection.CEILING_FACTOR`; never below the
largest observed length).

**One-sided upper bounds at any risk α (for capacity planning).** A router that checks a
union bound over n requests needs each request's bound at a risk that fits its budget, e.g.
α_i = ε / n, so one fixed quantile is not enough. Every fitted entry therefore also stores

* ``upper`` — a table ``{α: U(α)}`` over :data:`UPPER_ALPHAS` (0.2 … 1e-5), where U(α) is the
  split-conformal order statistic at rank ⌈(n+1)(1−α)⌉ of the entry's n lengths
  (P(y_new ≤ y_(k)) ≥ 1 − α for exchangeable data);
* ``certified_alpha`` = 1/(n+1): the smallest α that rank exists for. Below it nothing in the
  data certifies a bound, so U(α) is the ``ceiling`` (no lognormal extrapolation);
* ``log_mu``, ``log_sigma`` — mean and standard deviation (ddof 1) of ln(max(y, 1)), for reference.

:meth:`OutputLengthIntervals.upper_bound` reads U(α) for any α: the table entry of the largest
tabulated α ≤ α (a step function, never below the exact bound at α), the ceiling below the
table or below ``certified_alpha``. A profile written before ``certified_alpha`` existed is served
as before: the table, then the lognormal tail from ``log_mu``/``log_sigma``; without a table,
from the agent's ``mean`` and ``cv`` (lognormal with σ² = ln(1 + cv²), μ = ln(mean) − σ²/2), and
without those from the band's ``hi``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.base import BaseEstimator

from predictors import band_selection as bs
from predictors.band_selection import GLOBAL_OPTION, BudgetOption
from predictors import quantile_tree as qt
from predictors.quantile_tree import COND_FEATURES
from predictors.served import (_MAX_EXP, UPPER_ALPHAS, OutputBands, band_upper_bound, cond_bands,
                               lognormal_upper)
from store.folds import group_folds

__all__ = ["COND_FEATURES", "UPPER_ALPHAS", "OutputLengthIntervals", "band_upper_bound",
           "conformal_band", "lognormal_band", "log_moments", "lognormal_upper",
           "upper_prediction_bound", "upper_table"]



def conformal_band(y: np.ndarray, coverage: float) -> tuple[int, int, bool]:
    """(lo, hi, exact): split-conformal marginal band of ``y`` at ``coverage``.

    ``exact`` is False when n is too small for the guarantee (the band is then the sample range).
    """
    y = np.sort(np.asarray(y, dtype=float))
    n = len(y)
    alpha = 1.0 - coverage
    k_lo = math.floor((n + 1) * alpha / 2)       # 1-based rank of the lower end
    k_hi = math.ceil((n + 1) * (1 - alpha / 2))  # 1-based rank of the upper end
    exact = k_lo >= 1 and k_hi <= n
    lo = y[max(k_lo, 1) - 1]
    hi = y[min(k_hi, n) - 1]
    return int(math.floor(lo)), int(math.ceil(hi)), exact


def lognormal_band(y: np.ndarray, coverage: float) -> tuple[int, int]:
    """(lo, hi): prediction interval of a new value when ln y is normal (t quantile, n ≥ 3)."""
    mu, sigma = log_moments(y)
    n = len(y)
    t = stats.t.ppf(1 - (1 - coverage) / 2, df=n - 1)
    half = t * sigma * math.sqrt(1 + 1 / n)
    return (int(math.floor(math.exp(min(mu - half, _MAX_EXP)))),
            int(math.ceil(math.exp(min(mu + half, _MAX_EXP)))))


def log_moments(y: np.ndarray) -> tuple[float, float]:
    """(μ̂, σ̂): mean and standard deviation (ddof 1; 0 for n < 2) of ln(max(y, 1))."""
    z = np.log(np.maximum(np.asarray(y, dtype=float), 1.0))
    if len(z) == 0:
        return 0.0, 0.0
    return float(z.mean()), float(z.std(ddof=1)) if len(z) > 1 else 0.0


def upper_prediction_bound(y: np.ndarray, alpha: float, ceiling: int | None = None) -> int:
    """U(α): one-sided (1 − α) prediction bound of a new value of ``y``.

    The conformal order statistic at rank ⌈(n+1)(1−α)⌉ when it exists (α ≥ 1/(n+1)), else the
    ceiling (default :func:`predictors.band_selection.ceiling_of` ``(y)``).
    """
    y = np.asarray(y, dtype=float)
    n = len(y)
    k = math.ceil((n + 1) * (1 - alpha))
    if 1 <= k <= n:
        return int(math.ceil(np.partition(y, k - 1)[k - 1]))
    return int(bs.ceiling_of(y) if ceiling is None else ceiling)


def upper_table(y: np.ndarray, ceiling: int, alphas: Sequence[float] = UPPER_ALPHAS) -> dict[str, int]:
    """``{str(α): U(α)}`` over ``alphas``: order statistics where certified, the ceiling below."""
    y = np.asarray(y, dtype=float)
    n = len(y)
    ks = {a: math.ceil((n + 1) * (1 - a)) for a in alphas}
    inside = sorted({k - 1 for k in ks.values() if 1 <= k <= n})
    part = np.partition(y, inside) if inside else y
    return {repr(float(a)): (min(int(math.ceil(part[k - 1])), int(ceiling)) if 1 <= k <= n else int(ceiling))
            for a, k in sorted(ks.items(), reverse=True)}


def _clean(y: np.ndarray) -> np.ndarray:
    """Lengths as non-negative finite floats (a missing or negative length counts as 0)."""
    y = np.asarray(y, dtype=float)
    return np.where(np.isfinite(y), np.maximum(y, 0.0), 0.0)


def _forward_kept(selection: dict[str, Any]) -> bool:
    """Whether the forward rule changed an agent's choice (:func:`band_selection.choose`): the
    shared budget then keeps it (its other options are scored on shuffled folds only, where the
    drift the forward blocks saw is averaged away)."""
    return "forward-in-time" in str(selection.get("reason", ""))


class _TypeBudgetInput(NamedTuple):
    """One workflow type's share of the shared-budget search (:meth:`OutputLengthIntervals._allocate`)."""
    #: its fitted entry and its served band per training fold
    entry: dict[str, Any]
    folds: dict[int, tuple[float, float]]
    #: its calls' lengths and folds
    y: np.ndarray
    fold: np.ndarray
    #: its agents' fitted entries (updated in place by the allocation)
    per_agent: dict[str, dict[str, Any]]
    #: each agent's (lengths, folds)
    data: dict[str, tuple[np.ndarray, np.ndarray]]


@dataclass(slots=True)
class _BudgetGroup:
    """Agents that take one option together: one agent with its own band, or the degenerate
    agents of a workflow type (served their type's band)."""
    agents: list[str]
    own: bool
    #: option -> (held-out misses, held-out width sum)
    menu: dict[BudgetOption, tuple[int, float]]
    #: the lengths an order-statistic option is computed from
    y: np.ndarray
    #: held-out calls of the group
    n: int


#: The call columns :func:`predictors.quantile_tree.features` reads.
_FEATURE_COLUMNS = ("prev_agent_output_tokens", "input_tokens", "agent_call_index")


def _workflow_keys(calls: pd.DataFrame) -> pd.Series:
    """One text key per call naming its workflow: ``workflow_type_id`` and ``workflow_id``
    joined by ``\\x1f`` (ids may repeat across types)."""
    return calls["workflow_type_id"].astype(str) + "\x1f" + calls["workflow_id"].astype(str)


class OutputLengthIntervals(OutputBands, BaseEstimator):
    """Per-(workflow type, agent) output-length bands, each chosen by K-fold CV by workflow.

    Parameters
    ----------
    coverage : target probability that the true length falls in the band.
    min_calls : unused by the fit since bands are chosen by validation; read only to serve an
        unseen agent from a profile written before (its workflow type's band when that type had
        at least this many calls).
    conditional : try the conformalized quantile tree for agents.
    cond_min_calls : fewest calls of an agent for the quantile tree to be tried (it needs a few
        leaves of ≥ 5 calls on every training fold).
    cond_max_samples : cap on the rows a quantile tree is fit on per fold (speed).
    n_folds : folds of the cross-validation by workflow.
    max_output_tokens : a hard cap on any length (the request's ``max_tokens`` or the context
        limit) when known; else the ceiling is twice the largest observed length.
    random_state : seed of the fold assignment and the subsamples.
    forward : also score the marginal candidates forward in time on the training calls (rolling
        origin, :data:`band_selection.FORWARD_ORIGINS`; needs ``t_arrival``) and prefer, among
        those held-out validation accepts, the ones that hold forward too
        (:func:`band_selection.choose`). Off by default: measured, it widened the random split's
        bands by 15–22 % (docs/output-length.md).
    shared_budget : after the per-agent choice, share one miscoverage budget within each
        workflow type (:meth:`_allocate`); False keeps every agent at its own 1 − α.

    Fitted attributes: ``global_``, ``workflow_types_``, ``agents_`` (dicts of entries),
    ``n_conditional_`` (agents served by the conditional model). Serving (``lookup``,
    ``predict_band``, ``upper_bound(s)``, ``from_dict``) is inherited from
    :class:`predictors.served.OutputBands`.
    """

    def __init__(self, coverage: float = 0.99, min_calls: int = 50, conditional: bool = True,
                 cond_min_calls: int = 30, cond_max_samples: int = 3000, n_folds: int = 5,
                 max_output_tokens: int | None = None, random_state: int = 0,
                 shared_budget: bool = True, forward: bool = False):
        self.coverage = coverage
        self.forward = forward
        self.shared_budget = shared_budget
        self.min_calls = min_calls
        self.conditional = conditional
        self.cond_min_calls = cond_min_calls
        self.cond_max_samples = cond_max_samples
        self.n_folds = n_folds
        self.max_output_tokens = max_output_tokens
        self.random_state = random_state

    # ---------------------------------------------------------------- fitting
    def fit(self, calls: pd.DataFrame) -> "OutputLengthIntervals":
        """``calls``: one row per call with workflow_type_id, workflow_id, agent_id,
        output_tokens, input_tokens, prev_agent_output_tokens, agent_call_index; an optional
        ``group_id`` column makes the validation folds keep each group's workflows together
        (``profiler fit --group-by``: a task run in several workflows)."""
        calls = calls.reset_index(drop=True)
        workflows = _workflow_keys(calls) if len(calls) else None   # built once, read twice
        y, fold = self._lengths_and_folds(calls, workflows)
        block = self._forward_blocks(calls, workflows)
        self.global_, g_folds = self._fit_node(y, fold, None, None, "global", block=block)
        g_served = (self.global_, g_folds)
        self.workflow_types_, self.agents_ = {}, {}
        types: list[_TypeBudgetInput] = []
        # the columns the conditional model's features read (an agent's rows taken from these
        # alone, not from every text column of the calls)
        cond = calls[[c for c in calls.columns if c in _FEATURE_COLUMNS]]
        for wt, wt_idx in calls.groupby("workflow_type_id", sort=True).indices.items():
            wt_entry, wt_folds = self._fit_node(y[wt_idx], fold[wt_idx], self.global_, g_folds,
                                                "workflow_type", block=block[wt_idx])
            self.workflow_types_[wt] = wt_entry
            per_agent, rows_of = {}, {}
            sub = calls.iloc[wt_idx]
            for agent, a_idx in sub.groupby("agent_id", sort=True).indices.items():
                rows = wt_idx[a_idx]
                entry, _ = self._fit_node(y[rows], fold[rows], wt_entry, wt_folds, "agent",
                                          frame=cond.iloc[rows] if self.conditional else None,
                                          block=block[rows], global_served=g_served)
                per_agent[agent] = entry
                rows_of[agent] = rows
            types.append(_TypeBudgetInput(wt_entry, wt_folds, y[wt_idx], fold[wt_idx], per_agent,
                                          {a: (y[r], fold[r]) for a, r in rows_of.items()}))
            self.agents_[wt] = per_agent
        if self.shared_budget:
            self._allocate(types, g_folds)
        self.n_conditional_ = sum(e.get("conditional") is not None
                                  for agents in self.agents_.values() for e in agents.values())
        return self

    def _lengths_and_folds(self, calls: pd.DataFrame, workflows: pd.Series | None = None
                           ) -> tuple[np.ndarray, np.ndarray]:
        """Each call's cleaned length and validation fold (by workflow: ``workflows``, the
        :func:`_workflow_keys` when the caller has them; or by ``group_id``)."""
        if not 0.0 < self.coverage < 1.0:
            raise ValueError(f"coverage must be in (0, 1), got {self.coverage}")
        if calls.empty:
            raise ValueError("no calls to fit output-length intervals on")
        y = _clean(calls["output_tokens"].to_numpy(dtype=float, na_value=np.nan))
        keys = (calls["group_id"].astype(str) if "group_id" in calls   # profiler fit --group-by
                else workflows if workflows is not None else _workflow_keys(calls))
        return y, group_folds(keys, self.n_folds, self.random_state)

    def _forward_blocks(self, calls: pd.DataFrame, workflows: pd.Series | None = None) -> np.ndarray:
        """Per call, the time block of its workflow for the forward (rolling-origin) rule: its
        workflow's first arrival among the log's workflow starts cut at the shares of
        :data:`band_selection.FORWARD_ORIGINS` (0 before the first origin, i after the i-th; the
        same cuts for every node, so a parent's band at origin i was fit on the same past);
        all −1 (no forward rule) without arrival times or with ``forward`` off."""
        n = len(calls)
        if not self.forward or "t_arrival" not in calls:
            return np.full(n, -1)
        t = pd.to_numeric(calls["t_arrival"], errors="coerce")
        if t.isna().all():
            return np.full(n, -1)
        keys = workflows if workflows is not None else _workflow_keys(calls)
        start = t.groupby(keys).transform("min").to_numpy(dtype=float)
        first = np.unique(start[np.isfinite(start)])
        cuts = np.quantile(first, bs.FORWARD_ORIGINS, method="lower") if len(first) else []
        return np.where(np.isfinite(start), np.searchsorted(cuts, start, side="right"), -1)

    def _fit_node(self, y: np.ndarray, fold: np.ndarray, parent: dict | None,
                  parent_folds: dict | None, own_level: str, frame: pd.DataFrame | None = None,
                  block: np.ndarray | None = None, global_served: tuple[dict, dict] | None = None
                  ) -> tuple[dict[str, Any], dict[int, tuple[float, float]]]:
        """One node's entry and its served band per training fold (for its children's CV).
        ``block``: its calls' time blocks (:meth:`_forward_blocks`); ``global_served``: the
        global entry and its band per fold, a candidate of an agent node."""
        cov, cap = self.coverage, self.max_output_tokens
        n = len(y)
        ceiling = bs.ceiling_of(y, cap)
        ks = np.unique(fold)
        stats_ = {"n": int(n), "mean": float(np.mean(y)),
                  "cv": float(np.std(y) / np.mean(y)) if np.mean(y) > 0 else 0.0,
                  "empirical_band": [float(v) for v in np.quantile(y, [(1 - cov) / 2, 1 - (1 - cov) / 2])]}
        reason = (f"{n} call{'s' if n != 1 else ''}: too few to validate" if n < 3 else
                  "all calls in one workflow: cannot validate by workflow" if len(ks) < 2 else None)
        if reason and parent is not None:
            entry = {k: v for k, v in parent.items() if k not in ("selection", "conditional", "fallback_reason")}
            entry.update(stats_, level=parent["level"], method="parent", conditional=None,
                         fallback_reason=f"degenerate ({reason}): served its parent's band",
                         selection={"chosen": "parent", "reason": reason, "n_val": 0, "candidates": {}})
            return entry, dict(parent_folds or {})

        scores = bs.FoldScores()
        fold_bands: dict[str, dict[int, tuple[float, float]]] = {}
        if not reason:
            for k in ks:
                tr, te = fold != k, fold == k
                ytr, yte = y[tr], y[te]
                c_k = bs.ceiling_of(ytr, cap)
                cands = bs.candidate_bands(ytr, cov, c_k, one_sided=parent is not None)
                if parent is not None:
                    p_lo, p_hi = (parent_folds or {}).get(int(k), (parent["lo"], parent["hi"]))
                    cands["parent"] = (p_lo, min(p_hi, c_k))
                if global_served is not None and parent is not None and parent.get("level") != "global":
                    g_lo, g_hi = global_served[1].get(int(k), (global_served[0]["lo"], global_served[0]["hi"]))
                    cands["global"] = (g_lo, min(g_hi, c_k))
                for name, (lo, hi) in cands.items():
                    scores.add(name, yte, lo, hi)
                    fold_bands.setdefault(name, {})[int(k)] = (lo, hi)
                scores.total += len(yte)
            oof = None
            if frame is not None and n >= self.cond_min_calls and np.ptp(y) > 0:
                X = qt.features(frame)
                oof = self._conditional_cv(X, y, fold, ks, scores)
            summary = scores.summary(cov)
            forward = self._forward_scores(y, block, parent, global_served)
            marginal, why = bs.choose(summary, lambda c: c != "conditional", forward)
        else:  # the global node with nothing to validate on: the finite-sample-safe band
            summary, marginal, oof = {}, "order_stat_ceiling", None
            why = f"degenerate ({reason}): order statistics with the ceiling, not validated"

        if marginal == "parent":
            lo, hi, level = parent["lo"], min(parent["hi"], ceiling), parent["level"]
        elif marginal == "global" and global_served is not None:
            lo, hi, level = global_served[0]["lo"], min(global_served[0]["hi"], ceiling), "global"
        else:
            lo, hi = bs.candidate_bands(y, cov, ceiling)[marginal]
            level = own_level
        lo, hi = int(lo), int(max(hi, lo))
        cond = None
        if oof is not None and "conditional" in summary:
            c, m = summary["conditional"], summary[marginal]
            if c["accepted"] and (c["mean_width"] < m["mean_width"] or not m["accepted"]):
                cond = self._conditional_final(qt.features(frame), y, oof, ceiling)
                if cond is not None:
                    cond["validation"] = {"n": scores.total, "coverage": c["coverage"],
                                          "mean_width": c["mean_width"], "marginal": marginal,
                                          "marginal_coverage": m["coverage"], "marginal_width": m["mean_width"]}
        k_lo, k_hi = bs._ranks(n, cov)
        exact = (math.ceil((n + 1) * cov) <= n if marginal == "one_sided"   # [0, U(α)]: one rank
                 else k_lo >= 1 and k_hi <= n)
        entry = {"lo": lo, "hi": hi, **stats_, "level": level, "method": marginal,
                 "exact": bool(exact),
                 "ceiling": int(ceiling), "certified_alpha": 1.0 / (n + 1),
                 "upper": upper_table(y, ceiling), "conditional": cond}
        entry["log_mu"], entry["log_sigma"] = log_moments(y)
        entry["selection"] = {"chosen": "conditional" if cond else marginal,
                              "reason": (why if not cond else
                                         "conditional band narrower than the best marginal one at nominal held-out coverage"),
                              "n_val": int(scores.total), "folds": int(len(ks)), "candidates": summary}
        if reason is None and forward is not None:
            entry["selection"]["forward"] = forward
        served = fold_bands.get(marginal) or {}
        if marginal in ("parent", "global"):
            served = {k: (lo_, min(hi_, ceiling)) for k, (lo_, hi_) in served.items()}
        return entry, served

    def _forward_scores(self, y: np.ndarray, block: np.ndarray | None, parent: dict | None,
                        global_served: tuple[dict, dict] | None) -> dict[str, dict[str, Any]] | None:
        """The rolling-origin figures of the node's marginal candidates: at each origin i, the
        candidates fit on the calls of blocks < i and scored on block i (the parent's and the
        global band as fitted on the whole log: their own forward choice is theirs). None without
        time blocks or without a block past the first origin that has both sides."""
        if block is None or (block < 0).all():
            return None
        cov, cap = self.coverage, self.max_output_tokens
        scores = bs.FoldScores()
        for i in np.unique(block[block > 0]):
            tr, te = (block >= 0) & (block < i), block == i
            if not tr.any():
                continue
            ytr, yte = y[tr], y[te]
            c_i = bs.ceiling_of(ytr, cap)
            cands = bs.candidate_bands(ytr, cov, c_i, one_sided=parent is not None)
            if parent is not None:
                cands["parent"] = (parent["lo"], min(parent["hi"], c_i))
            if global_served is not None and parent is not None and parent.get("level") != "global":
                cands["global"] = (global_served[0]["lo"], min(global_served[0]["hi"], c_i))
            for name, (lo, hi) in cands.items():
                scores.add(name, yte, lo, hi)
            scores.total += len(yte)
        return scores.summary(cov) if scores.total else None

    def _allocate(self, types: list[_TypeBudgetInput], g_folds: dict) -> None:
        """Spend one miscoverage budget within each workflow type where bands are widest.

        Every agent (and, per workflow type, the agents served their parent's band, as one
        group) picks one option — its validated choice at nominal, its workflow type's band,
        the global band, or its order-statistic band at another level of
        :data:`band_selection.BUDGET_LEVELS` — so that the summed held-out misses of the
        type's calls stay within the budget of its N held-out calls
        (:func:`band_selection.budget_misses`) and the summed held-out width is least
        (:func:`band_selection.allocate_budget`). A heavy-tailed agent then gives up a little of
        its own coverage and the narrow ones of the same type keep theirs. The budget is per
        workflow type, not per log: a log-wide budget let one application (a many-agent team)
        fall to 0.94–0.96 at nominal 0.99 while another over-covered with wider bands; every
        type is one application with its own users, so each is held to nominal. "Every agent
        at its validated choice", "every agent at its type's band" and "every agent at the
        global band" are all in each type's search, so no type is served a configuration that
        validation says is wider than those at nominal coverage.

        ``types``: per workflow type, its :class:`_TypeBudgetInput`."""
        for t in types:
            self._allocate_type(t, g_folds)

    def _allocate_type(self, t: _TypeBudgetInput, g_folds: dict) -> None:
        """:meth:`_allocate` for one workflow type ``t``."""
        cov, cap = self.coverage, self.max_output_tokens
        g = self.global_
        wt_entry, per_agent, data = t.entry, t.per_agent, t.data
        groups: list[_BudgetGroup] = []
        degenerate = [a for a, e in per_agent.items() if e.get("fallback_reason")]
        own = [a for a in per_agent if a not in degenerate]
        for agent in own:
            e, (ya, fa) = per_agent[agent], data[agent]
            sel = e["selection"]
            n_val = int(sel.get("n_val") or 0)
            if n_val == 0:
                return
            menu = {BudgetOption(name, keep=name == sel["chosen"]):
                    (bs.charged_misses(int(round((1 - v["coverage"]) * n_val)), n_val, cov),
                     v["mean_width"] * n_val)
                    for name, v in sel["candidates"].items()
                    if name == sel["chosen"] or (name == "parent" and not _forward_kept(sel))}
            if not _forward_kept(sel):
                menu.update(self._level_scores(ya, fa, ya, fa))
                if e["level"] != "global":
                    menu[GLOBAL_OPTION] = self._served_scores(ya, fa, g_folds, g, cov)
            groups.append(_BudgetGroup([agent], True, menu, ya, len(ya)))
        if degenerate:
            ya = np.concatenate([data[a][0] for a in degenerate])
            fa = np.concatenate([data[a][1] for a in degenerate])
            menu = {BudgetOption("parent", keep=True): self._served_scores(ya, fa, t.folds, wt_entry, cov)}
            menu.update(self._level_scores(t.y, t.fold, ya, fa))
            if wt_entry["level"] != "global":
                menu[GLOBAL_OPTION] = self._served_scores(ya, fa, g_folds, g, cov)
            groups.append(_BudgetGroup(degenerate, False, menu, t.y, len(ya)))
        total = sum(gr.n for gr in groups)
        if not groups or total == 0:
            return
        budget = bs.budget_misses(total, cov)
        found = bs.allocate_budget([gr.menu for gr in groups], budget)
        if found is None:
            return
        choices, misses, width = found

        def config_width(wanted: Callable[[BudgetOption], bool]) -> float | None:
            picks = [[v for k, v in gr.menu.items() if wanted(k)] for gr in groups]
            return sum(min(p, key=lambda t: t[1])[1] for p in picks) / total if all(picks) else None
        note = {"calls": int(total), "budget_misses": budget, "held_out_misses": int(misses),
                "held_out_mean_width": width / total,
                "held_out_mean_width_at_nominal": config_width(lambda o: o.keep),
                "held_out_mean_width_global": config_width(lambda o: o == GLOBAL_OPTION) if all(
                    GLOBAL_OPTION in gr.menu for gr in groups) else None}
        for gr, choice in zip(groups, choices):
            if choice.keep:
                for a in gr.agents:
                    per_agent[a]["selection"]["budget"] = {**note, "option": choice.name}
                continue
            m, w = gr.menu[choice]
            n_group = max(gr.n, 1)
            ceiling = bs.ceiling_of(gr.y, cap)
            if choice.level is None:      # the workflow type's band or the global one
                src = wt_entry if choice.name == "parent" else g
                lo, hi, level_name = src["lo"], min(src["hi"], ceiling), src["level"]
                why = f"shared coverage budget: the {'workflow type' if choice.name == 'parent' else 'global'} band"
            else:
                level = choice.level
                lo, hi = bs.order_stat_band(gr.y, level, ceiling)
                level_name = "agent" if gr.own else wt_entry["level"]
                why = f"shared coverage budget: order statistics at {level:g}"
            for a in gr.agents:
                e = per_agent[a]
                # a degenerate agent keeps method "parent": its band is its workflow type's data
                e.update(lo=int(lo), hi=int(max(hi, lo)), conditional=None, level=level_name,
                         method=choice.name if gr.own else "parent")
                e["selection"]["chosen"] = choice.name
                e["selection"]["reason"] = f"{why} (held-out coverage {1 - m / n_group:.3f} of {n_group:,} calls)"
                e["selection"]["budget"] = {**note, "option": choice.name, "group_misses": int(m),
                                            "group_mean_width": w / n_group}

    @staticmethod
    def _served_scores(y: np.ndarray, fold: np.ndarray, folds: dict, entry: dict, cov: float
                       ) -> tuple[int, float]:
        """Held-out (charged misses, width sum) on ``y`` of a band served per fold."""
        miss = width = 0.0
        for k in np.unique(fold):
            lo, hi = folds.get(int(k), (entry["lo"], entry["hi"]))
            te = y[fold == k]
            miss += int(np.sum((te < lo) | (te > hi)))
            width += (hi - lo) * len(te)
        return bs.charged_misses(int(miss), len(y), cov), float(width)

    def _level_scores(self, y_fit: np.ndarray, f_fit: np.ndarray, y_val: np.ndarray, f_val: np.ndarray
                      ) -> dict[BudgetOption, tuple[int, float]]:
        """Held-out (misses, width sum) on ``y_val`` of the order-statistic band of ``y_fit`` at
        each level of :data:`band_selection.BUDGET_LEVELS`, fold by fold (per fold one partition
        for every level's ranks and one sort of the held-out lengths)."""
        levels = bs.BUDGET_LEVELS
        miss, width = np.zeros(len(levels)), np.zeros(len(levels))
        for k in np.unique(f_val):
            ytr = y_fit[f_fit != k]
            if len(ytr) == 0:
                return {}
            te = np.sort(y_val[f_val == k])
            ceiling = bs.ceiling_of(ytr, self.max_output_tokens)
            for i, (lo, hi) in enumerate(bs.order_stat_bands(ytr, levels, ceiling)):
                miss[i] += np.searchsorted(te, lo, "left") + len(te) - np.searchsorted(te, hi, "right")
                width[i] += (hi - lo) * len(te)
        return {BudgetOption.order_stat(level): (bs.charged_misses(int(m), len(y_val), level), float(w))
                for level, m, w in zip(levels, miss, width)}

    def _conditional_cv(self, X: np.ndarray, y: np.ndarray, fold: np.ndarray, ks: np.ndarray,
                        scores: bs.FoldScores) -> np.ndarray | None:
        """Out-of-fold conformity scores of the quantile tree, adding its held-out figures to
        ``scores`` (fold k's band uses the tree fit without fold k and Q from the other folds'
        scores). None when a training fold is too small for a tree."""
        rng = np.random.default_rng(self.random_state)
        oof = np.full(len(y), np.nan)
        models = {}
        for k in ks:
            tr = np.flatnonzero(fold != k)
            if len(tr) < 10:
                return None
            if len(tr) > self.cond_max_samples:
                tr = rng.choice(tr, self.cond_max_samples, replace=False)
            te = fold == k
            models[k] = qt.fit_tree(X[tr], y[tr], self.coverage, seed=self.random_state)
            oof[te] = qt.scores(models[k], X[te], y[te])
        for k in ks:
            te = fold == k
            q = qt.conformal_q(oof[~te], self.coverage)
            lo, hi = qt.tree_bands(models[k], X[te], q, bs.ceiling_of(y[~te], self.max_output_tokens))
            scores.add("conditional", y[te], lo, hi)
        return oof

    def _conditional_final(self, X: np.ndarray, y: np.ndarray, oof: np.ndarray, ceiling: int) -> dict | None:
        """The tree fit on (a sample of) every call, Q from all out-of-fold scores."""
        q = qt.conformal_q(oof, self.coverage)
        if math.isinf(q):
            return None
        rows = np.arange(len(y))
        if len(rows) > self.cond_max_samples:
            rows = np.random.default_rng(self.random_state).choice(rows, self.cond_max_samples, replace=False)
        model = qt.fit_tree(X[rows], y[rows], self.coverage, seed=self.random_state)
        model["q_adjust"] = q
        model["ceiling"] = int(ceiling)
        return model

    # ------------------------------------------------------------- prediction
    def predict(self, calls: pd.DataFrame) -> np.ndarray:
        """Bands for every row of ``calls`` (same columns as ``fit``): array of shape (n, 2)."""
        out = np.zeros((len(calls), 2))
        calls = calls.reset_index(drop=True)
        for (wt, agent), idx in calls.groupby(["workflow_type_id", "agent_id"], sort=False).indices.items():
            band, _ = self.lookup(wt, agent)
            cond = band.get("conditional")
            if cond:
                lo, hi = cond_bands(cond, qt.features(calls.iloc[idx]))
                out[idx, 0], out[idx, 1] = lo, hi
            else:
                out[idx, 0], out[idx, 1] = band["lo"], band["hi"]
        return out

    # -------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        return {"coverage": self.coverage, "params": self.get_params(), "global": self.global_,
                "workflow_types": self.workflow_types_, "agents": self.agents_}
