"""Remaining work of a session given its context: calls (and seconds) still to come.

After the i-th call of a session (i = 0 for the first) whose last ``k`` symbols are ``h``,
the training workflows that passed the same point give an empirical distribution of the
number of calls that followed; the prediction is its median (the point that minimizes the
absolute error), its 90th percentile and its mean, plus the mean remaining seconds
(per-symbol mean latency + tool gap summed over the calls to come, the same quantity the
automaton's ``expected_remaining_s`` estimates).

Keys, from the most specific to the least:

    (last k symbols, position)  →  (last k−1, position)  →  …  →  (position)  →  0

where *position* is the exact call index (``position="index"``), a coarse bucket of it
(``"bucket"``: exact below 8, then half-octaves), or nothing (``"none"``: context only, the
position level then is the exact index). A context key seen fewer than ``min_n`` times is
skipped (back off one level); the position level is used whenever the index was seen in
training, exactly like the position-median baseline; a session longer than every training
workflow is predicted to end (0 calls to come, as the baseline does). ``k``, ``position``,
``min_n`` and the point prediction are chosen by cross-validation by workflow
(:mod:`synth.sequence_select`); ``k = 0`` with the median is the position-median baseline.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from synth.params import Params

SEP = "\x1f"


def position_bucket(i: int) -> int:
    """Call index → bucket: exact below 8, then two buckets per doubling."""
    return i if i < 8 else 8 + int(2 * math.log2(i / 8))


def _position(i: int, mode: str) -> str:
    if mode == "index":
        return str(i)
    if mode == "bucket":
        return "b" + str(position_bucket(i))
    return ""


def weighted_quantiles(values: np.ndarray, weights: np.ndarray,
                       qs: Sequence[float]) -> list[float]:
    """Lower weighted quantiles: the smallest value whose cumulative weight share ≥ q."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w) / w.sum()
    return [float(v[min(int(np.searchsorted(cum, q - 1e-12)), len(v) - 1)]) for q in qs]


def remaining_rows(sequences: Sequence[Sequence[str]], weights: Sequence[float],
                   timings: Mapping[str, tuple[float, float]] | None = None):
    """Yield (history, call index, remaining calls, remaining seconds, weight) per call."""
    timings = timings or {}
    for seq, w in zip(sequences, weights):
        per_call = np.array([sum(timings.get(a, (0.0, 0.0))) for a in seq])
        tail_s = np.cumsum(per_call[::-1])[::-1]
        n = len(seq)
        for i in range(n):
            yield seq, i, n - 1 - i, float(tail_s[i]), w


