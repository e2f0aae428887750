"""`profiler report`: the page's content, its self-containment, and a real headless Chromium
loading it (DevTools protocol over a pipe: console errors, network requests, a screenshot)."""
from __future__ import annotations

import base64
import io
import itertools
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from profiler.cli import app

pytest.importorskip("matplotlib", reason="profiler report needs the [report] extra (matplotlib)")
pytestmark = pytest.mark.slow   # every test renders a report; two drive a real browser

WT = "review_bot"


def synthetic_logs(path: Path, n_workflows: int, seed: int) -> Path:
    """Workflows ``planner coder{1,3} reviewer`` (with tools) and, in 1 of 40, the rare shortcut
    ``planner reviewer`` — a transition the 5 % pruning must drop."""
    rng = np.random.default_rng(seed)
    lines, t = [], 1_760_000_000.0
    for w in range(n_workflows):
        agents = ["planner", "reviewer"] if w % 40 == 39 else \
            ["planner", *["coder"] * int(rng.integers(1, 4)), "reviewer"]
        for i, agent in enumerate(agents):
            out = int(rng.lognormal({"planner": 4.0, "coder": 6.5, "reviewer": 5.2}[agent], 0.35))
            dur = 0.2 + out / 60.0
            rec = {"request_id": f"s{seed}-w{w}-{i}", "workflow_type_id": WT, "workflow_id": f"s{seed}-w{w}",
                   "agent_id": agent, "t_arrival": t, "t_finish": t + dur,
                   "input_tokens": int(500 + 300 * i), "output_tokens": out,
                   "cached_tokens": 0 if i == 0 else int(500 + 300 * (i - 1))}  # the previous prompt is cached
            t += dur
            tool = {"planner": "search", "coder": "run_tests"}.get(agent)
            if tool and i < len(agents) - 1:
                lat = float(rng.lognormal({"search": -0.5, "run_tests": 1.0}[tool], 0.5))
                rec["tool_calls"] = [{"name": tool, "t_start": t + 0.01, "t_end": t + 0.01 + lat, "status": "ok"}]
                t += lat + 0.02
            lines.append(json.dumps(rec))
        t += 5.0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def report_html(tmp_path_factory) -> tuple[Path, str]:
    from fitting.profile_fit import FitOptions, fit_profile

    root = tmp_path_factory.mktemp("report")
    train = synthetic_logs(root / "logs" / "train.jsonl", 240, seed=1)
    heldout = synthetic_logs(root / "heldout" / "test.jsonl", 80, seed=2)
    fit_profile([train], root / "profile", options=FitOptions(min_calls=20))  # with the workflows section
    out = root / "report.html"
    result = CliRunner().invoke(app, ["report", "--profile", str(root / "profile"), "--out", str(out),
                                      "--eval", str(heldout.parent)])
    assert result.exit_code == 0, result.output
    return out, out.read_text()


def test_graph_has_agents_probabilities_and_greyed_pruned_edge(report_html):
    _, html = report_html
    svg = re.search(r'<svg id="wt-review_bot-graph".*?</svg>', html, re.S).group(0)
    nodes = re.findall(r'data-node="([^"]+)"', svg)
    assert nodes == ["START", "planner", "coder", "reviewer", "END"]  # ordered by mean position
    edges = {(a, b): (float(p), "pruned" in cls) for cls, a, b, p in re.findall(
        r'<g class="(edge[^"]*)" data-from="([^"]+)" data-to="([^"]+)" data-p="([^"]+)"', svg)}
    assert edges[("START", "planner")] == (1.0, False)
    assert edges[("reviewer", "END")] == (1.0, False)
    p_short, pruned = edges[("planner", "reviewer")]
    assert pruned and p_short == pytest.approx(6 / 240)  # 1 workflow in 40 takes the shortcut
    assert edges[("planner", "coder")][0] == pytest.approx(234 / 240)
    assert not edges[("coder", "coder")][1] and not edges[("coder", "reviewer")][1]
    assert "planner (coder){1,3} reviewer" in html  # the synthesized regex


