"""`profiler report` on a large team: CaptainAgent's 176 per-task experts (Who&When, order-only
times; tests/fixtures/captain_agent_176.jsonl). Roles pool the experts, pruned transitions are
hidden until asked for, the regex says how much it covers, the new plots are on the page, and a
real headless Chromium shows a bounded graph whose edge labels overlap nothing."""
from __future__ import annotations

import base64
import itertools
import json
import os
import re
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profiler.cli import app
from scoring.report.graph import END, START, MAX_NODES, WorkflowGraph, collapse_rare, pool, render_svg
from scoring.report.roles import DEFAULT_RULES, GROUP_ABOVE, RoleRule, group_roles, parse_rule, role_paths

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "captain_agent_176.jsonl"
SCREENSHOT_DIR = Path(os.environ.get("REPORT_SCREENSHOT_DIR", tempfile.gettempdir())) / "profiler-report-screenshots"


def fixture_calls() -> dict[str, int]:
    calls: dict[str, int] = {}
    for line in FIXTURE.read_text().splitlines():
        a = json.loads(line)["agent_id"]
        calls[a] = calls.get(a, 0) + 1
    return calls


# ------------------------------------------------------------------------------- roles
def test_default_rules_pool_the_176_experts_into_two_roles():
    calls = fixture_calls()
    assert len(calls) == 176
    roles = group_roles(calls)
    assert set(roles.members) == {"verifier experts", "domain experts"}
    assert roles.role_of["Verification_Expert"] == roles.role_of["DataVerification_Expert"] == "verifier experts"
    assert roles.role_of["Validation_Expert"] == "verifier experts"
    assert roles.role_of["Geometry_Expert"] == roles.role_of["Quotation_Specialist"] == "domain experts"
    assert sum(len(m) for m in roles.members.values()) == 176  # every agent is in a role
    assert roles.members["verifier experts"][0] == "Verification_Expert"  # most calls first


def test_small_teams_are_not_grouped_and_single_matches_keep_their_name():
    few = {f"A{i}_Expert": 3 for i in range(GROUP_ABOVE)}
    assert not group_roles(few).active
    many = {**few, "Lone_Specialist": 1, "Orchestrator": 50}
    roles = group_roles(many, (RoleRule("Specialist$", "specialists"), RoleRule("Expert$", "experts")))
    assert roles.role_of["Lone_Specialist"] == "Lone_Specialist"  # a role of one is no role
    assert roles.role_of["Orchestrator"] == "Orchestrator"
    assert roles.members == {"experts": sorted(few)}
    assert not group_roles(many, ()).active


def test_group_rule_parsing_and_fanout_symbols():
    assert parse_rule("(?i)expert$=experts") == RoleRule("(?i)expert$", "experts")
    assert parse_rule("a=b=c").role == "c" and parse_rule("a=b=c").pattern == "a=b"
    for bad in ("no-equals", "=role", "([a-z=x", "x= "):
        with pytest.raises(ValueError):
            parse_rule(bad)
    roles = group_roles(fixture_calls(), DEFAULT_RULES)
    assert roles.symbol("Geometry_Expert|Verification_Expert|Grocery_Expert") == "domain experts|verifier experts"
    assert roles.symbol("START") == "START"


def test_role_paths_fold_runs_and_add_up_to_their_coverage():
    roles = group_roles(fixture_calls())
    seqs = [("Geometry_Expert", "Grocery_Expert", "Verification_Expert")] * 3 + [("Geometry_Expert",)]
    rows, n = role_paths(seqs, roles)
    assert n == 4
    assert rows == [("domain experts+ → verifier experts", 3, 0.75), ("domain experts", 1, 1.0)]


def test_pooled_graph_keeps_probabilities_normalised_and_pruning_all_or_nothing():
    seqs = [("X_Expert", "Y_Expert", "Verification_Expert")] * 6 + [("Z_Expert",)] * 4
    g = WorkflowGraph.from_symbol_sequences("t", seqs)
    g.pruned = {("START", "Z_Expert"), ("START", "X_Expert")}
    roles = group_roles({a: 1 for a in ["X_Expert", "Y_Expert", "Z_Expert", "Verification_Expert"]}, above=2)
    p = pool(g, roles.symbol, roles.members)
    assert p.nodes == [START, "domain experts", "Verification_Expert", END]
    for a in p.nodes[:-1]:
        assert sum(v for (x, _), v in p.edges.items() if x == a) == pytest.approx(1.0)
    assert p.edges[("domain experts", "domain experts")] == pytest.approx(6 / 16)  # X -> Y
    assert (START, "domain experts") in p.pruned  # every edge it pools was pruned
    assert ("domain experts", END) not in p.pruned


def _labels_and_nodes(svg: str):
    labels = [(float(x), float(y) - 4) for x, y in re.findall(r'<text x="([\d.]+)" y="([\d.]+)"[^>]*class="edge-label"', svg)]
    nodes = [tuple(map(float, m)) for m in re.findall(
        r'<rect x="([\d.-]+)" y="([\d.-]+)" width="([\d.]+)" height="([\d.]+)"', svg)]
    return labels, nodes


