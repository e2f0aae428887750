"""The layered layout of the report's workflow graph (scoring/report/layout.py) on real
multi-agent sequences (Who&When: Magentic-One, CaptainAgent) and on crafted graphs."""
from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from scoring.report.graph import END, START, WorkflowGraph, collapse_rare, render_svg
from scoring.report.layout import (assign_layers, break_cycles, layered_layout, reduce_crossings,
                                    wrap_label)

WHOWHEN = Path(__file__).resolve().parents[1] / "datasets" / "real" / "seq_whowhen_magentic_captain.jsonl"


def whowhen_graphs() -> dict[str, WorkflowGraph]:
    """The agent sequence of every workflow of the real Who&When copy, per workflow type."""
    calls = defaultdict(list)
    for line in WHOWHEN.read_text().splitlines():
        r = json.loads(line)
        calls[(r["workflow_type_id"], r["workflow_id"])].append((r["t_arrival"], r["source_index"], r["agent_id"]))
    seqs = defaultdict(list)
    for (wt, _), cs in calls.items():
        seqs[wt].append([a for _, _, a in sorted(cs)])
    return {wt: WorkflowGraph.from_symbol_sequences(wt, s) for wt, s in seqs.items()}


def random_graph(seed: int, n: int) -> tuple[list[str], dict[tuple[str, str], float]]:
    """A connected random workflow graph with loops, self-loops and fan-out."""
    rng = np.random.default_rng(seed)
    names = [f"Agent_{i}_{'x' * int(rng.integers(1, 30))}" for i in range(n)]
    edges = {(START, names[0]): 1.0}
    for i, a in enumerate(names):
        for b in rng.choice(names, size=int(rng.integers(1, 4)), replace=False):
            edges[(a, str(b))] = float(rng.uniform(0.02, 1))
        if i + 1 < n:
            edges[(a, names[i + 1])] = 0.5
    edges[(names[-1], END)] = 0.5
    edges[(names[n // 2], END)] = 0.2
    return [START, *names, END], edges


def cases():
    out = []
    for wt, g in sorted(whowhen_graphs().items()):
        g = collapse_rare(g)
        out.append((f"whowhen-{wt}", g.nodes, g.edges))
    for seed, n in ((0, 8), (1, 12), (2, 16)):
        nodes, edges = random_graph(seed, n)
        out.append((f"random-{seed}-{n}", nodes, edges))
    return out


CASES = cases()


@pytest.mark.parametrize("name,nodes,edges", CASES, ids=[c[0] for c in CASES])
def test_no_two_boxes_overlap(name, nodes, edges):
    lay = layered_layout(nodes, edges, START, END)
    assert set(lay.nodes) == set(nodes)
    for a, b in itertools.combinations(lay.nodes.values(), 2):
        apart = a.right <= b.left or b.right <= a.left or a.bottom <= b.top or b.bottom <= a.top
        assert apart, (a, b)
    for box in lay.nodes.values():  # inside the drawing
        assert 0 <= box.left and box.right <= lay.width and 0 <= box.top and box.bottom <= lay.height


@pytest.mark.parametrize("name,nodes,edges", CASES, ids=[c[0] for c in CASES])
def test_layers_respect_edge_direction_and_end_is_last(name, nodes, edges):
    lay = layered_layout(nodes, edges, START, END)
    layer = {n: b.layer for n, b in lay.nodes.items()}
    forward = [(a, b) for (a, b) in edges if a != b and (a, b) not in lay.back_edges]
    assert forward and all(layer[a] < layer[b] for a, b in forward)  # acyclic part points down
    assert all(layer[a] >= layer[b] for a, b in lay.back_edges)     # loops point up
    last = max(layer.values())
    assert lay.layers[0] == [START] and lay.layers[-1] == [END] and layer[END] == last
    assert lay.nodes[START].bottom < min(b.top for n, b in lay.nodes.items() if n != START)
    assert lay.nodes[END].top > max(b.bottom for n, b in lay.nodes.items() if n != END)
    # every edge has a route from its source's box to its target's box
    for (a, b), pts in lay.routes.items():
        assert abs(pts[0][1] - (lay.nodes[a].top if (a, b) in lay.back_edges else lay.nodes[a].bottom)) < 1e-6
        assert abs(pts[-1][1] - (lay.nodes[b].bottom if (a, b) in lay.back_edges else lay.nodes[b].top)) < 1e-6


def test_cycle_breaking_keeps_the_heavy_flow_forward():
    # Magentic-One's shape: Orchestrator hands to WebSurfer (0.7), which always hands back.
    edges = {(START, "O"): 1.0, ("O", "W"): 0.7, ("W", "O"): 0.95, ("O", "O"): 0.2, ("W", END): 0.05,
             ("O", END): 0.1}
    back = break_cycles([START, "O", "W", END], edges, START, END)
    assert back == {("W", "O")}
    layers = assign_layers([START, "O", "W", END], [e for e in edges if e[0] != e[1] and e not in back],
                           START, END)
    assert layers == {START: 0, "O": 1, "W": 2, END: 3}
    with pytest.raises(ValueError):
        assign_layers(["a", "b"], [("a", "b"), ("b", "a")], "a", "b")


def test_barycenter_removes_avoidable_crossings():
    order = {0: ["a", "b", "c"], 1: ["z", "y", "x"]}
    links = {("a", "x"), ("b", "y"), ("c", "z")}
    best = reduce_crossings(order, links)
    assert best[1] == ["x", "y", "z"]


def test_long_names_are_wrapped_not_cut():
    for name in ("Ali_Khan_Shows_and_New_Mexican_Cuisine_Expert", "VideoContentAnalysis_Expert",
                 "reader|searcher|writer|reviewer", "x" * 50, "START"):
        lines = wrap_label(name, 20)
        assert all(len(ln) <= 20 for ln in lines)
        assert "".join(lines).replace(" ", "") == name.replace(" ", "")
    assert wrap_label("VideoContentAnalysis_Expert", 20) == ["VideoContent", "Analysis_Expert"]


def test_many_agents_are_pooled_and_probabilities_stay_normalised():
    g = whowhen_graphs()["captain_agent"]
    assert len(g.nodes) - 2 > 16  # CaptainAgent: dozens of per-task experts
    c = collapse_rare(g, max_nodes=10)
    assert len(c.nodes) == 10 + 3 and c.nodes[0] == START and c.nodes[-1] == END
    (other, rest), = c.merged.items()
    assert len(rest) == len(g.nodes) - 2 - 10 and other in c.nodes
    assert sum(c.counts.values()) == sum(g.counts.values())
    for a in c.nodes[:-1]:
        assert sum(p for (x, _), p in c.edges.items() if x == a) == pytest.approx(1.0)
    svg = render_svg(c, "g", 0.01)
    assert svg.count('class="node"') == len(c.nodes)
    assert "Verification_Expert" in svg


def test_svg_nodes_carry_every_wrapped_line():
    g = collapse_rare(whowhen_graphs()["magentic_one"])
    svg = render_svg(g, "m", 0.01)
    for agent in ("Orchestrator", "WebSurfer", "FileSurfer", "Assistant"):
        assert f'data-node="{agent}"' in svg and f">{agent}</tspan>" in svg
    assert "…" not in svg