def test_histograms_cdfs_and_eval_figures_are_inline(report_html):
    _, html = report_html
    imgs = re.findall(r'<img[^>]*src="([^"]+)"[^>]*alt="([^"]+)"', html)
    alts = [alt for _, alt in imgs]
    for agent in ("planner", "coder", "reviewer"):
        assert f"output-length histogram of {agent}" in alts
    assert "latency CDF of search" in alts and "latency CDF of run_tests" in alts
    assert "band coverage per agent" in alts and "tool p95 coverage" in alts
    from scoring.evaluation import EVAL_EXTENSIONS

    if any(ext.__module__.startswith("synth.") for ext in EVAL_EXTENSIONS):  # path scores of issue 3
        assert "path accuracy per workflow type" in alts
        assert "remaining-calls error per workflow type" in alts
    for src, alt in imgs:
        assert src.startswith("data:image/svg+xml;base64,")
        svg = base64.b64decode(src.split(",", 1)[1]).decode()
        assert "<svg" in svg
    planner = next(base64.b64decode(s.split(",", 1)[1]).decode() for s, a in imgs
                   if a == "output-length histogram of planner")
    assert "band [" in planner and "of stored calls inside" in planner
    assert "lognormal μ=" in next(base64.b64decode(s.split(",", 1)[1]).decode() for s, a in imgs
                                  if a == "latency CDF of run_tests")


def test_context_cache_load_and_calibration_plots(report_html):
    """Real times and cached_tokens: every one of the four plots is drawn, with its numbers."""
    _, html = report_html
    imgs = {alt: base64.b64decode(src.split(",", 1)[1]).decode()
            for src, alt in re.findall(r'<img[^>]*src="([^"]+)"[^>]*alt="([^"]+)"', html)}
    assert "input tokens by call index" in imgs["context growth per workflow"]
    # prompts grow by 300 tokens a call and the previous prompt is cached: 0 % at the first call
    cached = imgs["cached-token share"]
    assert "of input tokens cached overall" in cached and "calls report cached_tokens" in cached
    assert "calls in flight" in imgs["arrivals and concurrency over time"]
    assert "open workflows" in imgs["arrivals and concurrency over time"]
    curve = imgs["coverage calibration curve per agent"]
    assert "perfectly calibrated" in curve and "coder (n " in curve
    assert "path coverage: the regex accepts 100.0% of the 240 training workflows" not in html  # 1 in 40 pruned
    assert re.search(r"path coverage: the regex accepts 9\d\.\d% of the 240 training workflows", html)


def test_load_and_context_data_match_the_logs(report_html):
    from scoring.report.data import CALIBRATION_LEVELS, calibration_curves, context_growth, load_over_time, open_store

    path, _ = report_html
    con = open_store(path.parent / "profile" / "store.duckdb")
    try:
        cg = context_growth(con, WT)
        ld = load_over_time(con, WT)
        curves = calibration_curves(con, WT, {"planner": ["planner"], "all": ["planner", "coder", "reviewer"],
                                              "nobody": ["no-such-agent"]})
    finally:
        con.close()
    # order-statistic bands cross-validated by workflow on 240 lognormal outputs: calibrated
    obs, n = curves["planner"]
    assert n == 240 and np.all(np.diff(obs) >= 0)
    assert np.all(np.abs(obs - np.array(CALIBRATION_LEVELS)) < 0.08), obs
    assert curves["all"][1] == cg.calls  # every ok call of the type is held out once
    assert "nobody" not in curves
    assert list(cg.index[:3]) == [0, 1, 2] and list(cg.q50[:3]) == [500, 800, 1100]  # 500 + 300 i
    assert cg.cached_share[0] == 0 and cg.cached_share[1] == pytest.approx(500 / 800)
    assert cg.cached_calls == cg.calls
    # workflows run one after another: never more than one open, one call at a time
    assert ld.workflows.max() == 1 and ld.calls.max() == 1 and ld.arrivals.sum() == 240


def test_page_loads_nothing_from_outside(report_html):
    _, html = report_html
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)
    assert "@import" not in html and "url(http" not in html
    assert "<link" not in html and "<script src" not in html


# ----------------------------------------------------------------- headless Chromium
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--remote-debugging-pipe"]


class DevToolsPipe:
    """Chromium driven over ``--remote-debugging-pipe`` (fd 3: commands in, fd 4: replies out;
    NUL-separated JSON messages of the Chrome DevTools Protocol)."""

    def __init__(self, executable: str):
        import fcntl

        self.profile_dir = tempfile.mkdtemp(prefix="chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()

        def child_fds():  # runs in the child: put the pipe ends at fds 3 and 4
            a = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen([executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile_dir}",
                                      "about:blank"], preexec_fn=child_fds, close_fds=False,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []

    def _read_message(self, timeout: float) -> dict:
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._out_r], [], [], timeout)
            if not ready:
                raise TimeoutError("no message from Chromium")
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read_message(timeout)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30.0) -> dict:
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            event = self._read_message(timeout)
            if event.get("method") == method:
                return event
            self.events.append(event)

    def drain(self, seconds: float) -> None:
        try:
            while True:
                self.events.append(self._read_message(seconds))
        except TimeoutError:
            pass

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._out_r)
        shutil.rmtree(self.profile_dir, ignore_errors=True)