def test_edge_labels_never_overlap_even_with_every_edge_drawn():
    """176 agents without roles, pooled to the 16 busiest + one node: every placed label box is
    clear of every node box and every other label box (labels that find no room are left out)."""
    from scoring.report.graph import LABEL_H, LABEL_W

    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    seqs: dict[str, list[str]] = {}
    for r in rows:
        seqs.setdefault(r["workflow_id"], []).append(r["agent_id"])
    g = collapse_rare(WorkflowGraph.from_symbol_sequences("captain_agent", list(seqs.values())))
    assert len(g.nodes) == MAX_NODES + 3
    svg = render_svg(g, "g", 0.0)
    labels, nodes = _labels_and_nodes(svg)
    assert len(labels) >= len(g.edges) // 2  # most edges keep their label
    boxes = [(x - LABEL_W / 2, y - LABEL_H / 2, x + LABEL_W / 2, y + LABEL_H / 2) for x, y in labels]
    for a, b in itertools.combinations(boxes, 2):
        assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
    for bx in boxes:
        for x, y, w, h in nodes:
            assert bx[2] <= x or x + w <= bx[0] or bx[3] <= y or y + h <= bx[1], (bx, (x, y, w, h))


# ---------------------------------------------------------------------- the whole report
@pytest.fixture(scope="module")
def large_team_report(tmp_path_factory) -> tuple[Path, Path]:
    """``profiler fit`` + ``profiler report`` on the 176-agent team: the default page, and one
    with every agent on its own (``--no-group``) and pruned transitions drawn."""
    pytest.importorskip("matplotlib")
    root = tmp_path_factory.mktemp("large-team")
    runner = CliRunner()
    result = runner.invoke(app, ["fit", str(FIXTURE), "--out", str(root / "profile")])
    assert result.exit_code == 0, result.output
    pages = []
    for name, extra in (("report.html", []), ("all-agents.html", ["--no-group", "--show-pruned"])):
        result = runner.invoke(app, ["report", "--profile", str(root / "profile"), "--out", str(root / name), *extra])
        assert result.exit_code == 0, result.output
        pages.append(root / name)
    return pages[0], pages[1]


@pytest.mark.slow
def test_large_team_page_shows_roles_coverage_and_the_new_plots(large_team_report):
    html = large_team_report[0].read_text()
    assert "<h3>Roles</h3>" in html and "176 agents drawn as 2 roles" in html
    svg = re.search(r'<svg id="wt-captain_agent-graph".*?</svg>', html, re.S).group(0)
    assert re.findall(r'data-node="([^"]+)"', svg) == [START, "domain experts", "verifier experts", END]
    assert 'class="toggle-pruned" data-target="wt-captain_agent-graph-box">' in html  # unchecked
    m = re.search(r"path coverage: the regex accepts ([\d.]+)% of the 126 training workflows", html)
    assert m and float(m.group(1)) == pytest.approx(2.4, abs=0.05)
    assert "most common workflow shapes over roles" in html
    alts = re.findall(r'<img[^>]*alt="([^"]+)"', html)
    assert "context growth per workflow" in alts
    assert "coverage calibration curve per agent" in alts
    assert "output lengths of small-sample agents by role" in alts
    assert "no real times (order only): no arrivals or concurrency" in html
    assert "no call reports cached_tokens" in html
    curve = next(base64.b64decode(s.split(",", 1)[1]).decode() for s, a in re.findall(
        r'<img[^>]*src="([^"]+)"[^>]*alt="([^"]+)"', html) if a == "coverage calibration curve per agent")
    assert "verifier experts (pooled)" in curve and "perfectly calibrated" in curve


GRAPH_JS = """(() => {
  const vis = el => getComputedStyle(el).display !== 'none';
  const r4 = r => [r.left, r.top, r.right, r.bottom];
  const svg = document.getElementById(%r);
  const edges = Array.from(svg.querySelectorAll('g.edge')).filter(vis);
  return {
    nodes: Array.from(svg.querySelectorAll('g.node rect')).map(r => r4(r.getBoundingClientRect())),
    edges: edges.length, all_edges: svg.querySelectorAll('g.edge').length,
    labels: edges.map(g => g.querySelector('text.edge-label')).filter(t => t)
                 .map(t => r4(t.getBoundingClientRect())),
    svg: r4(svg.getBoundingClientRect()),
  };
})()"""

FIGURES_JS = """(() => {
  const out = {};
  document.querySelectorAll('img').forEach(img => {
    const r = img.getBoundingClientRect();  // closed <details>: not visible, whatever its box
    if (r.height > 0 && img.checkVisibility()) out[img.alt] = (out[img.alt] || 0) + r.height;
  });
  return {figures: out, page: document.documentElement.scrollHeight, vh: window.innerHeight};
})()"""


def _disjoint(a, b, tol=0.5) -> bool:
    return a[2] <= b[0] + tol or b[2] <= a[0] + tol or a[3] <= b[1] + tol or b[3] <= a[1] + tol


