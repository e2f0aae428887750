"""Naive baselines for next-agent and remaining-calls predictions, stored at fit time.

``profiler eval`` scores them on the same held-out split as the fitted model, so the section
keeps what they need in compact form:

* ``markov1``: first-order Markov chain, ``{previous symbol (START first): {next: count}}``;
  predicts the most frequent next symbol after the previous one (no smoothing: add-one
  does not change the arg-max), the most frequent next symbol overall for an unseen one.
* ``markov_vo``: plain variable-order Markov with simple backoff: for each context of at
  most 8 symbols seen in training (START-prefixed when shorter than the history), the most
  frequent next symbol; predicts from the longest context seen. Contexts seen once are
  dropped only when more than ``max_contexts`` remain (recorded in ``min_count``).
* ``position_median``: median remaining calls after the i-th call of a workflow.

**Log-loss.** Both Markov baselines also give a probability of the actual next agent, for the
log-loss column beside ours: add-one (Laplace) smoothing over the agents seen in training and END
at the context that predicts (the previous symbol; the longest context seen), p = (c(h, y) + 1) /
(c(h) + V). END stays in the distribution (as in ours, which predicts ``p_end``), so a one-agent
workflow does not get p = 1 for free. ``markov_vo`` stores its contexts' counts for this (``counts``); a profile written
before has only the arg-max and gives no log-loss.

Add-one is a weak smoother: with V agents it moves V/(c(h) + V) of the mass off what was seen,
so on a sparse context its log-loss is poor whatever the order. ``markov_wb`` scores the same
stored counts with **interpolated Witten–Bell** smoothing (the estimator PPM-C uses), the
properly smoothed variable-order Markov a reader would compare against:

    P(y | h) = (c(h, y) + T(h) · P(y | h')) / (c(h) + T(h)),

where ``h'`` is ``h`` without its oldest symbol, ``T(h)`` the number of distinct symbols seen
after ``h`` (the evidence that a new one may follow) and the recursion ends in the uniform
distribution over the training symbols (END included) plus one unseen symbol. Contexts pruned at
fit time (``min_count``) are skipped. Its top-1 is the arg-max of that mixture (END excluded).

END is not a candidate: the baselines are scored, like the model, on "which agent calls
next" after every call but the last.

**Served as candidates.** :meth:`BaselinePredictor.distribution` gives each Markov baseline's
probability of every training symbol and of one never seen (``UNSEEN``), computed by the very
methods ``profiler eval`` scores it with, and :meth:`BaselinePredictor.top1` its top-1: the
next-agent prediction a workflow type serves may be one of them (:mod:`synth.next_served`).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Sequence

import numpy as np

from synth.remaining import weighted_quantiles
from synth.vomm import END, SEP, START, context_counts

VO_ORDER = 8
#: The Markov baselines, simplest first (the order :mod:`synth.next_served` breaks ties in).
MARKOV_BASELINES = ("markov1", "markov_vo", "markov_wb")
#: Key of a distribution's mass for a symbol never seen in training.
UNSEEN = "\0unseen"


def _argmax(row: dict[str, float]) -> str | None:
    row = {y: c for y, c in row.items() if y != END}
    return min(row, key=lambda y: (-row[y], y)) if row else None


def fit_baselines(sequences: Sequence[Sequence[str]], weights: Sequence[float],
                  max_contexts: int = 20_000) -> dict:
    """The ``baselines`` block of a workflow section (see the module docstring)."""
    first: dict[str, Counter] = defaultdict(Counter)
    for seq, w in zip(sequences, weights):
        for prev, nxt in zip((START, *seq), (*seq, END)):
            first[prev][nxt] += w
    counts = context_counts(sequences, weights, VO_ORDER)
    totals = {h: sum(c for y, c in row.items() if y != END) for h, row in counts.items()}
    kept = [h for h in counts if totals[h] > 0]
    min_count = 1
    while len(kept) > max_contexts:
        min_count += 1
        kept = [h for h in kept if len(h) == 0 or totals[h] >= min_count]
    lengths: Counter = Counter()
    for seq, w in zip(sequences, weights):
        lengths[len(seq)] += w
    longest = max(lengths, default=0)
    medians = []
    values = np.array(list(lengths), dtype=float)
    mass = np.array(list(lengths.values()), dtype=float)
    for i in range(longest):
        alive = values > i
        medians.append(weighted_quantiles(values[alive] - 1 - i, mass[alive], (0.5,))[0])
    return {"markov1": {prev: {y: round(float(c), 6) for y, c in row.items()}
                        for prev, row in first.items()},
            "markov_vo": {"min_count": min_count,
                          "argmax": {SEP.join(h): _argmax(counts[h]) for h in kept},
                          "counts": {SEP.join(h): {y: round(float(c), 6) for y, c in counts[h].items()
                                                   if c > 0} for h in kept}},
            "position_median": medians}


class BaselinePredictor:
    """Top-1 next symbol and remaining calls of the baselines of one section."""

    def __init__(self, block: dict) -> None:
        self.first = {prev: _argmax(row) for prev, row in block["markov1"].items()}
        overall: Counter = Counter()
        for row in block["markov1"].values():
            overall.update(row)
        self.overall = _argmax(dict(overall))
        self.vo = block["markov_vo"]["argmax"]
        self.vo_counts = block["markov_vo"].get("counts")
        self.counts1 = {prev: dict(row) for prev, row in block["markov1"].items()}
        self.vocab = {y for row in self.counts1.values() for y in row} | {END}
        self.position = block["position_median"]

    def _laplace(self, row: dict[str, float] | None, actual: str) -> float:
        """(c(h, y) + 1) / (c(h) + V) over the V training agents (an agent never seen in
        training: one more symbol in the denominator)."""
        row = row or {}
        v = len(self.vocab) + (actual not in self.vocab)
        return (row.get(actual, 0.0) + 1.0) / (sum(row.values()) + v)

    def markov1_probability(self, history: Sequence[str], actual: str) -> float:
        """P(actual | previous symbol), add-one smoothed (the overall counts for an unseen one)."""
        prev = history[-1] if history else START
        row = self.counts1.get(prev)
        if row is None:
            row = {}
            for r in self.counts1.values():
                for y, c in r.items():
                    row[y] = row.get(y, 0.0) + c
        return self._laplace(row, actual)

    def markov_vo_probability(self, history: Sequence[str], actual: str) -> float | None:
        """P(actual | longest context seen), add-one smoothed; None for an older profile."""
        if self.vo_counts is None:
            return None
        full = (START, *history)
        for k in range(min(VO_ORDER, len(full)), -1, -1):
            row = self.vo_counts.get(SEP.join(full[len(full) - k:]))
            if row:
                return self._laplace(row, actual)
        return self._laplace({}, actual)

    def markov_wb_distribution(self, history: Sequence[str]) -> dict[str, float] | None:
        """Witten–Bell interpolated P(· | history) over the training symbols (END included; the
        module docstring); ``"\0unseen"`` holds the mass of a symbol never seen in training.
        None for an older profile (no stored counts)."""
        if self.vo_counts is None:
            return None
        symbols = sorted(self.vocab)
        p = np.full(len(symbols) + 1, 1.0 / (len(symbols) + 1))
        index = {y: i for i, y in enumerate(symbols)}
        full = (START, *history)
        for k in range(0, min(VO_ORDER, len(full)) + 1):
            row = self.vo_counts.get(SEP.join(full[len(full) - k:]))
            if not row:
                continue
            c = np.zeros(len(p))
            for y, n in row.items():
                c[index.get(y, len(symbols))] += n
            distinct = float(np.count_nonzero(c))
            p = (c + distinct * p) / (c.sum() + distinct)
        return {**dict(zip(symbols, p[:-1].tolist())), UNSEEN: float(p[-1])}

    def markov_wb_probability(self, history: Sequence[str], actual: str) -> float | None:
        """P(actual | history) under :meth:`markov_wb_distribution` (an agent never seen in
        training gets the unseen mass)."""
        dist = self.markov_wb_distribution(history)
        if dist is None:
            return None
        return dist.get(actual, dist[UNSEEN])

    def markov_wb(self, history: Sequence[str]) -> str | None:
        """Top-1 next agent of the Witten–Bell mixture (END and the unseen mass excluded)."""
        dist = self.markov_wb_distribution(history)
        return None if dist is None else self.markov_wb_from(dist)

    def distribution(self, name: str, history: Sequence[str]) -> dict[str, float] | None:
        """``{symbol: p}`` of baseline ``name`` (one of :data:`MARKOV_BASELINES`) over the
        training symbols (END included) and :data:`UNSEEN` (the probability it gives an agent
        never seen in training), each the value its ``*_probability`` method gives that symbol:
        what ``profiler eval`` scores. None where the profile lacks the counts."""
        if name == "markov_wb":
            return self.markov_wb_distribution(history)
        prob = {"markov1": self.markov1_probability, "markov_vo": self.markov_vo_probability}[name]
        if prob(history, END) is None:
            return None
        return {y: prob(history, y) for y in (*sorted(self.vocab), UNSEEN)}

    def top1(self, name: str, history: Sequence[str]) -> str | None:
        """Baseline ``name``'s top-1 next agent (what ``profiler eval`` scores)."""
        return {"markov1": self.markov1, "markov_vo": self.markov_vo,
                "markov_wb": self.markov_wb}[name](history)

    @staticmethod
    def markov_wb_from(dist: dict[str, float]) -> str | None:
        """The top-1 of a :meth:`markov_wb_distribution`."""
        return _argmax({y: p for y, p in dist.items() if y != UNSEEN})

    def markov1(self, history: Sequence[str]) -> str | None:
        prev = history[-1] if history else START
        return self.first.get(prev) or self.overall

    def markov_vo(self, history: Sequence[str]) -> str | None:
        full = (START, *history)
        for k in range(min(VO_ORDER, len(full)), -1, -1):
            guess = self.vo.get(SEP.join(full[len(full) - k:]))
            if guess is not None:
                return guess
        return self.overall

    def position_median(self, i: int) -> float:
        return self.position[i] if i < len(self.position) else 0.0