class RemainingWork(Params):
    """Context-conditioned remaining calls/seconds with quantiles (see the module docstring).

    ``point`` names the point prediction scored by ``profiler eval`` (``"p50"`` or ``"mean"``,
    chosen by validation).

    Fitted attributes: ``table_`` (key → [n, p50, p90, mean, mean_s]).
    """

    def __init__(self, order: int = 8, position: str = "bucket", min_n: int = 3,
                 max_keys: int = 20_000, point: str = "p50") -> None:
        if position not in ("index", "bucket", "none"):
            raise ValueError(f"position must be index, bucket or none, got {position!r}")
        self.order = int(order)
        self.position = position
        self.min_n = int(min_n)
        self.max_keys = int(max_keys)
        if point not in ("p50", "mean"):
            raise ValueError(f"point must be p50 or mean, got {point!r}")
        self.point = point

    def keys(self, history: Sequence[str], i: int) -> list[str]:
        """Lookup keys after call ``i`` with ``history`` = symbols up to and including it,
        most specific first."""
        pos = _position(i, self.position)
        out = [SEP.join(history[len(history) - k:]) + "|" + pos
               for k in range(min(self.order, len(history)), 0, -1)]
        out.append("|i" + str(i))
        return out

    def fit(self, sequences: Sequence[Sequence[str]], weights: Sequence[float] | None = None,
            timings: Mapping[str, tuple[float, float]] | None = None) -> "RemainingWork":
        weights = [1.0] * len(sequences) if weights is None else list(weights)
        # every call's (remaining calls, seconds, weight) and the ids of its lookup keys; the keys
        # read only the last ``order`` symbols and the index, so they are built once per pair
        # (workflows share their prefixes)
        key_ids: dict[str, int] = {}
        pair_keys: dict[tuple, list[int]] = {}
        rows, call_keys = [], []
        for seq, i, r, r_s, w in remaining_rows(sequences, weights, timings):
            ctx = (tuple(seq[max(0, i + 1 - self.order):i + 1]), i)
            ids = pair_keys.get(ctx)
            if ids is None:
                ids = pair_keys[ctx] = [key_ids.setdefault(k, len(key_ids)) for k in self.keys(*ctx)]
            rows.append((r, r_s, w))
            call_keys.append(ids)
        table = {}
        if rows:
            # each key's rows in call order (a stable sort by key id): the (rows × 3) array a
            # per-key list of those rows would give, so the statistics are the same to the bit
            flat = np.fromiter((k for ids in call_keys for k in ids), dtype=np.int64)
            owner = np.repeat(np.arange(len(rows)), [len(ids) for ids in call_keys])
            order = np.argsort(flat, kind="stable")
            starts = np.searchsorted(flat[order], np.arange(len(key_ids) + 1))
            values = np.asarray(rows, dtype=float)
            owner = owner[order]
            for key, g in key_ids.items():
                arr = values[owner[starts[g]:starts[g + 1]]]
                n = arr[:, 2].sum()
                if n < self.min_n and not key.startswith("|"):  # position keys always kept
                    continue
                p50, p90 = weighted_quantiles(arr[:, 0], arr[:, 2], (0.5, 0.9))
                table[key] = [round(float(n), 3), p50, p90,
                              round(float(np.average(arr[:, 0], weights=arr[:, 2])), 4),
                              round(float(np.average(arr[:, 1], weights=arr[:, 2])), 4)]
        if len(table) > self.max_keys:  # keep the best-supported keys (positions always)
            ranked = sorted(table, key=lambda k: (not k.startswith("|"), -table[k][0], k))
            table = {k: table[k] for k in ranked[:self.max_keys]}
        self.table_ = table
        return self

    def add_backoff(self, other: "RemainingWork") -> "RemainingWork":
        """Add the keys of ``other`` (the same workflows read in a coarser alphabet: plain
        agents beside agents with stages) that this table lacks, so that a session reporting
        no stage backs off to the plain-agent context instead of the call index. A key both
        tables hold keeps this table's row (what validation scored); over ``max_keys`` the
        added keys with the least support go first. Returns self."""
        added = sorted((k for k in other.table_ if k not in self.table_),
                       key=lambda k: (-other.table_[k][0], k))
        room = max(self.max_keys - len(self.table_), 0)
        for key in added[:room]:
            self.table_[key] = list(other.table_[key])
        return self

    def lookup(self, history: Sequence[str], i: int, order: int | None = None,
               min_n: float | None = None) -> list:
        """The table row used after call ``i``: the most specific key with at least ``min_n``
        training calls, contexts at most ``order`` long (defaults: the fitted ones; smaller
        values let cross-validation score sub-models of one table)."""
        order = self.order if order is None else min(order, self.order)
        min_n = self.min_n if min_n is None else min_n
        for key in self.keys(history[len(history) - order:] if order else (), i):
            row = self.table_.get(key)
            if row is not None and (row[0] >= min_n or key.startswith("|")):
                return row
        return [0.0, 0.0, 0.0, 0.0, 0.0]

    def predict(self, history: Sequence[str], i: int) -> dict:
        """``{"p50", "p90", "mean", "mean_s", "n"}`` after call ``i`` (``history`` = symbols
        up to and including it; only the last :attr:`order` are read)."""
        row = self.lookup(history, i)
        out = {"n": row[0], "p50": row[1], "p90": row[2], "mean": row[3], "mean_s": row[4]}
        out["point"] = out[self.point]
        return out

    def to_dict(self) -> dict:
        return {"order": self.order, "position": self.position, "min_n": self.min_n,
                "max_keys": self.max_keys, "point": self.point, "table": self.table_}

    @classmethod
    def from_dict(cls, data: dict) -> "RemainingWork":
        model = cls(data["order"], data["position"], data["min_n"], data.get("max_keys",
        20_000),
                    data.get("point", "p50"))
        model.table_ = {k: list(v) for k, v in data["table"].items()}
        return model
