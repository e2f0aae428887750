"""Probabilistic finite automata learned from step sequences (ALERGIA), and their pruning.

**Prefix-tree acceptor.** Every training sequence is a path from the root; each node counts
how many sequences pass through it, how many end there and how many take each symbol.

**ALERGIA** (Carrasco & Oncina 1994) turns that tree into a smaller deterministic PFA whose
loops generalize (``engineer engineer engineer`` becomes a loop on one state). It walks the
tree in red-blue order: red states are final, blue states are the roots of still untouched
sub-trees hanging off red ones. Each blue state is merged into the first red state that is
*compatible* with it, else promoted to red. Two states are compatible when, for the stop
event and for every symbol, their empirical frequencies pass Hoeffding's test

    | f1/n1 - f2/n2 | <  sqrt(½ ln(2/α)) · (1/√n1 + 1/√n2)

and, recursively, so do the states reached by the same symbol. Smaller ``alpha`` widens the
bound, so more states merge. A merge redirects the blue state's incoming edge to the red
state and folds the blue sub-tree into it, adding counts.

**Pruning** drops every transition whose probability is below ``prune`` (stops are kept, see
:func:`prune`), removes states that became unreachable or can no longer reach a stop, and lets
the remaining counts renormalize: ``p(q, a) = count(q, a) / (stop(q) + Σ_b count(q, b))``.

Widths of fan-out steps ride along: every transition keeps a histogram of the group widths
that crossed it, added up by merges.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence


@dataclass
class PFA:
    """A deterministic PFA with counts. State 0 is the initial state.

    ``trans[q][a]`` is the target of symbol ``a`` from ``q``; ``counts[q][a]`` how many training
    sequences took it; ``widths[q][a]`` the histogram of fan-out widths on it; ``stops[q]`` how
    many sequences ended in ``q``. Probabilities are ratios of these counts.
    """

    trans: dict[int, dict[str, int]] = field(default_factory=dict)
    counts: dict[int, dict[str, int]] = field(default_factory=dict)
    widths: dict[int, dict[str, Counter]] = field(default_factory=dict)
    stops: dict[int, int] = field(default_factory=dict)
    initial: int = 0

    # -- construction -------------------------------------------------------------------
    def _new_state(self) -> int:
        q = max(self.trans, default=-1) + 1
        self.trans[q], self.counts[q], self.widths[q], self.stops[q] = {}, {}, {}, 0
        return q

    @classmethod
    def prefix_tree(cls, sequences: Iterable[Sequence[str]],
                    widths: Iterable[Sequence[int]] | None = None,
                    weights: Iterable[int] | None = None) -> "PFA":
        """The prefix-tree acceptor of ``sequences`` (each a list of symbols); ``weights``
        says how many workflows each sequence stands for (default 1)."""
        pta = cls()
        pta._new_state()
        width_iter = iter(widths) if widths is not None else None
        weight_iter = iter(weights) if weights is not None else None
        for seq in sequences:
            seq_widths = next(width_iter) if width_iter is not None else [1] * len(seq)
            n = int(next(weight_iter)) if weight_iter is not None else 1
            q = pta.initial
            for symbol, width in zip(seq, seq_widths):
                pta.counts[q][symbol] = pta.counts[q].get(symbol, 0) + n
                pta.widths[q].setdefault(symbol, Counter())[int(width)] += n
                if symbol not in pta.trans[q]:
                    pta.trans[q][symbol] = pta._new_state()
                q = pta.trans[q][symbol]
            pta.stops[q] += n
        return pta

    # -- probabilities ------------------------------------------------------------------
    def total(self, q: int) -> int:
        """Number of sequences that passed through ``q`` (stopped there or left it)."""
        return self.stops[q] + sum(self.counts[q].values())

    def prob(self, q: int, symbol: str) -> float:
        n = self.total(q)
        return self.counts[q].get(symbol, 0) / n if n else 0.0

    def stop_prob(self, q: int) -> float:
        n = self.total(q)
        return self.stops[q] / n if n else 0.0

    @property
    def states(self) -> list[int]:
        return sorted(self.trans)

    @property
    def alphabet(self) -> list[str]:
        return sorted({a for t in self.trans.values() for a in t})

    def run(self, symbols: Sequence[str]) -> int | None:
        """State reached after reading ``symbols``, or None when a symbol has no transition."""
        q = self.initial
        for symbol in symbols:
            q = self.trans[q].get(symbol)
            if q is None:
                return None
        return q

    def accepts(self, symbols: Sequence[str]) -> bool:
        """True when the whole sequence is a path that ends in a state with a stop."""
        q = self.run(symbols)
        return q is not None and self.stops[q] > 0

    def width_counts(self, symbol: str) -> Counter:
        """Histogram of fan-out widths of ``symbol`` over all its transitions."""
        total: Counter = Counter()
        for q in self.trans:
            total.update(self.widths[q].get(symbol, {}))
        return total

    # -- serialization ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "initial": self.initial,
            "states": [
                {"id": q, "stops": self.stops[q], "total": self.total(q),
                 "p_stop": self.stop_prob(q),
                 "transitions": [
                     {"symbol": a, "to": self.trans[q][a], "count": self.counts[q][a],
                      "p": self.prob(q, a),
                      "widths": {str(w): c for w, c in sorted(self.widths[q][a].items())}}
                     for a in sorted(self.trans[q])]}
                for q in self.states],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "PFA":
        pfa = cls(initial=int(data["initial"]))
        for state in data["states"]:
            q = int(state["id"])
            pfa.stops[q] = state["stops"]  # int, or a float pseudo-count (synth.counting)
            pfa.trans[q] = {t["symbol"]: int(t["to"]) for t in state["transitions"]}
            pfa.counts[q] = {t["symbol"]: t["count"] for t in state["transitions"]}
            pfa.widths[q] = {t["symbol"]: Counter({int(w): int(c) for w, c in t["widths"].items()})
                             for t in state["transitions"]}
        return pfa


def hoeffding_different(f1: int, n1: int, f2: int, n2: int, alpha: float) -> bool:
    """ALERGIA's test: do frequencies f1/n1 and f2/n2 differ at confidence level ``alpha``?"""
    if n1 == 0 or n2 == 0:
        return False
    bound = math.sqrt(0.5 * math.log(2.0 / alpha)) * (1.0 / math.sqrt(n1) + 1.0 / math.sqrt(n2))
    return abs(f1 / n1 - f2 / n2) > bound


