"""Layered (Sugiyama-style) layout of a directed graph with a source and a sink, top to bottom.

The four classic steps (Sugiyama, Tagawa & Toda 1981), each small enough to read:

1. **Cycle breaking** — a depth-first search from the source, heaviest edge first; an edge to a
   node still on the DFS stack is a *back edge* (a loop of the workflow). Back edges are reversed
   for layering and drawn as curves going up; self-loops are left out of the layering.
2. **Layer assignment** — longest path from the source over the acyclic edges, so every forward
   edge points down; the source alone on layer 0, the sink alone on the last layer.
3. **Crossing reduction** — edges spanning several layers get a *dummy* node per layer crossed;
   then nodes are reordered within each layer by the barycenter (mean position) of their
   neighbours in the layer above, then below, sweep after sweep, keeping the order with the
   fewest crossings.
4. **Coordinate assignment** — each node is pulled toward the mean x of its neighbours; the
   closest positions that keep the layer's order and the minimum gaps between boxes are an
   isotonic regression (``sklearn.isotonic.isotonic_regression``), so boxes never overlap.

Nodes are sized by their text: long names are wrapped at ``_``, ``-``, ``|``, spaces and
camel-case boundaries (never cut), and the box is as wide as its longest line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from sklearn.isotonic import isotonic_regression

#: Estimated glyph widths (px) of the 12 px semi-bold node font; deliberately generous, so that
#: the widest common system fonts (DejaVu Sans, Verdana) still fit in the box.
_NARROW, _WIDE, _CAPS, _NORMAL = 4.6, 11.4, 9.4, 7.9
LINE_H, PAD_X, PAD_Y = 15.0, 14.0, 9.0
MAX_LINE_CHARS = 20
H_GAP, V_GAP, DUMMY_W, MARGIN = 30.0, 62.0, 14.0, 24.0


def text_width(line: str) -> float:
    """Estimated rendered width of ``line`` in the node font (an upper bound, not a measurement)."""
    w = 0.0
    for ch in line:
        if ch in "iljtfrI.,:;|!'()[] ":
            w += _NARROW
        elif ch in "mwMW@%":
            w += _WIDE
        elif ch.isupper() or ch.isdigit():
            w += _CAPS
        else:
            w += _NORMAL
    return w


def wrap_label(name: str, max_chars: int = MAX_LINE_CHARS) -> list[str]:
    """Split ``name`` into lines of at most ``max_chars`` characters at word-like boundaries
    (after ``_``, ``-``, ``|``, ``/``, spaces, before a capital that follows a lower-case
    letter); a single piece longer than ``max_chars`` is split hard. Joining the lines gives
    ``name`` back (spaces at line ends aside)."""
    pieces = [p for p in re.split(r"(?<=[_\-|/ ])|(?<=[a-z0-9])(?=[A-Z])", name) if p]
    lines: list[str] = []
    cur = ""
    for piece in pieces:
        while len(piece) > max_chars:
            if cur:
                lines.append(cur)
                cur = ""
            lines.append(piece[:max_chars])
            piece = piece[max_chars:]
        if cur and len(cur) + len(piece) > max_chars:
            lines.append(cur)
            cur = ""
        cur += piece
    if cur or not lines:
        lines.append(cur)
    return [ln.rstrip() or ln for ln in lines]


@dataclass
class NodeBox:
    """A node's text lines, layer and box (center ``x``, ``y``; width ``w``, height ``h``)."""

    name: str
    lines: list[str]
    layer: int
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0
    h: float = 0.0

    @property
    def left(self) -> float:
        return self.x - self.w / 2

    @property
    def right(self) -> float:
        return self.x + self.w / 2

    @property
    def top(self) -> float:
        return self.y - self.h / 2

    @property
    def bottom(self) -> float:
        return self.y + self.h / 2