def _open(browser, path: Path):
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime"):
        browser.send(f"{domain}.enable", session=session)
    browser.send("Emulation.setDeviceMetricsOverride",
                 {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
    browser.send("Page.navigate", {"url": path.as_uri()}, session=session)
    browser.wait_for("Page.loadEventFired")

    def evaluate(expr: str):
        return browser.send("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                            session=session)["result"].get("value")
    assert evaluate("document.body.getAttribute('data-ready')") == "1"
    return session, evaluate


@pytest.mark.slow
def test_large_team_in_chromium_bounded_graph_and_clear_labels(large_team_report, chromium):
    from tests.test_report_html import DevToolsPipe

    default, all_agents = large_team_report
    browser = DevToolsPipe(chromium)
    try:
        session, evaluate = _open(browser, default)
        g = evaluate(GRAPH_JS % "wt-captain_agent-graph")
        # by default: roles, no pruned or rare edge drawn (today: 494 edges, 488 of them pruned)
        assert len(g["nodes"]) == 4 and g["edges"] <= 6 < g["all_edges"]
        for a, b in itertools.combinations(g["labels"] + g["nodes"], 2):
            assert _disjoint(a, b), (a, b)
        figs = evaluate(FIGURES_JS)
        assert figs["figures"].get("context growth per workflow", 0) > 100
        assert figs["figures"].get("coverage calibration curve per agent", 0) > 100
        # the small-sample dot plots fit in one screen (they ran to five, one row per agent)
        strips = sum(h for alt, h in figs["figures"].items() if alt.startswith("output lengths of small-sample"))
        assert 0 < strips < figs["vh"]
        evaluate("document.querySelector('input.toggle-pruned').click()")
        assert evaluate(GRAPH_JS % "wt-captain_agent-graph")["edges"] > g["edges"]
        SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
        evaluate("document.querySelector('input.toggle-pruned').click()")
        box = evaluate("(() => { const r = document.getElementById('wt-captain_agent-graph-box')"
                       ".getBoundingClientRect(); return [r.x, r.y + window.scrollY, r.width, r.height]; })()")
        shot = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
            "x": box[0], "y": box[1], "width": box[2], "height": box[3], "scale": 1}}, session=session)
        (SCREENSHOT_DIR / "large-team-graph.png").write_bytes(base64.b64decode(shot["data"]))

        # every agent on its own, pruned edges drawn: 16 busiest + one pooled node, labels still clear
        session, evaluate = _open(browser, all_agents)
        g = evaluate(GRAPH_JS % "wt-captain_agent-graph")
        assert len(g["nodes"]) == MAX_NODES + 3
        assert g["edges"] > 20 and len(g["labels"]) > 10
        for a, b in itertools.combinations(g["labels"] + g["nodes"], 2):
            assert _disjoint(a, b), (a, b)
        shot = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
            "x": g["svg"][0], "y": g["svg"][1] + evaluate("window.scrollY"), "width": g["svg"][2] - g["svg"][0],
            "height": g["svg"][3] - g["svg"][1], "scale": 1}}, session=session)
        (SCREENSHOT_DIR / "large-team-all-agents-graph.png").write_bytes(base64.b64decode(shot["data"]))
        print(f"\nscreenshots: {SCREENSHOT_DIR / 'large-team-graph.png'}, "
              f"{SCREENSHOT_DIR / 'large-team-all-agents-graph.png'}")
    finally:
        browser.close()


@pytest.mark.slow
def test_calibration_table_names_each_agents_role(large_team_report):
    html = large_team_report[0].read_text()
    assert "<th>agent</th><th>role</th>" in html
    assert re.search(r"<td>Verification_Expert</td><td>verifier experts</td>", html)
    assert re.search(r"<td>Geometry_Expert</td><td>domain experts</td>", html)
    assert "<th>role</th>" not in large_team_report[1].read_text()  # --no-group


@pytest.mark.slow
def test_group_rules_given_on_the_command_line_apply_to_a_small_team(tmp_path):
    from tests.test_report_html import synthetic_logs

    logs = synthetic_logs(tmp_path / "logs.jsonl", 80, seed=3)
    runner = CliRunner()
    result = runner.invoke(app, ["fit", str(logs), "--out", str(tmp_path / "profile")])
    assert result.exit_code == 0, result.output
    out = tmp_path / "r.html"
    result = runner.invoke(app, ["report", "--profile", str(tmp_path / "profile"), "--out", str(out),
                                 "--group", "^(coder|reviewer)$=workers"])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    svg = re.search(r'<svg id="wt-review_bot-graph".*?</svg>', html, re.S).group(0)
    assert re.findall(r'data-node="([^"]+)"', svg) == [START, "planner", "workers", END]
    assert "3 agents drawn as 1 role and 1 agent no rule pools" in html
    assert "<td>planner → workers+</td>" in html  # the shape table over roles
    result = runner.invoke(app, ["report", "--profile", str(tmp_path / "profile"), "--out", str(out),
                                 "--group", "no-equals-sign"])
    assert result.exit_code == 2 and "--group takes REGEX=ROLE" in result.output
