"""From a pruned PFA to a bounded, readable regular expression — and back.

1. **State elimination.** The pruned PFA, read as a DFA over one character per step symbol,
   is minimized and handed to automata-lib's GNFA, which removes states one by one, replacing
   the paths through each removed state ``q`` by ``R(i,q) R(q,q)* R(q,j) | R(i,j)``, until only
   a start and an accept state remain; the label between them is the regex.
2. **Simplification** (:func:`synth.regex_ast.simplify`) makes it readable.
3. **Bounding.** Every unbounded repeat ``(x)*`` / ``(x)+`` that is not nested in another
   repeat becomes ``(x){lo,hi}`` with lo/hi the ``loop_quantiles`` (default 1st and 99th
   percentile) of how many times the training sequences went round that loop (counted with
   Python's ``re`` and a named group). Nested loops stay unbounded.
4. **Fan-out.** Each step symbol is written out over agents: a single call stays ``engineer``;
   a fan-out group of width 1–4 becomes ``(explorer){1,4}`` (mixed groups
   ``(reader | searcher){2,3}``: any order of the members is accepted, none is invented).

:class:`RegexMatcher` parses the readable string back, maps agents to characters and builds an
automata-lib ``NFA.from_regex`` — the round trip the profile promises.
"""
from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np
from automata.fa.dfa import DFA
from automata.fa.gnfa import GNFA
from automata.fa.nfa import NFA

from synth.pfa import PFA
from synth.regex_ast import (Node, alt, map_symbols, parse_readable, parse_symbols, rep,
                             replace_at, simplify, sym, symbols, to_python, to_readable,
                             to_symbols, walk)

#: Default percentiles bounding loop counts and fan-out widths.
LOOP_QUANTILES = (0.01, 0.99)


def symbol_chars(names: Iterable[str]) -> dict[str, str]:
    """One character per name (letters first, then CJK ideographs), none reserved by regexes."""
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    chars = {}
    for i, name in enumerate(sorted(set(names))):
        chars[name] = letters[i] if i < len(letters) else chr(0x4E00 + i)
    return chars


def pfa_to_dfa(pfa: PFA, char_of: dict[str, str]) -> DFA | None:
    """The PFA's support as a partial automata-lib DFA (None when it accepts nothing)."""
    finals = {q for q in pfa.states if pfa.stops[q] > 0}
    if not finals:
        return None
    return DFA(states=set(pfa.states), input_symbols=set(char_of.values()),
               transitions={q: {char_of[a]: t for a, t in pfa.trans[q].items()}
                            for q in pfa.states},
               initial_state=pfa.initial, final_states=finals, allow_partial=True)


def canonical_dfa(dfa: DFA) -> DFA:
    """The same DFA with states renumbered 0..n-1 breadth-first, symbols in sorted order.

    Minimization names and orders states by set iteration, which changes with Python's hash
    seed; renumbering makes the elimination below (and so the profile) reproducible.
    """
    order, index = [dfa.initial_state], {dfa.initial_state: 0}
    for q in order:
        for symbol in sorted(dfa.transitions.get(q, {})):
            t = dfa.transitions[q][symbol]
            if t not in index:
                index[t] = len(order)
                order.append(t)
    return DFA(states=set(range(len(order))), input_symbols=dfa.input_symbols,
               transitions={index[q]: {a: index[t] for a, t in
                                       sorted(dfa.transitions.get(q, {}).items())}
                            for q in order},
               initial_state=0, final_states={index[q] for q in dfa.final_states if q in index},
               allow_partial=True)


def eliminate_states(dfa: DFA) -> str:
    """automata-lib regex of a DFA by GNFA state elimination (after minimization)."""
    return GNFA.from_dfa(canonical_dfa(dfa.minify())).to_regex()