@dataclass
class Layout:
    """Result of :func:`layered_layout`.

    ``routes[(a, b)]`` is the polyline of edge a → b from a's box to b's box (through its dummy
    nodes), already pointing from a to b (upwards for back edges); self-loops have no route.
    """

    nodes: dict[str, NodeBox]
    layers: list[list[str]]                       # real nodes per layer, left to right
    routes: dict[tuple[str, str], list[tuple[float, float]]]
    back_edges: set[tuple[str, str]]
    width: float
    height: float
    crossings: int = 0
    order: dict[int, list[str]] = field(default_factory=dict)  # every layer incl. dummies


def break_cycles(nodes: Sequence[str], edges: Mapping[tuple[str, str], float], source: str,
                 sink: str) -> set[tuple[str, str]]:
    """Back edges of a DFS from ``source`` (then from any node not reached, in ``nodes`` order),
    following heavier edges first. Edges into ``source`` or out of ``sink`` are always back
    edges; self-loops are not returned (they never constrain the layering)."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    rank = {n: i for i, n in enumerate(nodes)}
    for (a, b), w in edges.items():
        if a != b and b != source and a != sink:
            out[a].append(b)
    for a in out:
        out[a].sort(key=lambda b: (-edges[(a, b)], rank[b]))
    back = {(a, b) for (a, b) in edges if a != b and (b == source or a == sink)}
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    for root in [source, *nodes]:
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(out[root]))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                back.add((node, child))
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(out[child])))
    return back


def assign_layers(nodes: Sequence[str], dag_edges: Sequence[tuple[str, str]], source: str,
                  sink: str) -> dict[str, int]:
    """Longest-path layering of an acyclic edge set: ``layer[b] >= layer[a] + 1`` for each edge;
    ``source`` alone on layer 0 and ``sink`` alone on the last layer."""
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    indeg = {n: 0 for n in nodes}
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in dag_edges:
        preds[b].append(a)
        succ[a].append(b)
        indeg[b] += 1
    layer: dict[str, int] = {}
    ready = [n for n in nodes if indeg[n] == 0]
    while ready:  # Kahn's topological order; each node's layer from its finished predecessors
        n = ready.pop(0)
        base = 0 if n == source else 1
        layer[n] = max([base] + [layer[p] + 1 for p in preds[n]])
        for s in succ[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if len(layer) != len(nodes):
        raise ValueError("assign_layers needs an acyclic edge set (break_cycles first)")
    if sink in layer:
        layer[sink] = max([layer[n] + 1 for n in nodes if n != sink] or [1])
    return layer


def _crossings(upper: list[str], lower: list[str], links: set[tuple[str, str]]) -> int:
    """Crossings between two adjacent layers (pairs of links whose ends are in opposite order)."""
    pu = {n: i for i, n in enumerate(upper)}
    pl = {n: i for i, n in enumerate(lower)}
    pairs = sorted((pu[a], pl[b]) for a, b in links if a in pu and b in pl)
    return sum(1 for i in range(len(pairs)) for j in range(i + 1, len(pairs))
               if pairs[i][0] < pairs[j][0] and pairs[i][1] > pairs[j][1])


def _total_crossings(order: dict[int, list[str]], links: set[tuple[str, str]]) -> int:
    return sum(_crossings(order[i], order[i + 1], links) for i in range(len(order) - 1))


def reduce_crossings(order: dict[int, list[str]], links: set[tuple[str, str]],
                     sweeps: int = 24) -> dict[int, list[str]]:
    """Barycenter heuristic: alternate down and up sweeps, reordering each layer by the mean
    position of its neighbours in the previous layer; returns the best order seen."""
    up: dict[str, list[str]] = {}
    down: dict[str, list[str]] = {}
    for a, b in links:
        down.setdefault(a, []).append(b)
        up.setdefault(b, []).append(a)
    best = {k: list(v) for k, v in order.items()}
    best_c = _total_crossings(best, links)
    cur = {k: list(v) for k, v in order.items()}
    n_layers = len(cur)
    for sweep in range(sweeps):
        going_down = sweep % 2 == 0
        seq = range(1, n_layers) if going_down else range(n_layers - 2, -1, -1)
        for i in seq:
            ref = cur[i - 1] if going_down else cur[i + 1]
            pos = {n: j for j, n in enumerate(ref)}
            nbrs = up if going_down else down

            def key(item: tuple[int, str]) -> float:
                j, n = item
                ps = [pos[m] for m in nbrs.get(n, []) if m in pos]
                return sum(ps) / len(ps) if ps else float(j) * len(ref) / max(len(cur[i]), 1)

            cur[i] = [n for _, n in sorted(enumerate(cur[i]), key=lambda it: (key(it), it[0]))]
        c = _total_crossings(cur, links)
        if c < best_c:
            best, best_c = {k: list(v) for k, v in cur.items()}, c
        if best_c == 0:
            break
    return best


def _place_layer(names: list[str], widths: dict[str, float], desired: dict[str, float],
                 weight: dict[str, float]) -> dict[str, float]:
    """x centers for one layer in the given order, as close as possible (weighted least squares)
    to ``desired`` while keeping ``H_GAP`` between neighbouring boxes: with offsets
    ``o_k = Σ_{j<k} (w_j + w_{j+1}) / 2 + gap``, ``z_k = x_k − o_k`` must be non-decreasing, which
    is exactly an isotonic regression of ``desired_k − o_k``."""
    if not names:
        return {}
    offsets = [0.0]
    for a, b in zip(names, names[1:]):
        gap = H_GAP if not (a.startswith("\0") and b.startswith("\0")) else H_GAP / 3
        offsets.append(offsets[-1] + (widths[a] + widths[b]) / 2 + gap)
    target = np.array([desired[n] - o for n, o in zip(names, offsets)])
    z = isotonic_regression(target, sample_weight=np.array([weight[n] for n in names]))
    return {n: float(zk + o) for n, zk, o in zip(names, z, offsets)}


def layered_layout(nodes: Sequence[str], edges: Mapping[tuple[str, str], float], source: str,
                   sink: str, labels: Mapping[str, list[str]] | None = None) -> Layout:
    """Lay out ``nodes`` (``source`` and ``sink`` among them) with weighted ``edges`` top to bottom.

    ``nodes`` order is the tie-break everywhere (pass the usual order of the workflow);
    ``labels`` gives each node's text lines (default :func:`wrap_label` of its name).
    """
    nodes = list(dict.fromkeys(nodes))
    edges = {e: w for e, w in edges.items() if e[0] in nodes and e[1] in nodes}
    back = break_cycles(nodes, edges, source, sink)
    dag = [(a, b) for (a, b) in edges if a != b and (a, b) not in back]
    flipped = [(b, a) for (a, b) in back]
    layer = assign_layers(nodes, dag + [e for e in flipped if e not in set(dag)], source, sink)
    n_layers = max(layer.values()) + 1

    # dummy nodes: every link of the layered graph joins adjacent layers
    order: dict[int, list[str]] = {i: [] for i in range(n_layers)}
    for n in nodes:
        order[layer[n]].append(n)
    links: set[tuple[str, str]] = set()
    chains: dict[tuple[str, str], list[str]] = {}  # edge -> [upper end, dummies..., lower end]
    for edge in [*dag, *back]:
        top, bottom = edge if edge not in back else edge[::-1]
        chain = [top]
        for k in range(layer[top] + 1, layer[bottom]):
            d = f"\0{edge[0]}\0{edge[1]}\0{k}"
            order[k].append(d)
            chain.append(d)
        chain.append(bottom)
        links.update(zip(chain, chain[1:]))
        chains[edge] = chain
    order = reduce_crossings(order, links)

    boxes: dict[str, NodeBox] = {}
    widths: dict[str, float] = {}
    for n in nodes:
        lines = list((labels or {}).get(n) or wrap_label(n))
        w = max(text_width(ln) for ln in lines) + 2 * PAD_X
        h = LINE_H * len(lines) + 2 * PAD_Y
        boxes[n] = NodeBox(n, lines, layer[n], w=w, h=h)
        widths[n] = w
    for k, names in order.items():
        for d in names:
            if d not in boxes:
                widths[d] = DUMMY_W

    # y: stacked layers, each as tall as its tallest box
    heights = [max([boxes[n].h for n in order[i] if n in boxes] or [LINE_H]) for i in range(n_layers)]
    ys, y = [], MARGIN
    for h in heights:
        ys.append(y + h / 2)
        y += h + V_GAP
    height = y - V_GAP + MARGIN

    # x: pack, then pull each node toward its neighbours' mean, layer by layer, down and up
    x: dict[str, float] = {}
    for i in range(n_layers):
        x.update(_place_layer(order[i], widths, {n: 0.0 for n in order[i]}, {n: 1.0 for n in order[i]}))
    up: dict[str, list[str]] = {}
    down: dict[str, list[str]] = {}
    for a, b in links:
        down.setdefault(a, []).append(b)
        up.setdefault(b, []).append(a)
    weight = {n: (4.0 if n.startswith("\0") else 1.0) for i in order for n in order[i]}
    for sweep in range(8):
        going_down = sweep % 2 == 0
        seq = range(1, n_layers) if going_down else range(n_layers - 2, -1, -1)
        nbrs = up if going_down else down
        for i in seq:
            desired = {}
            for n in order[i]:
                ps = [x[m] for m in nbrs.get(n, [])]
                desired[n] = sum(ps) / len(ps) if ps else x[n]
            x.update(_place_layer(order[i], widths, desired, weight))
    left = min(x[n] - widths[n] / 2 for n in x)
    shift = MARGIN - left
    for n in x:
        x[n] += shift
    right = max(x[n] + widths[n] / 2 for n in x)
    has_loop = any(a == b for a, b in edges)
    width = right + MARGIN + (44.0 if has_loop else 0.0)

    for n, box in boxes.items():
        box.x, box.y = x[n], ys[box.layer]

    def point(n: str) -> tuple[float, float]:
        return x[n], ys[layer[n]] if n in boxes else ys[int(n.rsplit("\0", 1)[1])]

    routes: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for edge, chain in chains.items():
        pts = [point(n) for n in chain]
        pts[0] = (pts[0][0], boxes[chain[0]].bottom)
        pts[-1] = (pts[-1][0], boxes[chain[-1]].top)
        routes[edge] = pts[::-1] if edge in back else pts  # back edges are drawn upward
    _spread_ports(routes, boxes)
    return Layout(boxes, [[n for n in order[i] if n in boxes] for i in range(n_layers)], routes,
                  set(back), width, height, _total_crossings(order, links), order)


def _spread_ports(routes: dict[tuple[str, str], list[tuple[float, float]]],
                  boxes: dict[str, NodeBox]) -> None:
    """Give each edge its own attachment point on the box side it uses (ordered by where the
    edge goes next), so that edges a → b and b → a, or two edges into one node, never share
    an end point."""
    sides: dict[tuple[str, str], list[tuple[float, tuple[str, str], int]]] = {}
    for (a, b), pts in routes.items():
        for end, node, idx, nxt in ((0, a, 0, 1), (1, b, -1, -2)):
            side = "bottom" if abs(pts[idx][1] - boxes[node].bottom) < 1e-6 else "top"
            sides.setdefault((node, side), []).append((pts[nxt][0], (a, b), idx))
    for (node, side), items in sides.items():
        box = boxes[node]
        items.sort(key=lambda it: (it[0], it[1]))
        k = len(items)
        span = box.w * 0.7
        for j, (_, edge, idx) in enumerate(items):
            px = box.x if k == 1 else box.x - span / 2 + span * j / (k - 1)
            pts = routes[edge]
            pts[idx] = (px, pts[idx][1])