def _compatible(pfa: PFA, red: int, blue: int, alpha: float) -> bool:
    """Recursive ALERGIA compatibility of ``red`` and the tree rooted at ``blue``."""
    stack, seen = [(red, blue)], set()
    while stack:
        x, y = stack.pop()
        if (x, y) in seen:
            continue
        seen.add((x, y))
        nx, ny = pfa.total(x), pfa.total(y)
        if hoeffding_different(pfa.stops[x], nx, pfa.stops[y], ny, alpha):
            return False
        for symbol in set(pfa.counts[x]) | set(pfa.counts[y]):
            if hoeffding_different(pfa.counts[x].get(symbol, 0), nx,
                                   pfa.counts[y].get(symbol, 0), ny, alpha):
                return False
            if symbol in pfa.trans[x] and symbol in pfa.trans[y]:
                stack.append((pfa.trans[x][symbol], pfa.trans[y][symbol]))
    return True


def _fold(pfa: PFA, red: int, blue: int) -> None:
    """Fold the tree rooted at ``blue`` into ``red``, adding counts (blue states die)."""
    stack = [(red, blue)]
    while stack:
        x, y = stack.pop()
        pfa.stops[x] += pfa.stops[y]
        for symbol, target in pfa.trans[y].items():
            pfa.counts[x][symbol] = pfa.counts[x].get(symbol, 0) + pfa.counts[y][symbol]
            pfa.widths[x].setdefault(symbol, Counter()).update(pfa.widths[y][symbol])
            if symbol in pfa.trans[x]:
                stack.append((pfa.trans[x][symbol], target))
            else:
                pfa.trans[x][symbol] = target
        for table in (pfa.trans, pfa.counts, pfa.widths, pfa.stops):
            del table[y]


