"""The session automaton: the bounded regex's DFA, weighted by the data and the PFA.

ALERGIA generalizes loops into cycles, and a cycle is memoryless: after the 40th ``tool``
call the chain expects as many further calls as after the 1st. The bounded regex knows
better — ``(tool){34,127}`` counts. So serving sessions run on the **product** of

* the minimal DFA of the bounded step regex (automata-lib: ``NFA.from_regex`` of the
  symbol form, then ``DFA.from_nfa``, which minimizes), whose states count loop rounds, and
* the pruned PFA, whose state supplies well-smoothed transition probabilities,

restricted to pairs that can still reach an accepting pair. Its transition probabilities are
posterior means under a Dirichlet prior centred on the PFA (renormalized over what the DFA
allows at that count):

    p(a | d, q) = (c(d, q, a) + β · p_PFA(a | q) / Z) / (c(d, q) + β)

where ``c`` counts the training sequences that took ``a`` in that product state and
``β`` (``prior_weight``) is the prior's worth in workflows. Where the data are plentiful the
empirical hazard of every loop count wins; where they are thin the PFA fills in.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

from automata.fa.dfa import DFA
from automata.fa.nfa import NFA

from synth.pfa import PFA, _renumber, co_reachable
from synth.regex_ast import Node, symbols, to_symbols
from synth.regex_synth import expanded_size, symbol_chars

#: Above this many product states (or unrolled regex symbols) the session automaton falls
#: back to the PFA itself.
MAX_STATES = 2000
DEFAULT_PRIOR_WEIGHT = 1.0


def regex_dfa(tree: Node, alphabet: Sequence[str]) -> tuple[DFA, dict[str, str]]:
    """Minimal (partial) DFA of a step-level regex tree, and the symbol → character map."""
    char_of = symbol_chars(set(alphabet) | symbols(tree))
    nfa = NFA.from_regex(to_symbols(tree, char_of.__getitem__),
                         input_symbols=set(char_of.values()))
    return DFA.from_nfa(nfa), char_of


def counting_pfa(tree: Node, pfa: PFA, sequences: Sequence[Sequence[str]],
                 widths: Sequence[Sequence[int]], weights: Sequence[int],
                 prior_weight: float = DEFAULT_PRIOR_WEIGHT,
                 max_states: int = MAX_STATES) -> tuple[PFA, list[int]] | None:
    """The product automaton described above, and for each of its states the PFA state it
    pairs with (None when it would exceed ``max_states``).

    ``sequences``/``widths``/``weights``: the distinct training step sequences, their fan-out
    widths and multiplicities. Its ``counts`` are the (fractional) posterior pseudo-counts.
    """
    if expanded_size(tree) > max_states:
        return None
    dfa, char_of = regex_dfa(tree, pfa.alphabet)
    if len(dfa.states) > max_states:
        return None
    # reachable product states
    start = (dfa.initial_state, pfa.initial)
    index = {start: 0}
    order = [start]
    edges: dict[int, dict[str, int]] = {}
    for d, q in order:
        here = index[(d, q)]
        edges[here] = {}
        for symbol, q_next in pfa.trans[q].items():
            d_next = dfa.transitions.get(d, {}).get(char_of[symbol])
            if d_next is None:
                continue
            key = (d_next, q_next)
            if key not in index:
                if len(order) >= max_states:
                    return None
                index[key] = len(order)
                order.append(key)
            edges[here][symbol] = index[key]
    accepting = {i for i, (d, q) in enumerate(order) if d in dfa.final_states and pfa.stops[q]}
    # trim to states that can still reach an accepting one
    alive = co_reachable({i: out.values() for i, out in edges.items()}, accepting)
    if 0 not in alive:
        return None
    # data counts
    data: dict[int, Counter] = {i: Counter() for i in alive}
    stops: Counter = Counter()
    seen_widths: dict[tuple[int, str], Counter] = {}
    for seq, seq_widths, weight in zip(sequences, widths, weights):
        path, i = [], 0
        for symbol in seq:
            j = edges.get(i, {}).get(symbol)
            if j is None or j not in alive:
                break
            path.append((i, symbol))
            i = j
        else:
            if i in accepting:
                for (k, symbol), width in zip(path, seq_widths):
                    data[k][symbol] += weight
                    seen_widths.setdefault((k, symbol), Counter())[int(width)] += weight
                stops[i] += weight
    out = PFA(initial=0)
    for i in alive:
        _, q = order[i]
        allowed = {a: t for a, t in edges[i].items() if t in alive}
        prior = {a: pfa.prob(q, a) for a in allowed}
        prior_stop = pfa.stop_prob(q) if i in accepting else 0.0
        z = sum(prior.values()) + prior_stop
        out.trans[i] = allowed
        out.counts[i] = {a: data[i][a] + prior_weight * prior[a] / z for a in allowed}
        out.stops[i] = stops[i] + prior_weight * prior_stop / z
        out.widths[i] = {a: seen_widths.get((i, a)) or Counter(pfa.widths[q][a]) for a in allowed}
    numbering: dict[int, int] = {}
    out = _renumber(out, numbering)
    pfa_state = [0] * len(numbering)
    for old, new in numbering.items():
        pfa_state[new] = order[old][1]
    return out, pfa_state
