"""Every Python example in ``docs/`` runs as written.

Each ```python block of every page is executed in a fresh folder that holds what the page says
it works on: a profile fitted on generated coding-assistant workflows (``profile/``, and ``prof``
for docs/synthesis.md), ``calls.jsonl`` from a real ``profiler replay`` against the project's
fake OpenAI server (docs/replay.md), and a real gateway on a free port where the page talks to
``http://127.0.0.1:8080`` (only the port is rewritten). Blocks of one page share one namespace,
in page order, as a reader runs them. The one block that needs infrastructure no test machine
has (a running Ray cluster) is listed in ``NEEDS`` with the test that runs the same call locally;
a new block is executed unless it is added there.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profiler.cli import app
from serving_hooks.fake_openai import FakeOpenAI
from serving_hooks.server_thread import serve_in_thread
from tests.serving_helpers import fit_generated_profile, running_gateway

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"```python\n(.*?)```", re.S)

#: (page, block index) -> why it cannot run here, and where the same call is tested instead.
NEEDS = {
    ("scaling.md", 0): "address='auto' joins a running Ray cluster; tests/test_scale_ray.py runs "
                       "fit_with_ray on a local one",
}

PAGES = [(doc.name, BLOCK.findall(doc.read_text())) for doc in DOCS]
PAGES = [(name, blocks) for name, blocks in PAGES if blocks]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory) -> Path:
    return fit_generated_profile(tmp_path_factory.mktemp("docs-examples"), 40, seed=3, min_calls=10)


def _replay_records(folder: Path) -> None:
    """``calls.jsonl`` as ``profiler replay --out`` writes it (docs/replay.md)."""
    logs = folder / "replay-logs"
    assert CliRunner().invoke(app, ["generate", "--workload", "coding-assistant", "--workflows", "6",
                                    "--seed", "2", "--out", str(logs / "ca.jsonl")]).exit_code == 0
    fake = FakeOpenAI(reply_tokens=24, chunk_delay_s=0.001)   # decode needs >= 16 tokens
    with serve_in_thread(fake.app) as srv:
        res = CliRunner().invoke(app, ["replay", str(logs), "--target", srv.url, "--concurrency", "2",
                                       "--time-scale", "0", "--token-scale", "0.01",
                                       "--out", str(folder / "calls.jsonl")],
                                 env={"PROFILER_REPLAY_PROGRESS": "false"})
    assert res.exit_code == 0, res.output


def test_every_python_block_is_run_or_listed():
    blocks = {(name, i) for name, bl in PAGES for i in range(len(bl))}
    assert set(NEEDS) <= blocks, f"stale NEEDS entries: {set(NEEDS) - blocks}"
    assert len(blocks) >= 7


@pytest.mark.parametrize("page", [name for name, _ in PAGES])
def test_docs_python_examples_run(page, profile_root, tmp_path, monkeypatch):
    blocks = dict(PAGES)[page]
    shutil.copytree(profile_root, tmp_path / "profile")
    shutil.copytree(profile_root, tmp_path / "prof")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{page}"}
    if page == "workflow-paths.md":       # the page continues docs/synthesis.md's `profile`
        exec("from store.profile_artifact import load_profile\nprofile = load_profile('prof')", namespace)
    if any("calls.jsonl" in b for b in blocks):
        _replay_records(tmp_path)
    engine = FakeOpenAI()
    with serve_in_thread(engine.app) as up, running_gateway([up.url], tmp_path / "profile") as gw:
        ran = 0
        for i, code in enumerate(blocks):
            if (page, i) in NEEDS:
                continue
            code = code.replace("http://127.0.0.1:8080", gw.url)
            exec(compile(code, f"docs/{page}#python{i}", "exec"), namespace)
            ran += 1
        if "8080" in "".join(blocks):      # the page's client call went through the gateway
            assert any(r.path.endswith("/chat/completions") for r in engine.received)
    assert ran or all((page, i) in NEEDS for i in range(len(blocks)))