def alergia(pta: PFA, alpha: float = 0.05) -> PFA:
    """Merge the states of a prefix-tree acceptor with ALERGIA (modifies and returns ``pta``).

    Blue states are processed most-frequent first (ties by symbol path), the classic order
    that decides merges on the best-supported evidence first.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    red = [pta.initial]
    red_set = {pta.initial}
    while True:
        blues = [(pta.total(t), q, a, t) for q in red for a, t in pta.trans[q].items()
                 if t not in red_set]
        if not blues:
            break
        _, parent, symbol, blue = max(blues, key=lambda b: (b[0], -b[1], b[2]))
        for r in red:
            if _compatible(pta, r, blue, alpha):
                pta.trans[parent][symbol] = r
                _fold(pta, r, blue)
                break
        else:
            red.append(blue)
            red_set.add(blue)
    return _renumber(pta)


def _renumber(pfa: PFA, index_out: dict[int, int] | None = None) -> PFA:
    """Renumber live states 0..n-1 in breadth-first order from the initial state
    (``index_out``, when given, receives the old → new numbering)."""
    order, index = [pfa.initial], {pfa.initial: 0}
    for q in order:
        for a in sorted(pfa.trans[q]):
            t = pfa.trans[q][a]
            if t not in index:
                index[t] = len(order)
                order.append(t)
    out = PFA(initial=0)
    for q in order:
        n = index[q]
        out.stops[n] = pfa.stops[q]
        out.trans[n] = {a: index[t] for a, t in pfa.trans[q].items()}
        out.counts[n] = dict(pfa.counts[q])
        out.widths[n] = {a: Counter(c) for a, c in pfa.widths[q].items()}
    if index_out is not None:
        index_out.update(index)
    return out


def co_reachable(successors: Mapping[int, Iterable[int]], alive: Iterable[int]) -> set[int]:
    """``alive`` plus every state of ``successors`` from which one of them can be reached
    (a fixed point: add states with an edge into the set until none is added)."""
    alive = set(alive)
    changed = True
    while changed:
        changed = False
        for q, targets in successors.items():
            if q not in alive and any(t in alive for t in targets):
                alive.add(q)
                changed = True
    return alive


def learn_pfa(sequences: Sequence[Sequence[str]], widths: Sequence[Sequence[int]] | None = None,
              alpha: float = 0.05, weights: Sequence[int] | None = None) -> PFA:
    """Prefix tree of ``sequences`` merged by ALERGIA."""
    return alergia(PFA.prefix_tree(sequences, widths, weights), alpha=alpha)


def prune(pfa: PFA, threshold: float = 0.05) -> PFA:
    """Copy of ``pfa`` without transitions of probability < ``threshold``, trimmed.

    Probabilities are judged on the unpruned counts. Stops are never pruned: in a loop state
    the per-visit stop probability is small by nature (a loop run 40 times stops with p ≈
    1/40 per visit), and pruning it would cut every long loop off. States that are then
    unreachable from the initial state, or from which no stop is reachable, are removed with
    their edges. The initial state is always kept (an automaton that accepts nothing has just
    that state).
    """
    out = PFA(initial=pfa.initial)
    for q in pfa.states:
        n = pfa.total(q)
        keep = [a for a in pfa.trans[q] if n and pfa.counts[q][a] / n >= threshold]
        out.trans[q] = {a: pfa.trans[q][a] for a in keep}
        out.counts[q] = {a: pfa.counts[q][a] for a in keep}
        out.widths[q] = {a: Counter(pfa.widths[q][a]) for a in keep}
        out.stops[q] = pfa.stops[q]
    # trim: reachable from the initial state and co-reachable to a stop
    reach, frontier = {out.initial}, [out.initial]
    while frontier:
        q = frontier.pop()
        for t in out.trans[q].values():
            if t not in reach:
                reach.add(t)
                frontier.append(t)
    alive = co_reachable({q: out.trans[q].values() for q in reach},
                         (q for q in reach if out.stops[q] > 0))
    alive.add(out.initial)
    for q in list(out.trans):
        if q not in alive:
            for table in (out.trans, out.counts, out.widths, out.stops):
                del table[q]
            continue
        for a in [a for a, t in out.trans[q].items() if t not in alive]:
            del out.trans[q][a], out.counts[q][a], out.widths[q][a]
    return _renumber(out)
