"""The workflow graph of one workflow type, and its drawing as inline SVG.

Nodes are the automaton's symbols (an agent, or a fan-out group such as ``reader|searcher``)
plus ``START`` and ``END``. The edge a → b carries the empirical transition probability

    P(b | a) = #(steps a immediately followed by b) / #(steps a)

over the workflows of the store (``END`` counts workflows that stop after a). An edge is
*pruned* when the pruned automaton of the profile can no longer produce the pair: no state is
entered by ``a`` and leaves by ``b`` (``START``: the initial state has no ``b``; ``END``: no
state entered by ``a`` may stop). Pruned edges are drawn grey and dashed.

The drawing is layered top to bottom (:mod:`scoring.report.layout`): ``START`` on top, each
agent on the layer of its longest path from ``START``, ``END`` alone at the bottom; loops of the
workflow are drawn as back edges curving up; line width grows with the probability. A team with
more than :data:`MAX_NODES` agents keeps its busiest ones and pools the rest into one node
(:func:`collapse_rare`).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from html import escape
from typing import Callable, Iterable, Mapping, Sequence

from scoring.report.layout import LINE_H, layered_layout

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
    merged: dict[str, list[str]] = field(default_factory=dict)  # pooled node -> agents behind it

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


# ----------------------------------------------------------------------------- many agents
#: Agents (symbols) drawn as their own node; the rest are merged into one "other agents" node.
MAX_NODES = 16


def pool(graph: WorkflowGraph, name_of: Callable[[str], str],
         merged: Mapping[str, list[str]] | None = None) -> WorkflowGraph:
    """The graph with every node ``n`` renamed ``name_of(n)`` and nodes of one name merged: steps
    and transition counts add up, ``P(b | a) = Σ count / Σ steps`` (so each node's outgoing
    probabilities still sum to 1; a transition between two members of one group becomes a
    self-loop). A merged edge is pruned only if every edge it pools was pruned. ``merged`` (pooled
    node -> names behind it) is kept for the tooltips. ``START``/``END`` are never renamed."""
    def name(n: str) -> str:
        return n if n in (START, END) else name_of(n)

    steps: Counter = Counter()
    for n, k in graph.steps.items():
        steps[name(n)] += k
    counts: Counter = Counter()
    all_pruned: dict[tuple[str, str], bool] = {}
    for (a, b), c in graph.counts.items():
        e = (name(a), name(b))
        counts[e] += c
        all_pruned[e] = all_pruned.get(e, True) and (a, b) in graph.pruned
    edges = {e: c / steps[e[0]] for e, c in counts.items() if steps[e[0]]}
    nodes = list(dict.fromkeys(name(n) for n in graph.nodes if n != END)) + [END]
    return WorkflowGraph(graph.workflow_type, nodes, dict(steps), edges, dict(counts),
                         {e for e, p in all_pruned.items() if p and e in edges}, graph.workflows,
                         merged={**graph.merged, **dict(merged or {})})


def collapse_rare(graph: WorkflowGraph, max_nodes: int = MAX_NODES) -> WorkflowGraph:
    """The graph with only the ``max_nodes`` busiest symbols (by steps) kept as nodes and the rest
    merged into one node ``other agents (k)`` (:func:`pool`); ``merged`` lists the agents behind
    the pooled node. A graph within the limit comes back as is."""
    middle = [n for n in graph.nodes if n not in (START, END)]
    if len(middle) <= max_nodes:
        return graph
    keep = set(sorted(middle, key=lambda n: (-graph.steps.get(n, 0), n))[:max_nodes])
    rest = [n for n in middle if n not in keep]
    other = f"other agents ({len(rest)})"
    return pool(graph, lambda n: n if n in keep else other, {other: rest})


# ------------------------------------------------------------------------------- drawing
KEPT, PRUNED_COLOR, NODE_FILL, END_FILL = "#2b6cb0", "#a0aec0", "#ebf4ff", "#f0fff4"
BACK_BOW = 30.0  # horizontal bulge (px) of back edges, so a loop never hides its forward twin
LABEL_W, LABEL_H = 30.0, 13.0


def _bezier(p0, c1, c2, p1, t: float) -> tuple[float, float]:
    u = 1 - t
    return tuple(u ** 3 * a + 3 * u * u * t * b + 3 * u * t * t * c + t ** 3 * d
                 for a, b, c, d in zip(p0, c1, c2, p1))  # type: ignore[return-value]


def _edge_path(pts: list[tuple[float, float]], back: bool) -> tuple[str, list[tuple]]:
    """SVG path through ``pts`` (vertical tangents at every point: smooth layered edges; back
    edges bow to the right) and its cubic segments."""
    bow = BACK_BOW if back else 0.0
    d = [f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"]
    segs = []
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        dy = (y1 - y0) / 2
        c1, c2 = (x0 + bow, y0 + dy), (x1 + bow, y1 - dy)
        d.append(f"C{c1[0]:.1f},{c1[1]:.1f} {c2[0]:.1f},{c2[1]:.1f} {x1:.1f},{y1:.1f}")
        segs.append(((x0, y0), c1, c2, (x1, y1)))
    return " ".join(d), segs


def _overlaps(box, boxes) -> bool:
    x0, y0, x1, y1 = box
    return any(x0 < b[2] and b[0] < x1 and y0 < b[3] and b[1] < y1 for b in boxes)


def _label_spots(pts: list[tuple[float, float]] | None, segs: list[tuple] | None,
                 self_loop_at: tuple[float, float] | None) -> list[tuple[float, float]]:
    """Candidate label centres of one edge: along its middle segment first, then the others,
    then the same points shifted sideways (a label need not sit exactly on its line)."""
    if self_loop_at is not None:
        x, y = self_loop_at
        base = [(x + LABEL_W / 2 + 11, y), (x, y - 30), (x, y + 30)]  # right of the loop, above, below
    else:
        order = sorted(range(len(segs)), key=lambda k: abs(k - len(segs) // 2))
        base = [_bezier(*segs[k], t) for k in order for t in (0.5, 0.35, 0.65, 0.22, 0.78, 0.1, 0.9)]
    shift = LABEL_W / 2 + 3
    return base + [(x + dx, y) for dx in (shift, -shift) for x, y in base]


def render_svg(graph: WorkflowGraph, element_id: str, min_p: float = 0.0,
               layout_pruned: bool = False) -> str:
    """The graph as an ``<svg>`` element, laid out in layers top to bottom
    (:func:`scoring.report.layout.layered_layout`): ``START`` on top, ``END`` at the bottom,
    back edges (loops of the workflow) curving up on the right, self-loops beside their node.

    Edges with probability below ``min_p`` are drawn with class ``rare``, pruned edges with class
    ``pruned`` (grey, dashed); the page hides both until its checkboxes show them. The layout is
    computed from the edges shown by default (kept and not rare; pruned ones too when
    ``layout_pruned``), so that hidden edges do not bend the drawing. Hover an edge or node for
    its numbers. Nodes are as wide as their (wrapped, never cut) names.

    Edge labels never overlap a node or another label: each is put at the first free spot along
    its edge, the labels of edges shown by default first (heaviest first), then pruned, then rare
    ones; an edge with no free spot left has no label (its tooltip and the table still give p).
    """
    shown = {e: p for e, p in graph.edges.items()
             if p >= min_p and (layout_pruned or e not in graph.pruned)}
    drawn_for_layout = shown or {e: p for e, p in graph.edges.items() if p >= min_p} or dict(graph.edges)
    lay = layered_layout(graph.nodes, drawn_for_layout, START, END)
    width, height = lay.width, lay.height
    geometry: dict[tuple[str, str], tuple[str, list[tuple[float, float]], bool]] = {}
    for (a, b) in graph.edges:
        back = (a, b) in lay.back_edges
        if a == b:
            box = lay.nodes[a]
            r, y = box.right, box.y
            d = f"M{r:.1f},{y - 7:.1f} C{r + 42:.1f},{y - 30:.1f} {r + 42:.1f},{y + 30:.1f} {r + 1:.1f},{y + 7:.1f}"
            geometry[(a, b)] = (d, _label_spots(None, None, (r + 24, y + 4)), back)
            continue
        pts = lay.routes.get((a, b))
        if pts is None:  # an edge outside the layout (hidden by default): from a's side to b's side
            ba, bb = lay.nodes[a], lay.nodes[b]
            up = bb.y < ba.y
            pts = [(ba.x, ba.top if up else ba.bottom), (bb.x, bb.bottom if up else bb.top)]
            back = back or up
        d, segs = _edge_path(pts, back)
        geometry[(a, b)] = (d, _label_spots(pts, segs, None), back)
    taken = [(b.left - 2, b.top - 2, b.right + 2, b.bottom + 2) for b in lay.nodes.values()]
    label_at: dict[tuple[str, str], tuple[float, float]] = {}
    for e, p in sorted(graph.edges.items(), key=lambda kv: (kv[1] < min_p, kv[0] in graph.pruned, -kv[1], kv[0])):
        for cx, cy in geometry[e][1]:
            bx = (cx - LABEL_W / 2, cy - LABEL_H / 2, cx + LABEL_W / 2, cy + LABEL_H / 2)
            if not _overlaps(bx, taken) and 0 <= bx[0] and 0 <= bx[1] and bx[3] <= height:
                label_at[e] = (cx, cy)
                taken.append(bx)
                break
    width = max([width] + [x + LABEL_W / 2 + 4 for x, _ in label_at.values()])
    parts = [f'<svg id="{escape(element_id)}" class="wf-graph" xmlns="http://www.w3.org/2000/svg" '
             f'viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}" '
             f'data-layers="{len(lay.layers)}" data-crossings="{lay.crossings}" '
             f'role="img" aria-label="workflow graph of {escape(graph.workflow_type)}">',
             '<defs>'
             f'<marker id="{element_id}-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="10" '
             f'markerHeight="10" markerUnits="userSpaceOnUse" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{KEPT}"/></marker>'
             f'<marker id="{element_id}-arrow-pruned" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="10" '
             f'markerHeight="10" markerUnits="userSpaceOnUse" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{PRUNED_COLOR}"/>'
             '</marker></defs>']
    # kept edges drawn last so that they sit on top of pruned ones; rare ones first of all
    for (a, b), p in sorted(graph.edges.items(), key=lambda kv: (kv[1] >= min_p, kv[0] not in graph.pruned, kv[1])):
        pruned = (a, b) in graph.pruned
        rare = p < min_p
        color = PRUNED_COLOR if pruned else KEPT
        stroke = 1.2 + 5.0 * p
        marker = f"url(#{element_id}-arrow{'-pruned' if pruned else ''})"
        dash = ' stroke-dasharray="5 4"' if pruned else ""
        d, _, back = geometry[(a, b)]
        cls = "edge" + (" pruned" if pruned else "") + (" rare" if rare else "") + (" back" if back else "")
        title = (f"{a} → {b}: p = {p:.3f} ({graph.counts.get((a, b), 0):,} transitions)"
                 + (" — pruned from the automaton" if pruned else "") + (" — rare" if rare else ""))
        label = ""
        if (a, b) in label_at:
            lx, ly = label_at[(a, b)]
            label = (f'<text x="{lx:.1f}" y="{ly + 4:.1f}" text-anchor="middle" class="edge-label" '
                     f'fill="{"#718096" if pruned else "#1a365d"}">{p:.2f}</text>')
        parts.append(f'<g class="{cls}" data-from="{escape(a)}" data-to="{escape(b)}" data-p="{p:.4f}">'
                     f'<title>{escape(title)}</title>'
                     f'<path d="{d}" fill="none" stroke="{color}" stroke-width="{stroke:.2f}"{dash} '
                     f'marker-end="{marker}" opacity="{0.85 if pruned else 1}"/>{label}</g>')
    merged = graph.merged
    for node in graph.nodes:
        box = lay.nodes[node]
        terminal = node in (START, END)
        fill = END_FILL if terminal else NODE_FILL
        n = graph.steps.get(node)
        title = f"{node}: {n:,} steps" if n is not None and not terminal else node
        if node == START:
            title = f"START: {graph.workflows:,} workflows"
        if node in merged:
            title += " — " + ", ".join(merged[node])
        y0 = box.y - (len(box.lines) - 1) * LINE_H / 2 + 4.5
        tspans = "".join(f'<tspan x="{box.x:.1f}" y="{y0 + i * LINE_H:.1f}">{escape(line)}</tspan>'
                         for i, line in enumerate(box.lines))
        parts.append(f'<g class="node" data-node="{escape(node)}"><title>{escape(title)}</title>'
                     f'<rect x="{box.left:.1f}" y="{box.top:.1f}" width="{box.w:.1f}" '
                     f'height="{box.h:.1f}" rx="{min(box.h / 2, 16) if terminal else 8}" fill="{fill}" '
                     f'stroke="{"#2f855a" if terminal else KEPT}" stroke-width="1.5"/>'
                     f'<text text-anchor="middle" class="node-label">{tspans}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def edge_rows(graph: WorkflowGraph) -> list[tuple[str, str, float, int, bool]]:
    """(from, to, p, count, pruned) sorted by source position then descending p."""
    index = {node: i for i, node in enumerate(graph.nodes)}
    return sorted(((a, b, p, graph.counts.get((a, b), 0), (a, b) in graph.pruned)
                   for (a, b), p in graph.edges.items()),
                  key=lambda r: (index.get(r[0], math.inf), -r[2], r[1]))