def pfa_regex_tree(pfa: PFA) -> Node | None:
    """Simplified, still unbounded regex tree over step symbols (None: empty language)."""
    char_of = symbol_chars(pfa.alphabet)
    dfa = pfa_to_dfa(pfa, char_of)
    if dfa is None:
        return None
    name_of = {c: n for n, c in char_of.items()}
    text = eliminate_states(dfa)
    if text is None:  # no accepting state is reachable
        return None
    tree = parse_symbols(text)
    return simplify(map_symbols(tree, lambda c: sym(name_of[c])))


def _quantile_bounds(values: Sequence[int], quantiles: tuple[float, float]) -> tuple[int, int]:
    lo = int(np.quantile(values, quantiles[0], method="lower"))
    hi = int(np.quantile(values, quantiles[1], method="higher"))
    return lo, max(lo, hi)


def _iterations(body_pattern: str, text: str, minimum: int) -> int:
    """Smallest k >= minimum with ``text`` = k copies of the body (the loop's round count)."""
    if not text:
        return 0
    for k in range(max(minimum, 1), len(text) + 1):
        if _compiled(f"(?:{body_pattern}){{{k}}}").fullmatch(text):
            return k
    return len(text)


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def loop_counts(tree: Node, sequences: Sequence[Sequence[str]],
                weights: Sequence[int] | None = None) -> dict[tuple[int, ...], list[int]]:
    """Per unbounded repeat (by path), how often each matching training sequence looped
    (a sequence of weight w contributes its count w times).

    Only repeats that are not inside another repeat are counted: Python's ``re`` reports a
    group's last match only, which for a nested loop is its last round, not all of them.
    """
    char_of = symbol_chars(symbols(tree) | {a for s in sequences for a in s})
    texts = ["".join(char_of[a] for a in s) for s in sequences]
    weights = list(weights) if weights is not None else [1] * len(texts)
    counts: dict[tuple[int, ...], list[int]] = {}
    repeating = {path for path, node in walk(tree) if node[0] == "rep" and node[3] != 1}
    for path, node in walk(tree):
        if node[0] != "rep" or node[3] is not None:
            continue
        if any(path[:i] in repeating for i in range(len(path))):
            continue  # nested loop: re only sees its last round, so leave it unbounded
        whole = _compiled(to_python(tree, char_of.__getitem__, group_path=path))
        body = to_python(node[1], char_of.__getitem__)
        found: list[int] = []
        for text, weight in zip(texts, weights):
            m = whole.fullmatch(text)
            if m is not None and m.start("loop") >= 0:
                found.extend([_iterations(body, m.group("loop"), node[2])] * int(weight))
        counts[path] = found
    return counts


def bound_loops(tree: Node, sequences: Sequence[Sequence[str]],
                quantiles: tuple[float, float] = LOOP_QUANTILES,
                weights: Sequence[int] | None = None) -> Node:
    """Replace each unbounded repeat by the quantile range of its observed round counts.

    A loop that no training sequence went through keeps its unbounded form.
    """
    counts = loop_counts(tree, sequences, weights)
    # replace deepest paths first so that outer paths stay valid
    for path in sorted(counts, key=len, reverse=True):
        found = counts[path]
        if not found:
            continue
        node = _node_at(tree, path)
        lo, hi = _quantile_bounds(found, quantiles)
        tree = replace_at(tree, path, rep(node[1], max(lo, node[2]), max(hi, node[2])))
    return simplify(tree)


def expanded_size(tree: Node) -> int:
    """Symbol occurrences once bounded repeats are unrolled (what ``NFA.from_regex`` builds)."""
    kind = tree[0]
    if kind == "sym":
        return 1
    if kind == "eps":
        return 0
    if kind in ("cat", "alt"):
        return sum(expanded_size(c) for c in tree[1])
    return expanded_size(tree[1]) * max(tree[3] if tree[3] is not None else tree[2], 1)


def _node_at(tree: Node, path: tuple[int, ...]) -> Node:
    for i in path:
        tree = tree[1][i] if tree[0] in ("cat", "alt") else tree[1]
    return tree


