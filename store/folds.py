"""Folds by group: K-fold cross-validation that keeps every row of a workflow in one fold.

Every estimator that chooses something by held-out workflows (the output-length bands, the
idle-gap TTL level, the remaining-tokens model) assigns its folds here, so "held out by
workflow" means the same thing everywhere::

    fold = group_folds(calls["workflow_id"], 5, seed=0)      # one fold number per row
    for f in range(5):
        train, test = calls[fold != f], calls[fold == f]

The distinct groups, in sorted order, take the places of one seeded shuffle, and a group's
fold is its place modulo K: folds differ in size by at most one group, the assignment does not
depend on the order of the rows, and the same seed gives the same folds. A group may be any
hashable label: a workflow id, or a ``(workflow type, workflow)`` key when ids repeat across
types.

Logs on disk are split by :mod:`store.split` instead (``profiler split``, ``profiler eval
--cv``): there the workflow id is hashed with the seed inside DuckDB, so the split is the same
whatever files the records came in.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike


def group_folds(groups: ArrayLike, n_folds: int, seed: int | np.random.Generator = 0) -> np.ndarray:
    """Fold (0 … ``n_folds`` − 1) of every row of ``groups`` (one group label per row).

    ``seed`` may be a :class:`numpy.random.Generator`: the shuffle then continues its stream
    (a caller that drew a subsample of the groups with it first)."""
    # hashing; uniq in sorted order (a text Series is hashed as it is: its Arrow strings sort
    # by code point, as Python's do, and are not first made Python objects)
    values = groups if isinstance(groups, pd.Series) and isinstance(groups.dtype, pd.StringDtype) else np.asarray(groups)
    codes, uniq = pd.factorize(values, sort=True)
    place = np.random.default_rng(seed).permutation(len(uniq))
    return (place % max(int(n_folds), 1))[codes]


def paired_se(diff: ArrayLike, weights: ArrayLike, clusters: ArrayLike | None = None) -> tuple[float, float]:
    """Mean and standard error of a paired per-workflow difference, clustered by group.

    ``diff[r]``: the difference (candidate − reference) of row ``r``, per workflow; ``weights[r]``:
    how many workflows the row stands for (identical workflows pooled in one row).
    ``clusters`` (optional, groups × rows): ``clusters[g, r]`` of row ``r``'s workflows belong to
    group ``g`` (a task run in several workflows: ``profiler fit --group-by``); each row's
    column sums to its weight.

    Without ``clusters`` every workflow is its own unit: the weighted variance of ``diff`` over
    the ``N`` workflows (ddof 1) over ``N``. With them the unit is the group (the cluster-robust
    estimate ``G/(G−1) · Σ_g (T_g − n_g·mean)² / N²`` with ``T_g`` the group's summed difference and
    ``n_g`` its workflows): trials of one task move together, so twenty trials of each of ten
    tasks are ten pieces of evidence, not two hundred."""
    d = np.asarray(diff, dtype=float)
    w = np.asarray(weights, dtype=float)
    n = float(w.sum())
    if n <= 0:
        return 0.0, 0.0
    mean = float(w @ d) / n
    if clusters is None:
        if n <= 1:
            return mean, 0.0
        var = float(w @ (d - mean) ** 2) / (n - 1)
        return mean, (var / n) ** 0.5
    m = np.asarray(clusters, dtype=float)
    m = m[m.sum(axis=1) > 0]
    g = len(m)
    if g < 2:
        return mean, 0.0
    resid = m @ d - m.sum(axis=1) * mean
    return mean, (g / (g - 1) * float(resid @ resid)) ** 0.5 / n
