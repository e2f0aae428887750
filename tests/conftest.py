"""Shared fixtures: small generated workloads and a profile fitted on them (built once per run)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SWE_TRACES = REPO / "datasets" / "swe_agent" / "swe_agent_glm45_bs4.jsonl"


def write_jsonl(path: Path, records: list[dict | str]) -> Path:
    """Write records (dicts, or raw strings for deliberately broken lines) as JSON Lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


@pytest.fixture
def con(tmp_path):
    """A fresh DuckDB store file (closed after the test)."""
    from store import duckdb_store as store

    c = store.connect(tmp_path / "store.duckdb")
    yield c
    c.close()


@pytest.fixture(scope="session")
def coding_logs(tmp_path_factory) -> Path:
    """120 generated coding-assistant workflows (train side) as one JSONL file."""
    from store.workloads import generate, write_jsonl as wj

    out = tmp_path_factory.mktemp("coding") / "coding.jsonl"
    wj(generate("coding_assistant", 120, seed=11), out)
    return out


@pytest.fixture(scope="session")
def coding_test_logs(tmp_path_factory) -> Path:
    """60 further coding-assistant workflows (another seed: never seen by the fit)."""
    from store.workloads import generate, write_jsonl as wj

    out = tmp_path_factory.mktemp("coding_test") / "coding_test.jsonl"
    wj(generate("coding_assistant", 60, seed=12), out)
    return out


@pytest.fixture(scope="session")
def fitted_profile(tmp_path_factory, coding_logs) -> Path:
    """Profile root fitted on ``coding_logs`` (read-only for tests: copy before changing)."""
    from fitting.profile_fit import fit_profile

    root = tmp_path_factory.mktemp("profile")
    fit_profile([coding_logs], root)
    return root


@pytest.fixture(scope="module")
def upstream():
    """A fake OpenAI-compatible server on a real port (``.url``; ``.received`` holds what it got)."""
    from serving_hooks.fake_openai import FakeOpenAI
    from serving_hooks.server_thread import serve_in_thread

    fake = FakeOpenAI()
    with serve_in_thread(fake.app) as server:
        fake.url = server.url
        yield fake


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium for the headless-browser tests (the report, /docs); skips without it."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it with apt-get; locally: "
                    "apt-get install -y chromium)")
    return exe
