"""Variable-order Markov model over a workflow's symbols (agents, or tools), with backoff.

The next symbol is predicted from the last ``k <= max_order`` symbols (the history starts with
:data:`START`; :data:`END` is predicted like an agent, which gives ``p_end``), smoothed by
interpolated Witten-Bell down to a uniform escape that keeps mass for an agent never seen:

    P(y | h) = (c(h, y) + β·T(h)·P(y | h')) / (c(h) + β·T(h)).

``β``, ``max_order`` and ``min_context`` (sparse contexts skipped at prediction time) are chosen
by validation (:mod:`synth.sequence_select`); contexts may be read in a richer alphabet (tool
marks, stages) than the predicted symbols. The model in full: docs/workflow-paths.md,
"The variable-order model (synth/vomm.py)".
"""
from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

from synth.params import Params

#: Symbol before the first call of a session.
START = "^"
#: Symbol "no call follows".
END = "$"
#: Separator of the symbols of a context key in the serialized form.
SEP = "\x1f"
#: Symbol used, in the tool alphabet, for a call after which no tool ran.
NO_TOOL = "no_tool"
#: Separator between an agent and its tool mark in the ``agent_tool`` alphabet.
MARK_SEP = "\x1e"
#: Marks: the call's response called a tool, or did not.
TOOL_MARK, NO_TOOL_MARK = "tool", "none"
#: Separator between an agent and its stage (before any tool mark) in the ``agent_stage``
#: alphabets.
STAGE_SEP = "\x1d"
#: Context families: which parts of a call's symbol (stage, tool mark) a context reads.
FAMILY_PARTS = {"agent": (False, False), "agent_tool": (False, True),
                "agent_stage": (True, False), "agent_stage_tool": (True, True)}


def stage_symbol(agent: str, stage: object) -> str:
    """Context symbol of a call at its arrival: its agent and its ``stage`` (a non-empty
    string; anything else, e.g. not reported, leaves the plain agent)."""
    if isinstance(stage, str) and stage:
        return f"{agent}{STAGE_SEP}{stage}"
    return agent


def strip_tool_mark(symbol: str) -> str:
    """``symbol`` without its tool mark: what was known of the call at its arrival."""
    return symbol.split(MARK_SEP, 1)[0]


@lru_cache(maxsize=1 << 16)
def project(symbol: str, family: str) -> str:
    """``symbol`` (agent, optional stage, optional tool mark) read in context ``family``
    (a key of :data:`FAMILY_PARTS`): the parts that family does not read are dropped."""
    with_stage, with_mark = FAMILY_PARTS[family]
    rest, _, mark = symbol.partition(MARK_SEP)
    agent, _, stage = rest.partition(STAGE_SEP)
    out = f"{agent}{STAGE_SEP}{stage}" if with_stage and stage else agent
    return f"{out}{MARK_SEP}{mark}" if with_mark and mark else out


def project_all(sequences: Iterable[Sequence[str]], family: str) -> list[tuple[str, ...]]:
    """Every symbol of every sequence read in ``family`` (:func:`project`)."""
    return [tuple(project(c, family) for c in q) for q in sequences]


def families_of(alphabet: str) -> tuple[str, ...]:
    """The context families a sequence read in ``alphabet`` offers, simplest first: the
    plain agents, then each part alone, then both."""
    with_stage, with_mark = FAMILY_PARTS[alphabet]
    return tuple(f for f, (st, mk) in FAMILY_PARTS.items()
                 if (with_stage or not st) and (with_mark or not mk))


def family_rank(family: str) -> int:
    """How many parts beyond the agent a family reads (the one-SE rule's simplicity)."""
    return sum(FAMILY_PARTS[family])


def tool_mark(agent: str, tool_names: Sequence[str] | None) -> str:
    """Context symbol of a finished call: its agent and whether its response called a tool
    (``tool_names`` has a non-empty name); ``None`` (not reported) leaves the plain agent."""
    if tool_names is None:
        return agent
    called = any(isinstance(t, str) and t for t in tool_names)
    return f"{agent}{MARK_SEP}{TOOL_MARK if called else NO_TOOL_MARK}"


def unmark(symbol: str) -> str:
    """The agent of a context symbol (:func:`tool_mark` and :func:`stage_symbol` undone)."""
    return symbol.split(MARK_SEP, 1)[0].split(STAGE_SEP, 1)[0]


