"""Variable-order Markov model over a workflow's symbols (agents, or tools), with backoff.

The next symbol of a session is predicted from the last ``k ≤ max_order`` symbols seen, the
history starting with a start-of-session symbol :data:`START` so that "first call" and "second
call after the start" are contexts like any other; the symbol :data:`END` (no call follows) is
predicted like an agent, which gives ``p_end``.

Smoothing is interpolated Witten-Bell: with ``c(h, y)`` the training count of symbol ``y``
after context ``h``, ``c(h) = Σ_y c(h, y)``, ``T(h)`` the number of distinct symbols seen
after ``h`` and ``h'`` the context one symbol shorter,

    P(y | h) = (c(h, y) + β·T(h)·P(y | h')) / (c(h) + β·T(h)),

down to the empty context, which escapes to the uniform distribution over the vocabulary, END
and one more outcome, "a symbol never seen in training" (an agent created per task, as
CaptainAgent's experts are): :meth:`VariableOrderMarkov.novel_probability` is the mass that
outcome keeps, so a new agent gets a small probability instead of none (its log-loss is finite).
A context never seen (or pruned) is skipped: ``P(y | h) = P(y | h')``. Every level is a
convex combination of proper distributions, so the probabilities (novel outcome included) sum to 1. ``β`` (the escape
scale) and ``max_order`` are chosen by cross-validation by workflow
(:mod:`synth.sequence_select`). Contexts seen fewer than ``min_count`` times are pruned; when
more than ``max_contexts`` remain, ``min_count`` is raised until they fit (``min_count_``
records the value used), which bounds the section's size in profile.json.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np

#: Symbol before the first call of a session.
START = "^"
#: Symbol "no call follows".
END = "$"
#: Separator of the symbols of a context key in the serialized form.
SEP = "\x1f"


def context_counts(sequences: Sequence[Sequence[str]], weights: Sequence[float],
                   max_order: int) -> dict[tuple[str, ...], dict[str, float]]:
    """``counts[h][y]``: weighted count of ``y`` right after context ``h`` (``len(h) ≤
    max_order``; histories start with :data:`START`, every sequence ends with :data:`END`)."""
    counts: dict[tuple[str, ...], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for seq, w in zip(sequences, weights):
        history = (START, *seq)
        targets = (*seq, END)
        for t, y in enumerate(targets):
            for k in range(0, min(max_order, t + 1) + 1):
                counts[history[t + 1 - k:t + 1]][y] += w
    return counts


class VariableOrderMarkov:
    """Interpolated Witten-Bell variable-order Markov model (see the module docstring).

    Parameters: ``max_order`` (longest context), ``escape`` (β), ``min_count`` (contexts seen
    fewer times are pruned), ``max_contexts`` (size bound of the fitted table).
    Fitted attributes: ``vocab_`` (symbols, END last), ``contexts_`` (context tuple →
    (symbol indices, counts, total, distinct)), ``min_count_``.
    """

    def __init__(self, max_order: int = 8, escape: float = 1.0, min_count: int = 1,
                 max_contexts: int = 20_000) -> None:
        self.max_order = int(max_order)
        self.escape = float(escape)
        self.min_count = int(min_count)
        self.max_contexts = int(max_contexts)

    # -- fitting ----------------------------------------------------------------------------
    def fit(self, sequences: Sequence[Sequence[str]],
            weights: Sequence[float] | None = None) -> "VariableOrderMarkov":
        weights = [1.0] * len(sequences) if weights is None else list(weights)
        counts = context_counts(sequences, weights, self.max_order)
        return self._from_counts(counts)

    def _from_counts(self, counts: dict) -> "VariableOrderMarkov":
        symbols = sorted({y for row in counts.values() for y in row} - {END})
        self.vocab_ = [*symbols, END]
        self._index = {y: i for i, y in enumerate(self.vocab_)}
        totals = {h: sum(row.values()) for h, row in counts.items()}
        min_count = self.min_count
        kept = [h for h in counts if len(h) == 0 or totals[h] >= min_count]
        while len(kept) > self.max_contexts:
            min_count = max(min_count + 1, int(min_count * 1.5))
            kept = [h for h in kept if len(h) == 0 or totals[h] >= min_count]
        self.min_count_ = min_count
        self.contexts_ = {}
        for h in kept:
            row = counts[h]
            idx = np.array([self._index[y] for y in row], dtype=np.int64)
            cnt = np.array(list(row.values()), dtype=float)
            self.contexts_[h] = (idx, cnt, float(cnt.sum()), len(row))
        return self

    # -- prediction -------------------------------------------------------------------------
    def levels(self, history: Sequence[str], max_order: int | None = None,
               escape: float | None = None) -> Iterable[np.ndarray]:
        """``P(· | last k symbols)`` for k = 0 .. max_order, in that order (each a vector over
        :attr:`vocab_`); ``history`` is the session's symbols so far, without START."""
        max_order = self.max_order if max_order is None else min(max_order, self.max_order)
        beta = self.escape if escape is None else escape
        full = (START, *history[-max_order:]) if max_order else ()
        p = np.full(len(self.vocab_), 1.0 / (len(self.vocab_) + 1))
        for k in range(0, max_order + 1):
            if k > len(full):
                yield p
                continue
            entry = self.contexts_.get(tuple(full[len(full) - k:]))
            if entry is not None:
                idx, cnt, total, distinct = entry
                lam = beta * distinct
                p = p * (lam / (total + lam))
                np.add.at(p, idx, cnt / (total + lam))
            yield p

    def novel_probability(self, history: Sequence[str]) -> float:
        """Probability that the next symbol is one never seen in training: 1 − Σ predict_proba."""
        return max(0.0, 1.0 - float(self.predict_proba(history).sum()))

    def predict_proba(self, history: Sequence[str]) -> np.ndarray:
        """Probability of each symbol of :attr:`vocab_` (END last) coming next."""
        p = None
        for p in self.levels(history):
            pass
        return p

    def index_of(self, symbol: str) -> int | None:
        """Position of ``symbol`` in :attr:`vocab_` (None if never seen)."""
        return self._index.get(symbol)

    def distribution(self, history: Sequence[str]) -> dict[str, float]:
        """``{symbol: probability}`` of the next symbol, END included."""
        return dict(zip(self.vocab_, self.predict_proba(history).tolist()))

    # -- serialization ----------------------------------------------------------------------
    def to_dict(self) -> dict:
        """JSON-ready: params, vocabulary and the pruned context table (counts rounded)."""
        return {"max_order": self.max_order, "escape": self.escape,
                "min_count": self.min_count, "max_contexts": self.max_contexts,
                "min_count_used": self.min_count_, "vocab": self.vocab_,
                "contexts": {SEP.join(h): {self.vocab_[i]: round(float(c), 6)
                                           for i, c in zip(idx, cnt)}
                             for h, (idx, cnt, _, _) in self.contexts_.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "VariableOrderMarkov":
        model = cls(data["max_order"], data["escape"], data["min_count"],
                    data.get("max_contexts", 20_000))
        model.vocab_ = list(data["vocab"])
        model._index = {y: i for i, y in enumerate(model.vocab_)}
        model.min_count_ = int(data.get("min_count_used", model.min_count))
        model.contexts_ = {}
        for key, row in data["contexts"].items():
            h = tuple(key.split(SEP)) if key else ()
            idx = np.array([model._index[y] for y in row], dtype=np.int64)
            cnt = np.array(list(row.values()), dtype=float)
            model.contexts_[h] = (idx, cnt, float(cnt.sum()), len(row))
        return model
