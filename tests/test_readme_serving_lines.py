"""The README's serving lines run as written: each `profiler serve` / `profiler gateway` line is
started as a real process (only its port, its upstream and the profile folder point at this
test's own: a fitted profile and a recording fake engine on free ports; a gateway's annotation
budget is widened so a loaded machine cannot fail the call open), waits until ready, and
one chat call shows the dialect's hint fields reaching the engine."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from serving_hooks.fake_openai import FakeOpenAI
from serving_hooks.server_thread import serve_in_thread
from tests.serving_helpers import fit_generated_profile, free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
LINES = [line.split("#")[0].strip()
         for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
         for line in block.splitlines() if re.match(r"profiler (serve|gateway) ", line)]

#: What the engine must see for each dialect (body key or header).
EXPECT = {"sglang": lambda b, h: "custom_params" in b and "priority" in b,
          "vllm": lambda b, h: "vllm_xargs" in b and "priority" in b,
          "dynamo": lambda b, h: "agent_hints" in b.get("nvext", {}),
          "headers": lambda b, h: any(k.lower().startswith("x-agentprof-") for k in h)}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory):
    return fit_generated_profile(tmp_path_factory.mktemp("readme-serve"), 30, seed=5, min_calls=10)


def test_readme_has_serving_lines():
    assert any(" serve " in f" {l} " for l in LINES) and sum("--dialect" in l for l in LINES) == 4, LINES


@pytest.mark.parametrize("line", LINES)
def test_readme_serving_line_runs(line, profile_root):
    engine = FakeOpenAI()
    with serve_in_thread(engine.app) as up:
        port = free_port()
        argv = shlex.split(line)
        argv = [str(profile_root) if a == "profile/" else a for a in argv]
        argv = [up.url if a.startswith("http://127.0.0.1:") else a for a in argv]
        argv[argv.index("--port") + 1] = str(port)
        if argv[1] == "gateway" and "--budget-ms" not in argv:
            # the default 5 ms budget fails open (unannotated) when the shared CI machine is loaded:
            # this test checks the hint fields, not the latency budget (tests/test_gateway_* do)
            argv += ["--budget-ms", "2000"]
        proc = subprocess.Popen([sys.executable, "-m", "profiler", *argv[1:]], cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        base = f"http://127.0.0.1:{port}"
        try:
            probe = "/readyz" if argv[1] == "gateway" else "/healthz"

            def ready() -> bool:
                if proc.poll() is not None:
                    return True                      # exited: reported below, no waiting
                try:
                    return httpx.get(base + probe, timeout=5).status_code == 200
                except httpx.HTTPError:
                    return False
            assert wait_for(ready, 120) and proc.poll() is None, \
                f"{line!r} did not become ready: {proc.stdout.read() if proc.poll() is not None else ''}"
            meta = {"workflow_type_id": "coding_assistant", "workflow_id": "readme-1", "agent_id": "planner"}
            if argv[1] == "serve":
                r = httpx.post(base + "/v1/annotate", json={"app_metadata": meta}, timeout=30)
                assert r.status_code == 200 and r.json()["sys_annotations"]["known"] is True
                return
            r = httpx.post(base + "/v1/chat/completions", timeout=30,
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "app_metadata": meta})
            assert r.status_code == 200, r.text
            dialect = argv[argv.index("--dialect") + 1] if "--dialect" in argv else "sglang"
            got = [x for x in engine.received if x.path.endswith("/chat/completions")][-1]
            if "--dialect" in argv:
                assert EXPECT[dialect](got.body or {}, got.headers), (dialect, got.body, got.headers)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