def test_real_browser_loads_the_page_without_errors_and_draws_the_graph(report_html, chromium, tmp_path):
    path, _ = report_html
    browser = DevToolsPipe(chromium)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, session=session)
        browser.send("Page.navigate", {"url": path.as_uri()}, session=session)
        browser.wait_for("Page.loadEventFired")
        browser.drain(0.5)

        def evaluate(expr: str):
            return browser.send("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                                session=session)["result"].get("value")

        assert evaluate("document.body.getAttribute('data-ready')") == "1"  # the inline script ran to its end
        assert evaluate("document.body.getAttribute('data-graphs')") == "1"
        errors = [e for e in browser.events if e.get("method") == "Runtime.exceptionThrown"
                  or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
                  or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
        assert errors == []
        requests = [e["params"]["request"]["url"] for e in browser.events
                    if e.get("method") == "Network.requestWillBeSent"]
        assert requests and all(u.startswith(("file:", "data:")) for u in requests), requests

        box = evaluate("(() => { const r = document.getElementById('wt-review_bot-graph')"
                       ".getBoundingClientRect(); return [r.x, r.y + window.scrollY, r.width, r.height]; })()")
        assert box[2] > 150 and box[3] > 300  # layered top to bottom: START above, END below
        shot = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
            "x": box[0], "y": box[1], "width": box[2], "height": box[3], "scale": 1}}, session=session)
        png = base64.b64decode(shot["data"])
        (tmp_path / "graph.png").write_bytes(png)

        # pruned edges are hidden until the toggle shows them
        hidden_before = evaluate("getComputedStyle(document.querySelector('.edge.pruned')).display")
        evaluate("document.querySelector('input.toggle-pruned').click()")
        hidden_after = evaluate("getComputedStyle(document.querySelector('.edge.pruned')).display")
        assert (hidden_before, hidden_after) == ("none", "inline")
    finally:
        browser.close()

    import matplotlib.image as mpimg

    pixels = (mpimg.imread(io.BytesIO(png), format="png")[..., :3] * 255).round().astype(int)
    assert pixels.shape[:2] == (round(box[3]), round(box[2]))
    ink = np.any(pixels < 235, axis=-1).mean()
    assert ink > 0.03  # nodes, arcs and labels, not a blank box

    def share_near(rgb, tol=18):
        return np.all(np.abs(pixels - np.array(rgb)) <= tol, axis=-1).mean()

    assert share_near((43, 108, 176)) > 0.002  # kept transitions (#2b6cb0)
    assert share_near((160, 174, 192)) > 0.0003  # the greyed pruned transition (#a0aec0)


def test_report_without_store_falls_back_to_the_profile(report_html, tmp_path):
    from scoring.report import build_report

    path, _ = report_html
    html = build_report(path.parent / "profile", tmp_path / "r.html", db=tmp_path / "missing.duckdb").read_text()
    assert "histograms and CDFs need the store" in html
    svg = re.search(r'<svg id="wt-review_bot-graph".*?</svg>', html, re.S).group(0)
    assert re.findall(r'data-node="([^"]+)"', svg)[:2] == ["START", "planner"]  # from the automaton's counts
    assert "<table>" in html and "data:image/svg+xml" not in html.split('id="evaluation"')[0]


# --------------------------------------------------- a real multi-agent team in a real browser
REAL_SET = Path(__file__).resolve().parents[1] / "datasets" / "real" / "seq_whowhen_magentic_captain.jsonl"

#: Where the screenshots of the real-team report land (printed by the test; override with
#: REPORT_SCREENSHOT_DIR).
SCREENSHOT_DIR = Path(os.environ.get("REPORT_SCREENSHOT_DIR", tempfile.gettempdir())) / "profiler-report-screenshots"

NODE_BOXES_JS = """(() => {
  const vw = document.documentElement.clientWidth, out = [];
  const r4 = r => [r.left, r.top, r.right, r.bottom];
  document.querySelectorAll('svg.wf-graph').forEach(svg => {
    const box = svg.parentElement.getBoundingClientRect(), s = svg.getBoundingClientRect();
    svg.querySelectorAll('g.node').forEach(g => out.push({
      graph: svg.id, node: g.getAttribute('data-node'),
      lines: Array.from(g.querySelectorAll('tspan')).map(t => t.textContent),
      text: r4(g.querySelector('text').getBoundingClientRect()),
      rect: r4(g.querySelector('rect').getBoundingClientRect()),
      svg: r4(s), box: r4(box), vw: vw}));
  });
  return out;
})()"""


