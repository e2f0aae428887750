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
    codes, uniq = pd.factorize(np.asarray(groups), sort=True)  # hashing; uniq in sorted order
    place = np.random.default_rng(seed).permutation(len(uniq))
    return (place % max(int(n_folds), 1))[codes]