def context_counts(sequences: Sequence[Sequence[str]], weights: Sequence[float],
                   max_order: int, contexts: Sequence[Sequence[str]] | None = None
                   ) -> dict[tuple[str, ...], dict[str, float]]:
    """``counts[h][y]``: weighted count of ``y`` right after context ``h`` (``len(h) ≤
    max_order``; histories start with :data:`START`, every sequence ends with :data:`END`).

    ``contexts[s]`` (optional, as long as ``sequences[s]``): the context symbols of the calls;
    each target is then counted after the arrival-time history (last symbol plain) and after
    the response-time history (all context symbols), see the module docstring."""
    counts: dict[tuple[str, ...], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s, (seq, w) in enumerate(zip(sequences, weights)):
        history = (START, *seq)
        targets = (*seq, END)
        marked = (START, *contexts[s]) if contexts is not None else None
        for t, y in enumerate(targets):
            for k in range(0, min(max_order, t + 1) + 1):
                counts[history[t + 1 - k:t + 1]][y] += w
            if marked is None or t == 0:
                continue
            arrival = (*marked[:t], strip_tool_mark(marked[t]))
            for k in range(1, min(max_order, t + 1) + 1):
                seen = {history[t + 1 - k:t + 1]}
                for h in (arrival[t + 1 - k:], marked[t + 1 - k:t + 1]):
                    if h not in seen:  # a context already counted for this target is not again
                        seen.add(h)
                        counts[h][y] += w
    return counts


class VariableOrderMarkov(Params):
    """Interpolated Witten-Bell variable-order Markov model (see the module docstring).

    Parameters: ``max_order`` (longest context), ``escape`` (β), ``min_count`` (contexts seen
    fewer times are pruned), ``max_contexts`` (size bound of the fitted table),
    ``min_context`` (contexts with fewer training observations are skipped at prediction time:
    the sparse-context backoff of the module docstring).
    Fitted attributes: ``vocab_`` (symbols, END last), ``contexts_`` (context tuple →
    (symbol indices, counts, total, distinct)), ``min_count_``.
    """

    def __init__(self, max_order: int = 8, escape: float = 1.0, min_count: int = 1,
                 max_contexts: int = 20_000, min_context: float = 1.0) -> None:
        self.max_order = int(max_order)
        self.min_context = float(min_context)
        self.escape = float(escape)
        self.min_count = int(min_count)
        self.max_contexts = int(max_contexts)

    # -- fitting ----------------------------------------------------------------------------
    def fit(self, sequences: Sequence[Sequence[str]],
            weights: Sequence[float] | None = None,
            contexts: Sequence[Sequence[str]] | None = None) -> "VariableOrderMarkov":
        """Count ``sequences`` (``weights`` per sequence; ``contexts``: optional context
        symbols per call, see the module docstring)."""
        weights = [1.0] * len(sequences) if weights is None else list(weights)
        if contexts is not None and any(len(c) != len(q) for c, q in zip(contexts, sequences)):
            raise ValueError("contexts must give one context symbol per call of each sequence")
        counts = context_counts(sequences, weights, self.max_order, contexts)
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
               escape: float | None = None, min_context: float | None = None
               ) -> Iterable[np.ndarray]:
        """``P(· | last k symbols)`` for k = 0 .. max_order, in that order (each a vector over
        :attr:`vocab_`); ``history`` is the session's symbols so far, without START. Contexts
        with fewer than ``min_context`` training observations (default: the fitted value) are
        skipped."""
        max_order = self.max_order if max_order is None else min(max_order, self.max_order)
        beta = self.escape if escape is None else escape
        floor = self.min_context if min_context is None else min_context
        full = (START, *history[-max_order:]) if max_order else ()
        p = np.full(len(self.vocab_), 1.0 / (len(self.vocab_) + 1))
        for k in range(0, max_order + 1):
            if k > len(full):
                yield p
                continue
            entry = self.contexts_.get(tuple(full[len(full) - k:]))
            if entry is not None and (k == 0 or entry[2] >= floor):
                idx, cnt, total, distinct = entry
                lam = beta * distinct
                p = p * (lam / (total + lam))
                np.add.at(p, idx, cnt / (total + lam))
            yield p

    def level_grid(self, history: Sequence[str], max_order: int, escapes: Sequence[float],
                   min_contexts: Sequence[float]) -> np.ndarray:
        """:meth:`levels` for every ``min_context`` × ``escape`` at once, in one pass over the
        contexts: ``out[f, e, k]`` is ``list(self.levels(history, max_order, escapes[e],
        min_contexts[f]))[k]`` to the bit (the same products and sums per element: a skipped
        context multiplies by 1 and adds 0). Model selection scores every candidate of the
        grid on each held-out history; this is its cost in one pass instead of one per pair."""
        max_order = min(max_order, self.max_order)
        full = (START, *history[-max_order:]) if max_order else ()
        betas = np.asarray(escapes, dtype=float)
        floors = np.asarray(min_contexts, dtype=float)
        size = len(self.vocab_)
        out = np.empty((len(floors), len(betas), max_order + 1, size))
        p = np.full((len(floors), len(betas), size), 1.0 / (size + 1))
        for k in range(0, max_order + 1):
            entry = self.contexts_.get(tuple(full[len(full) - k:])) if k <= len(full) else None
            if entry is not None:
                idx, cnt, total, distinct = entry
                lam = betas * distinct
                active = (floors <= total) if k else np.ones(len(floors), dtype=bool)
                p = p * np.where(active[:, None], lam / (total + lam), 1.0)[:, :, None]
                p[:, :, idx] += np.where(active[:, None, None],
                                         (cnt[None, :] / (total + lam)[:, None])[None], 0.0)
            out[:, :, k] = p
        return out

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
                "min_context": self.min_context, "min_count_used": self.min_count_, "vocab": self.vocab_,
                "contexts": {SEP.join(h): {self.vocab_[i]: round(float(c), 6)
                                           for i, c in zip(idx, cnt)}
                             for h, (idx, cnt, _, _) in self.contexts_.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "VariableOrderMarkov":
        model = cls(data["max_order"], data["escape"], data["min_count"],
                    data.get("max_contexts", 20_000), data.get("min_context", 1.0))
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
