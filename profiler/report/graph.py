"""The workflow graph of one workflow type, and its drawing as inline SVG.

Nodes are the automaton's symbols (an agent, or a fan-out group such as ``reader|searcher``)
plus ``START`` and ``END``. The edge a → b carries the empirical transition probability

    P(b | a) = #(steps a immediately followed by b) / #(steps a)

over the workflows of the store (``END`` counts workflows that stop after a). An edge is
*pruned* when the pruned automaton of the profile can no longer produce the pair: no state is
entered by ``a`` and leaves by ``b`` (``START``: the initial state has no ``b``; ``END``: no
state entered by ``a`` may stop). Pruned edges are drawn grey and dashed.

The drawing is an arc diagram: nodes on one line ordered by their mean relative position in the
workflows (so the usual flow reads left to right), forward edges as arcs above the line,
backward edges below, self-loops as small loops; line width grows with the probability.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from html import escape
from typing import Iterable, Sequence

START, END = "START", "END"


@dataclass
class WorkflowGraph:
    """Nodes, edge probabilities and which edges the pruned automaton dropped."""

    workflow_type: str
    nodes: list[str]                                  # ordered left to right, START first, END last
    steps: dict[str, int]                             # node -> number of steps (START: workflows)
    edges: dict[tuple[str, str], float]               # (a, b) -> P(b | a)
    counts: dict[tuple[str, str], int]                # (a, b) -> transitions seen
    pruned: set[tuple[str, str]] = field(default_factory=set)
    workflows: int = 0

    @classmethod
    def from_symbol_sequences(cls, workflow_type: str, sequences: Iterable[Sequence[str]],
                              pfa: dict | None = None) -> "WorkflowGraph":
        """Count bigrams over step-symbol sequences; mark pairs the pruned ``pfa`` cannot produce
        (``pfa`` is ``synth.pfa.PFA.to_dict()``, stored at ``workflows[wt]["pfa"]``)."""
        counts: Counter = Counter()
        steps: Counter = Counter()
        position: dict[str, list[float]] = {}
        n = 0
        for seq in sequences:
            seq = list(seq)
            if not seq:
                continue
            n += 1
            path = [START, *seq, END]
            counts.update(zip(path, path[1:]))
            steps.update(path[:-1])
            for i, s in enumerate(seq):
                position.setdefault(s, []).append(i / max(len(seq) - 1, 1))
        mean_pos = {s: sum(v) / len(v) for s, v in position.items()}
        middle = sorted(mean_pos, key=lambda s: (mean_pos[s], s))
        edges = {(a, b): c / steps[a] for (a, b), c in counts.items()}
        graph = cls(workflow_type, [START, *middle, END], dict(steps), edges, dict(counts), workflows=n)
        if pfa is not None:
            allowed = producible_pairs(pfa)
            graph.pruned = {e for e in edges if e not in allowed}
        return graph

    @classmethod
    def from_pfa(cls, workflow_type: str, pfa: dict) -> "WorkflowGraph":
        """Edges from the pruned automaton alone (no store at hand): counts on the transitions
        entered by ``a`` are pooled, ``P(b | a) = Σ count(q, b) / Σ total(q)`` over those states."""
        states = {s["id"]: s for s in pfa["states"]}
        entered: dict[str, set[int]] = {START: {pfa["initial"]}}
        for s in pfa["states"]:
            for t in s["transitions"]:
                entered.setdefault(t["symbol"], set()).add(t["to"])
        counts: Counter = Counter()
        totals: Counter = Counter()
        for a, qs in entered.items():
            for q in qs:
                s = states[q]
                totals[a] += s["total"]
                counts[(a, END)] += s["stops"]
                for t in s["transitions"]:
                    counts[(a, t["symbol"])] += t["count"]
        counts = Counter({k: v for k, v in counts.items() if v > 0})
        edges = {(a, b): c / totals[a] for (a, b), c in counts.items() if totals[a]}
        middle = _order_by_reachability(pfa)
        return cls(workflow_type, [START, *middle, END], dict(totals), edges, dict(counts),
                   workflows=int(totals[START]))


def producible_pairs(pfa: dict) -> set[tuple[str, str]]:
    """Every (a, b) the automaton can emit back to back, with START/END for the ends."""
    states = {s["id"]: s for s in pfa["states"]}
    pairs = {(START, t["symbol"]) for t in states[pfa["initial"]]["transitions"]}
    for s in pfa["states"]:
        for t in s["transitions"]:
            target = states.get(t["to"])
            if target is None:
                continue
            pairs.update((t["symbol"], u["symbol"]) for u in target["transitions"])
            if target.get("stops", 0) > 0 or target.get("p_stop", 0) > 0:
                pairs.add((t["symbol"], END))
    return pairs


def _order_by_reachability(pfa: dict) -> list[str]:
    """Symbols in breadth-first order from the initial state (a left-to-right order without data)."""
    states = {s["id"]: s for s in pfa["states"]}
    order: list[str] = []
    seen, frontier = {pfa["initial"]}, [pfa["initial"]]
    while frontier:
        nxt = []
        for q in frontier:
            for t in sorted(states[q]["transitions"], key=lambda t: -t["count"]):
                if t["symbol"] not in order:
                    order.append(t["symbol"])
                if t["to"] not in seen:
                    seen.add(t["to"])
                    nxt.append(t["to"])
        frontier = nxt
    return order


# ------------------------------------------------------------------------------- drawing
NODE_W, NODE_H, GAP = 108, 36, 38
KEPT, PRUNED_COLOR, NODE_FILL, END_FILL = "#2b6cb0", "#a0aec0", "#ebf4ff", "#f0fff4"


def _short(label: str, limit: int = 16) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def render_svg(graph: WorkflowGraph, element_id: str, min_p: float = 0.0) -> str:
    """The graph as an ``<svg>`` element (hover an edge or node for its numbers).

    Edges with probability below ``min_p`` are left out (they are listed in the edge table).
    """
    xs = {node: GAP + i * (NODE_W + GAP) + NODE_W / 2 for i, node in enumerate(graph.nodes)}
    index = {node: i for i, node in enumerate(graph.nodes)}
    drawn = {e: p for e, p in graph.edges.items() if p >= min_p}
    span_up = max([index[b] - index[a] for a, b in drawn if index[b] > index[a]] or [1])
    span_down = max([index[a] - index[b] for a, b in drawn if index[b] < index[a]] or [1])
    has_loop = any(a == b for a, b in drawn)
    has_back = any(index[b] < index[a] for a, b in drawn)
    up = 40 + 34 * min(span_up, 6) + (10 if has_loop else 0)
    down = 40 + 34 * min(span_down, 6) if has_back else 8
    width = GAP + len(graph.nodes) * (NODE_W + GAP)
    y = up + 30
    height = y + NODE_H / 2 + down + 10
    parts = [f'<svg id="{escape(element_id)}" class="wf-graph" xmlns="http://www.w3.org/2000/svg" '
             f'viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}" '
             f'role="img" aria-label="workflow graph of {escape(graph.workflow_type)}">',
             '<defs>'
             f'<marker id="{element_id}-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="11" '
             f'markerHeight="11" markerUnits="userSpaceOnUse" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{KEPT}"/></marker>'
             f'<marker id="{element_id}-arrow-pruned" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="11" '
             f'markerHeight="11" markerUnits="userSpaceOnUse" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{PRUNED_COLOR}"/>'
             '</marker></defs>']
    # kept edges drawn last so that they sit on top of pruned ones
    for (a, b), p in sorted(drawn.items(), key=lambda kv: (kv[0] not in graph.pruned, kv[1])):
        pruned = (a, b) in graph.pruned
        color = PRUNED_COLOR if pruned else KEPT
        stroke = 1.2 + 5.0 * p
        marker = f"url(#{element_id}-arrow{'-pruned' if pruned else ''})"
        dash = ' stroke-dasharray="5 4"' if pruned else ""
        cls = "edge pruned" if pruned else "edge"
        title = (f"{a} → {b}: p = {p:.3f} ({graph.counts.get((a, b), 0):,} transitions)"
                 + (" — pruned from the automaton" if pruned else ""))
        if a == b:
            x = xs[a]
            d = (f"M{x - 14:.1f},{y - NODE_H / 2:.1f} C{x - 34:.1f},{y - NODE_H / 2 - 52:.1f} "
                 f"{x + 34:.1f},{y - NODE_H / 2 - 52:.1f} {x + 14:.1f},{y - NODE_H / 2:.1f}")
            lx, ly = x, y - NODE_H / 2 - 44
        else:
            x1, x2 = xs[a], xs[b]
            forward = x2 > x1
            dist = abs(index[b] - index[a])
            lift = (30 + 34 * min(dist, 6)) * (-1 if forward else 1)
            y0 = y - NODE_H / 2 if forward else y + NODE_H / 2
            sx, ex = x1 + (10 if forward else -10), x2 - (10 if forward else -10)
            d = f"M{sx:.1f},{y0:.1f} C{sx:.1f},{y0 + lift:.1f} {ex:.1f},{y0 + lift:.1f} {ex:.1f},{y0:.1f}"
            lx, ly = (sx + ex) / 2, y0 + 0.75 * lift + (4 if not forward else 0)
        parts.append(f'<g class="{cls}" data-from="{escape(a)}" data-to="{escape(b)}" data-p="{p:.4f}">'
                     f'<title>{escape(title)}</title>'
                     f'<path d="{d}" fill="none" stroke="{color}" stroke-width="{stroke:.2f}"{dash} '
                     f'marker-end="{marker}" opacity="0.9"/>'
                     f'<text x="{lx:.1f}" y="{ly:.1f}" text-anchor="middle" class="edge-label" '
                     f'fill="{"#718096" if pruned else "#1a365d"}">{p:.2f}</text></g>')
    for node in graph.nodes:
        x = xs[node]
        terminal = node in (START, END)
        fill = END_FILL if terminal else NODE_FILL
        n = graph.steps.get(node)
        title = f"{node}: {n:,} steps" if n is not None and not terminal else node
        if node == START:
            title = f"START: {graph.workflows:,} workflows"
        parts.append(f'<g class="node" data-node="{escape(node)}"><title>{escape(title)}</title>'
                     f'<rect x="{x - NODE_W / 2:.1f}" y="{y - NODE_H / 2:.1f}" width="{NODE_W}" '
                     f'height="{NODE_H}" rx="{NODE_H / 2 if terminal else 8}" fill="{fill}" '
                     f'stroke="{"#2f855a" if terminal else KEPT}" stroke-width="1.5"/>'
                     f'<text x="{x:.1f}" y="{y + 5:.1f}" text-anchor="middle" class="node-label">'
                     f'{escape(_short(node))}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def edge_rows(graph: WorkflowGraph) -> list[tuple[str, str, float, int, bool]]:
    """(from, to, p, count, pruned) sorted by source position then descending p."""
    index = {node: i for i, node in enumerate(graph.nodes)}
    return sorted(((a, b, p, graph.counts.get((a, b), 0), (a, b) in graph.pruned)
                   for (a, b), p in graph.edges.items()),
                  key=lambda r: (index.get(r[0], math.inf), -r[2], r[1]))