def width_ranges(pfa: PFA, quantiles: tuple[float, float] = LOOP_QUANTILES
                 ) -> dict[str, tuple[int, int]]:
    """Quantile range of fan-out widths per step symbol."""
    out = {}
    for symbol in pfa.alphabet:
        hist: Counter = pfa.width_counts(symbol)
        values = np.repeat(np.array(sorted(hist)), [hist[w] for w in sorted(hist)])
        out[symbol] = _quantile_bounds(values, quantiles) if len(values) else (1, 1)
    return out


def expand_fanout(tree: Node, widths: dict[str, tuple[int, int]]) -> Node:
    """Write step symbols over agents: ``a|b`` of width 2–3 becomes ``(a | b){2,3}``."""
    def expand(symbol: str) -> Node:
        members = symbol.split("|")
        lo, hi = widths.get(symbol, (1, 1))
        body = alt(tuple(sym(m) for m in members))
        return body if (lo, hi) == (1, 1) and len(members) == 1 else rep(body, lo, hi)
    return map_symbols(tree, expand)


def bounded_step_tree(pfa: PFA, step_sequences: Sequence[Sequence[str]],
                      quantiles: tuple[float, float] = LOOP_QUANTILES,
                      weights: Sequence[int] | None = None) -> tuple[Node | None, Node | None]:
    """(unbounded, bounded) regex trees over step symbols of a pruned PFA.

    ``step_sequences`` are the training sequences (step symbols) used to count loops, each
    standing for ``weights[i]`` workflows; only those the PFA accepts are counted.
    """
    tree = pfa_regex_tree(pfa)
    if tree is None:
        return None, None
    weights = list(weights) if weights is not None else [1] * len(step_sequences)
    accepted = [(s, w) for s, w in zip(step_sequences, weights) if pfa.accepts(s)]
    return tree, bound_loops(tree, [s for s, _ in accepted], quantiles, [w for _, w in accepted])


def synthesize_regex(pfa: PFA, step_sequences: Sequence[Sequence[str]],
                     quantiles: tuple[float, float] = LOOP_QUANTILES,
                     weights: Sequence[int] | None = None) -> dict:
    """The regexes of a pruned PFA (see :func:`bounded_step_tree` for the arguments).

    Returns ``{"regex": readable over agents (fan-out groups written with their width),
    "step_regex": readable over step symbols, "unbounded_regex": before bounding,
    "step_tree": the bounded tree over step symbols (not JSON; None for an empty language)}``.
    """
    tree, bounded = bounded_step_tree(pfa, step_sequences, quantiles, weights)
    if tree is None:
        return {"regex": "", "step_regex": "", "unbounded_regex": "", "step_tree": None}
    readable = simplify(expand_fanout(bounded, width_ranges(pfa, quantiles)))
    return {"regex": to_readable(readable), "step_regex": to_readable(bounded),
            "unbounded_regex": to_readable(tree), "step_tree": bounded}


class RegexMatcher:
    """A readable regex parsed back into an automata-lib NFA over agents.

    >>> m = RegexMatcher("planner (explorer){1,4} reviewer")
    >>> m.accepts(["planner", "explorer", "explorer", "reviewer"])
    True
    """

    def __init__(self, regex: str):
        self.regex = regex
        self.tree = parse_readable(regex) if regex.strip() else None
        names = symbols(self.tree) if self.tree is not None else set()
        self.char_of = symbol_chars(names)
        if self.tree is None:
            self.nfa = None
        else:
            self.nfa = NFA.from_regex(to_symbols(self.tree, self.char_of.__getitem__),
                                      input_symbols=set(self.char_of.values()))

    def accepts(self, agents: Sequence[str]) -> bool:
        """Does the regex accept this call sequence (unknown agents are rejected)?"""
        if self.nfa is None or any(a not in self.char_of for a in agents):
            return False
        return self.nfa.accepts_input("".join(self.char_of[a] for a in agents))


__all__ = ["LOOP_QUANTILES", "RegexMatcher", "bound_loops", "eliminate_states",
           "expand_fanout", "loop_counts", "pfa_regex_tree", "pfa_to_dfa", "symbol_chars",
           "synthesize_regex", "width_ranges", "bounded_step_tree"]
