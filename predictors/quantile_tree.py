"""A conformalized quantile tree: the conditional output-length band of one agent.

A small regression tree (scikit-learn ``DecisionTreeRegressor`` on ln(1 + y), at most
``max_leaves`` leaves of at least ``min_leaf`` calls) cuts the agent's calls by its previous
output in the workflow, the input tokens and its call index; each leaf keeps the empirical α/2 and
1 − α/2 quantiles of the lengths that fell in it (``q_lo(x)``, ``q_hi(x)``). A bimodal agent whose
length tracks its call index thus gets a narrow band per mode instead of one band over both.

**Conformal correction (CQR on the log scale).** Out-of-fold scores
E = max(ln(1+q_lo(x)) − ln(1+y), ln(1+y) − ln(1+q_hi(x))) give Q, the ⌈(m+1)(1−α)⌉-th smallest of
m scores, and the band [e^{ln(1+q_lo) − Q} − 1, e^{ln(1+q_hi) + Q} − 1] (multiplicative, so a
4-token leaf and a 1,500-token leaf are corrected in proportion). The tree and its leaf quantiles
are plain lists, so a profile stores them as JSON.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd
from sklearn.tree import DecisionTreeRegressor

from predictors.served import leaf_quantiles, tree_bands  # the serving half (numpy only)

#: Features of the conditional model, in order.
COND_FEATURES = ("has_prev", "prev_agent_output_tokens", "input_tokens", "agent_call_index")


def features(df: pd.DataFrame) -> np.ndarray:
    """The :data:`COND_FEATURES` matrix of a calls frame."""
    prev = df["prev_agent_output_tokens"]
    return np.column_stack([
        prev.notna().to_numpy(dtype=float),
        prev.fillna(0).to_numpy(dtype=float),
        df["input_tokens"].fillna(0).to_numpy(dtype=float),
        df["agent_call_index"].fillna(0).to_numpy(dtype=float),
    ])


def fit_tree(X: np.ndarray, y: np.ndarray, coverage: float, max_leaves: int = 8,
             min_leaf: int | None = None, seed: int = 0) -> dict[str, Any]:
    """The tree (node arrays) with per-node α/2 and 1 − α/2 quantiles of ``y``."""
    alpha = 1.0 - coverage
    leaf = min_leaf or max(5, len(y) // 20)
    tree = DecisionTreeRegressor(max_leaf_nodes=max_leaves, min_samples_leaf=leaf, random_state=seed)
    tree.fit(X, np.log1p(y))
    t = tree.tree_
    ids = tree.apply(X)
    lo = np.zeros(t.node_count)
    hi = np.zeros(t.node_count)
    for node in np.unique(ids):
        q = np.quantile(y[ids == node], [alpha / 2, 1 - alpha / 2])
        lo[node], hi[node] = q
    return {"kind": "quantile_tree", "features": list(COND_FEATURES),
            "left": t.children_left.tolist(), "right": t.children_right.tolist(),
            "feature": t.feature.tolist(), "threshold": t.threshold.tolist(),
            "q_lo": lo.tolist(), "q_hi": hi.tolist(), "q_adjust": 0.0}


def scores(model: Mapping[str, Any], X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Conformity scores E on the log scale (see the module doc)."""
    lo, hi = leaf_quantiles(model, X)
    ly = np.log1p(y)
    return np.maximum(np.log1p(lo) - ly, ly - np.log1p(hi))


def conformal_q(e: np.ndarray, coverage: float) -> float:
    """The ⌈(m+1)(1−α)⌉-th smallest score; the largest score when m is too small for that rank
    (coverage then ≥ m/(m+1) only: validation judges it); ``inf`` without scores."""
    e = np.asarray(e, dtype=float)
    e = e[np.isfinite(e)]
    m = len(e)
    if m == 0:
        return math.inf
    k = min(math.ceil((m + 1) * coverage), m)
    return float(np.partition(e, k - 1)[k - 1])