def _inside(inner, outer, tol=0.5):
    return (inner[0] >= outer[0] - tol and inner[1] >= outer[1] - tol
            and inner[2] <= outer[2] + tol and inner[3] <= outer[3] + tol)


@pytest.fixture(scope="module")
def real_team_report(tmp_path_factory) -> tuple[Path, list[str]]:
    """``profiler fit`` + ``profiler report`` on the real Who&When copy (Magentic-One and
    CaptainAgent, order-only times); returns the page and every agent name in the data."""
    root = tmp_path_factory.mktemp("real-team")
    runner = CliRunner()
    result = runner.invoke(app, ["fit", str(REAL_SET), "--out", str(root / "profile")])
    assert result.exit_code == 0, result.output
    out = root / "report.html"
    result = runner.invoke(app, ["report", "--profile", str(root / "profile"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    agents = sorted({json.loads(line)["agent_id"] for line in REAL_SET.read_text().splitlines()})
    return out, agents


def test_real_team_report_shows_every_agent_name_unclipped(real_team_report, chromium):
    path, agents = real_team_report
    html = path.read_text()
    browser = DevToolsPipe(chromium)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
        browser.send("Page.navigate", {"url": path.as_uri()}, session=session)
        browser.wait_for("Page.loadEventFired")
        browser.drain(0.5)

        def evaluate(expr: str):
            return browser.send("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                                session=session)["result"].get("value")

        assert evaluate("document.body.getAttribute('data-ready')") == "1"
        assert evaluate("document.body.getAttribute('data-graphs')") == "2"
        nodes = evaluate(NODE_BOXES_JS)
        by_graph: dict[str, list[dict]] = {}
        for n in nodes:
            by_graph.setdefault(n["graph"], []).append(n)
        assert set(by_graph) == {"wt-magentic_one-graph", "wt-captain_agent-graph"}
        for graph, ns in by_graph.items():
            for n in ns:
                # the full name, wrapped into lines, never cut
                assert "".join(n["lines"]).replace(" ", "") == n["node"].replace(" ", ""), n
                assert "…" not in "".join(n["lines"])
                # the text inside its box, the box inside the drawing, the drawing on the page
                assert _inside(n["text"], n["rect"]), n
                assert _inside(n["rect"], n["svg"]), n
                assert _inside(n["svg"], n["box"]) and n["svg"][2] <= n["vw"], n
            for a, b in itertools.combinations(ns, 2):
                ra, rb = a["rect"], b["rect"]
                assert ra[2] <= rb[0] or rb[2] <= ra[0] or ra[3] <= rb[1] or rb[3] <= ra[1], (a, b)
            tops = {n["node"]: n["rect"][1] for n in ns}
            assert tops["START"] == min(tops.values()) and tops["END"] == max(tops.values())
        drawn = {n["node"] for n in by_graph["wt-magentic_one-graph"]}
        assert {"Orchestrator", "WebSurfer", "FileSurfer", "Assistant"} <= drawn
        # every agent of the data is named on the page: a graph node, or (pooled) in the
        # calibration table and the pooled node's tooltip
        text = evaluate("document.body.textContent")
        missing = [a for a in agents if a not in text]
        assert missing == []

        SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
        shots = []
        for graph in sorted(by_graph):
            box = evaluate(f"(() => {{ const r = document.getElementById('{graph}').parentElement"
                           ".getBoundingClientRect(); return [r.x, r.y + window.scrollY, r.width, r.height]; })()")
            shot = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
                "x": box[0], "y": box[1], "width": box[2], "height": box[3], "scale": 1}}, session=session)
            dest = SCREENSHOT_DIR / f"{graph}.png"
            dest.write_bytes(base64.b64decode(shot["data"]))
            shots.append(dest)
        full = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                            session=session)
        (SCREENSHOT_DIR / "report-top.png").write_bytes(base64.b64decode(full["data"]))
        print(f"\nscreenshots of the real-team report: {', '.join(map(str, shots))}, "
              f"{SCREENSHOT_DIR / 'report-top.png'}")
    finally:
        browser.close()

    import matplotlib.image as mpimg

    for shot in shots:
        pixels = mpimg.imread(shot)[..., :3]
        assert np.any(pixels < 0.9, axis=-1).mean() > 0.02  # a drawing, not a blank box
    # small samples as strips, order-only timelines said so, the rare-edge toggle present
    assert "output lengths of small-sample agents" in html
    assert "timeline of workflow" in html and "no real times" in html
    assert 'class="toggle-rare"' in html
