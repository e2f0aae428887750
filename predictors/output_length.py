"""Output-length intervals per (workflow type, agent).

For a target coverage ``1 − α`` (default 0.99) each agent gets a band ``[lo, hi]`` such that a
new call of that agent produces between ``lo`` and ``hi`` tokens with probability ≥ 1 − α.

**Marginal band (split-conformal with the identity score).** With n exchangeable past lengths
y₁…yₙ, the order statistics at ranks ⌊(n+1)·α/2⌋ and ⌈(n+1)·(1−α/2)⌉ bracket a new length with
probability ≥ 1 − α (each tail misses with probability ≤ α/2). When n is too small for the rank
to exist (n < 2/α − 1, i.e. 199 calls at 99 %), the band is the lognormal *prediction interval*
exp(μ̂ ± t_{n−1, 1−α/2} · σ̂ · √(1 + 1/n)) of the log lengths (``method: lognormal``). An agent
with fewer than ``min_calls`` calls is *sparse*: it falls back to the band of its workflow type,
then to the global band; the fitted entry records which ``level`` served.

**Conditional band (conformalized quantile regression, CQR).** Pythia observes that consecutive
calls of high-variance agents correlate. For such agents (CV ≥ ``cond_min_cv``) a linear quantile
regression (scikit-learn ``QuantileRegressor``) of the α/2 and 1−α/2 quantiles on the agent's
previous output length in the workflow, the input tokens and the agent's call index is fit on one
part of the workflows; on a second part the conformity scores
E = max(q̂_lo(x) − y, y − q̂_hi(x)) give the correction Q = the ⌈(n+1)(1−α)⌉-th smallest E, and
the band is [q̂_lo(x) − Q, q̂_hi(x) + Q]. On a third part it is compared with the marginal band:
it is kept only when it is narrower on average at (at least) the same empirical coverage.

**One-sided upper bounds at any risk α (for capacity planning).** A router that checks a
union bound over n requests needs each request's bound at a risk that fits its budget, e.g.
α_i = ε / n, so one fixed quantile is not enough. Every fitted band therefore also stores

* ``log_mu``, ``log_sigma`` — mean and standard deviation (ddof 1) of ln(max(y, 1));
* ``upper`` — a table ``{α: U(α)}`` over :data:`UPPER_ALPHAS` (0.2 … 1e-5), where U(α) is the
  *one-sided* (1 − α) prediction bound of a new length: the split-conformal order statistic at
  rank ⌈(n+1)(1−α)⌉ when it exists (P(y_new ≤ y_(k)) ≥ 1 − α for exchangeable data), else the
  lognormal one-sided prediction bound exp(μ̂ + t_{n−1, 1−α} · σ̂ · √(1 + 1/n)).

:meth:`OutputLengthIntervals.upper_bound` reads U(α) for any α: the table entry of the largest
tabulated α ≤ α (a step function, never below the exact bound at α), and below the smallest
tabulated α the lognormal formula. A profile written before these fields existed is served from
the agent's ``mean`` and ``cv`` (lognormal with σ² = ln(1 + cv²), μ = ln(mean) − σ²/2), and
without those from the band's ``hi`` (valid at α = (1 − coverage)/2 and above).
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import QuantileRegressor
from sklearn.model_selection import GroupShuffleSplit

#: Features of the conditional model, in order.
COND_FEATURES = ("has_prev", "prev_agent_output_tokens", "input_tokens", "agent_call_index")
#: Risks α at which every band tabulates its one-sided upper bound U(α) (``band["upper"]``).
UPPER_ALPHAS = (0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001, 5e-4, 2e-4, 1e-4, 5e-5, 2e-5, 1e-5)


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
    return int(math.floor(math.exp(mu - half))), int(math.ceil(math.exp(mu + half)))


def log_moments(y: np.ndarray) -> tuple[float, float]:
    """(μ̂, σ̂): mean and standard deviation (ddof 1; 0 for n < 2) of ln(max(y, 1))."""
    z = np.log(np.maximum(np.asarray(y, dtype=float), 1.0))
    if len(z) == 0:
        return 0.0, 0.0
    return float(z.mean()), float(z.std(ddof=1)) if len(z) > 1 else 0.0


def lognormal_upper(mu: float, sigma: float, n: int, alpha: float) -> float:
    """One-sided (1 − α) lognormal prediction bound exp(μ + q·σ·√(1 + 1/n)), with q the
    Student-t quantile t_{n−1, 1−α} (the normal one when n is unknown or tiny)."""
    q = stats.t.isf(alpha, df=n - 1) if n >= 3 else stats.norm.isf(alpha)
    return math.exp(mu + q * max(sigma, 0.0) * math.sqrt(1 + 1 / max(n, 1)))


def upper_prediction_bound(y: np.ndarray, alpha: float, mu: float | None = None,
                           sigma: float | None = None) -> int:
    """U(α): one-sided (1 − α) prediction bound of a new value of ``y`` (see the module doc).

    The conformal order statistic at rank ⌈(n+1)(1−α)⌉ when n is large enough, else the
    lognormal bound (``mu``/``sigma`` of the log lengths, computed when not given).
    """
    y = np.sort(np.asarray(y, dtype=float))
    n = len(y)
    k = math.ceil((n + 1) * (1 - alpha))
    if 1 <= k <= n:
        return int(math.ceil(y[k - 1]))
    if mu is None or sigma is None:
        mu, sigma = log_moments(y)
    return int(math.ceil(lognormal_upper(mu, sigma, n, alpha)))


def upper_table(y: np.ndarray, alphas: Sequence[float] = UPPER_ALPHAS) -> dict[str, int]:
    """``{str(α): U(α)}`` over ``alphas``, made non-decreasing as α shrinks (the lognormal
    extrapolation may start below the last exact order statistic)."""
    mu, sigma = log_moments(y)
    out: dict[str, int] = {}
    prev = 0
    for a in sorted(alphas, reverse=True):
        prev = max(prev, upper_prediction_bound(y, a, mu, sigma))
        out[repr(float(a))] = prev
    return out


def _features(df: pd.DataFrame) -> np.ndarray:
    prev = df["prev_agent_output_tokens"]
    return np.column_stack([
        prev.notna().to_numpy(dtype=float),
        prev.fillna(0).to_numpy(dtype=float),
        df["input_tokens"].to_numpy(dtype=float),
        df["agent_call_index"].fillna(0).to_numpy(dtype=float),
    ])


def _cond_bands(model: Mapping[str, Any], X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo = X @ np.asarray(model["lo_coef"]) + model["lo_intercept"] - model["q_adjust"]
    hi = X @ np.asarray(model["hi_coef"]) + model["hi_intercept"] + model["q_adjust"]
    lo = np.maximum(np.floor(lo), 0)
    hi = np.maximum(np.ceil(hi), lo)
    return lo, hi


class OutputLengthIntervals(BaseEstimator):
    """Per-(workflow type, agent) output-length bands with hierarchical fallback.

    Parameters
    ----------
    coverage : target probability that the true length falls in the band.
    min_calls : fewest calls for an agent (or workflow type) to get a band of its own; below it
        the next level up serves (agent → workflow type → global).
    conditional : try the CQR model for high-variance agents.
    cond_min_cv : coefficient of variation from which the conditional model is tried.
    cond_min_calls : fewest calls (and ≥ 20 workflows) for the conditional model to be tried.
    cond_max_samples : cap on the rows the quantile regressions are fit on (speed).
    random_state : seed of the workflow splits.

    Fitted attributes: ``global_``, ``workflow_types_``, ``agents_`` (dicts of bands),
    ``n_conditional_`` (agents served by the conditional model).
    """

    def __init__(self, coverage: float = 0.99, min_calls: int = 50, conditional: bool = True,
                 cond_min_cv: float = 0.3, cond_min_calls: int = 400, cond_max_samples: int = 3000,
                 random_state: int = 0):
        self.coverage = coverage
        self.min_calls = min_calls
        self.conditional = conditional
        self.cond_min_cv = cond_min_cv
        self.cond_min_calls = cond_min_calls
        self.cond_max_samples = cond_max_samples
        self.random_state = random_state

    # ---------------------------------------------------------------- fitting
    def _band(self, y: np.ndarray) -> dict[str, Any]:
        """Conformal band when n allows the guarantee, else the lognormal prediction interval."""
        lo, hi, exact = conformal_band(y, self.coverage)
        method = "conformal"
        if not exact and len(y) >= 3:
            lo, hi = lognormal_band(y, self.coverage)
            method = "lognormal"
        mu, sigma = log_moments(y)
        return {"lo": lo, "hi": hi, "n": int(len(y)), "exact": exact, "method": method,
                "log_mu": mu, "log_sigma": sigma, "upper": upper_table(y)}

    def fit(self, calls: pd.DataFrame) -> "OutputLengthIntervals":
        """``calls``: one row per call with workflow_type_id, workflow_id, agent_id,
        output_tokens, input_tokens, prev_agent_output_tokens, agent_call_index."""
        if not 0.0 < self.coverage < 1.0:
            raise ValueError(f"coverage must be in (0, 1), got {self.coverage}")
        if calls.empty:
            raise ValueError("no calls to fit output-length intervals on")
        self.global_ = self._band(calls["output_tokens"].to_numpy())
        self.workflow_types_ = {}
        self.agents_ = {}
        self.n_conditional_ = 0
        for wt, g in calls.groupby("workflow_type_id", sort=True):
            wt_band = self._band(g["output_tokens"].to_numpy())
            self.workflow_types_[wt] = wt_band
            per_agent = {}
            for agent, ga in g.groupby("agent_id", sort=True):
                y = ga["output_tokens"].to_numpy()
                band = self._band(y)
                if len(y) >= self.min_calls:
                    band["level"] = "agent"
                elif wt_band["n"] >= self.min_calls:
                    band = {**wt_band, "n": int(len(y)), "level": "workflow_type"}
                else:
                    band = {**self.global_, "n": int(len(y)), "level": "global"}
                band["conditional"] = None
                if self.conditional and band["level"] == "agent":
                    band["conditional"] = self._fit_conditional(ga, band)
                    self.n_conditional_ += band["conditional"] is not None
                band["mean"] = float(np.mean(y))
                band["cv"] = float(np.std(y) / np.mean(y)) if np.mean(y) > 0 else 0.0
                per_agent[agent] = band
            self.agents_[wt] = per_agent
        return self

    def _fit_conditional(self, ga: pd.DataFrame, marginal: dict) -> dict | None:
        y = ga["output_tokens"].to_numpy(dtype=float)
        groups = ga["workflow_id"].to_numpy()
        if (len(y) < self.cond_min_calls or ga["workflow_id"].nunique() < 20
                or np.mean(y) <= 0 or np.std(y) / np.mean(y) < self.cond_min_cv):
            return None
        X = _features(ga)
        split1 = GroupShuffleSplit(n_splits=1, train_size=0.5, random_state=self.random_state)
        tr, rest = next(split1.split(X, y, groups))
        split2 = GroupShuffleSplit(n_splits=1, train_size=0.5, random_state=self.random_state + 1)
        cal_r, val_r = next(split2.split(X[rest], y[rest], groups[rest]))
        cal, val = rest[cal_r], rest[val_r]
        rng = np.random.default_rng(self.random_state)
        if len(tr) > self.cond_max_samples:
            tr = rng.choice(tr, self.cond_max_samples, replace=False)
        alpha = 1.0 - self.coverage
        scale = np.maximum(X[tr].std(axis=0), 1e-9)  # standardize for the LP solver, undo after
        fitted = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            for name, q in (("lo", alpha / 2), ("hi", 1 - alpha / 2)):
                qr = QuantileRegressor(quantile=q, alpha=0.0, solver="highs").fit(X[tr] / scale, y[tr])
                fitted[f"{name}_coef"] = (qr.coef_ / scale).tolist()
                fitted[f"{name}_intercept"] = float(qr.intercept_)
        model = {**fitted, "q_adjust": 0.0, "features": list(COND_FEATURES)}
        lo_c, hi_c = _cond_bands(model, X[cal])
        scores = np.sort(np.maximum(lo_c - y[cal], y[cal] - hi_c))
        k = math.ceil((len(cal) + 1) * (1 - alpha))
        if k > len(cal):
            return None  # too few calibration points for the guarantee
        model["q_adjust"] = float(scores[k - 1])  # may be negative: CQR also shrinks
        lo_v, hi_v = _cond_bands(model, X[val])
        yv = y[val]
        cond_cov = float(np.mean((yv >= lo_v) & (yv <= hi_v)))
        cond_width = float(np.mean(hi_v - lo_v))
        m_lo, m_hi, _ = conformal_band(y[np.concatenate([tr, cal])], self.coverage)
        marg_cov = float(np.mean((yv >= m_lo) & (yv <= m_hi)))
        marg_width = float(m_hi - m_lo)
        model["validation"] = {"n": int(len(val)), "coverage": cond_cov, "mean_width": cond_width,
                               "marginal_coverage": marg_cov, "marginal_width": marg_width}
        if cond_cov >= min(marg_cov, self.coverage) and cond_width < marg_width:
            return model
        return None

    # ------------------------------------------------------------- prediction
    def lookup(self, workflow_type_id: str, agent_id: str) -> tuple[dict, str]:
        """The band entry serving this agent and its level (``unknown`` = global, unseen agent)."""
        band = self.agents_.get(workflow_type_id, {}).get(agent_id)
        if band is not None:
            return band, band["level"]
        wt = self.workflow_types_.get(workflow_type_id)
        if wt is not None and wt["n"] >= self.min_calls:
            return wt, "workflow_type"
        return self.global_, "global"

    def predict_band(self, workflow_type_id: str, agent_id: str,
                     features: Mapping[str, float | None] | None = None) -> tuple[int, int, str]:
        """(lo, hi, level) for one call; ``features`` feed the conditional model when present
        (keys ``prev_agent_output_tokens``, ``input_tokens``, ``agent_call_index``)."""
        band, level = self.lookup(workflow_type_id, agent_id)
        cond = band.get("conditional")
        if cond and features and features.get("input_tokens") is not None:
            prev = features.get("prev_agent_output_tokens")
            x = np.array([[prev is not None, prev or 0.0, features["input_tokens"],
                           features.get("agent_call_index") or 0.0]], dtype=float)
            lo, hi = _cond_bands(cond, x)
            return int(lo[0]), int(hi[0]), "conditional"
        return int(band["lo"]), int(band["hi"]), level

    def upper_bound(self, workflow_type_id: str, agent_id: str, alpha: float) -> int:
        """U(α): the (1 − α) one-sided upper bound of this agent's next output length.

        From the band that serves the agent (:meth:`lookup`); see the module docstring for the
        table, the lognormal tail below it, and the fallbacks for older profiles.
        """
        band, _ = self.lookup(workflow_type_id, agent_id)
        return band_upper_bound(band, alpha, self.coverage)

    def upper_bounds(self, workflow_type_id: str, agent_id: str,
                     alphas: Sequence[float] = UPPER_ALPHAS) -> tuple[tuple[float, int], ...]:
        """``((α, U(α)), …)`` over ``alphas``, largest α first: the table a router interpolates."""
        band, _ = self.lookup(workflow_type_id, agent_id)
        return tuple((float(a), band_upper_bound(band, a, self.coverage))
                     for a in sorted(alphas, reverse=True))

    def predict(self, calls: pd.DataFrame) -> np.ndarray:
        """Bands for every row of ``calls`` (same columns as ``fit``): array of shape (n, 2)."""
        out = np.zeros((len(calls), 2))
        calls = calls.reset_index(drop=True)
        for (wt, agent), idx in calls.groupby(["workflow_type_id", "agent_id"], sort=False).groups.items():
            band, _ = self.lookup(wt, agent)
            cond = band.get("conditional")
            if cond:
                lo, hi = _cond_bands(cond, _features(calls.loc[idx]))
                out[idx, 0], out[idx, 1] = lo, hi
            else:
                out[idx, 0], out[idx, 1] = band["lo"], band["hi"]
        return out

    # -------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        return {"coverage": self.coverage, "params": self.get_params(), "global": self.global_,
                "workflow_types": self.workflow_types_, "agents": self.agents_}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OutputLengthIntervals":
        est = cls(**d.get("params", {"coverage": d["coverage"]}))
        est.global_ = d["global"]
        est.workflow_types_ = d["workflow_types"]
        est.agents_ = d["agents"]
        est.n_conditional_ = sum(1 for agents in est.agents_.values()
                                 for b in agents.values() if b.get("conditional"))
        return est


def band_upper_bound(band: Mapping[str, Any], alpha: float, coverage: float | None = None) -> int:
    """U(α) from one fitted band entry (see the module docstring)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    table = band.get("upper")
    n = int(band.get("n") or 0)
    if table:
        pairs = sorted(((float(a), int(v)) for a, v in table.items()), reverse=True)
        usable = [v for a, v in pairs if a <= alpha]
        if usable:
            return usable[0]
        if band.get("log_mu") is not None and band.get("log_sigma") is not None:
            return max(pairs[-1][1], int(math.ceil(lognormal_upper(
                float(band["log_mu"]), float(band["log_sigma"]), n, alpha))))
        return pairs[-1][1]
    mean, cv = band.get("mean"), band.get("cv")
    if mean and cv is not None and mean > 0:
        s2 = math.log1p(float(cv) ** 2)
        return int(math.ceil(lognormal_upper(math.log(float(mean)) - s2 / 2, math.sqrt(s2), n, alpha)))
    return int(band["hi"])
