"""`profiler fit --engine ray` (fitting.distributed) on a local Ray instance: the profile equals
the single-node one on the same logs, and the store holds the same rows."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # local Ray on loopback only
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ray = pytest.importorskip("ray", reason="the ray engine needs the [ray] extra (pip install -e '.[ray]')")

from fitting.distributed import fit_profile_ray, fit_with_ray, plan_shards  # noqa: E402
from store.ingest import IngestError  # noqa: E402
from fitting.profile_fit import FitOptions, fit_profile  # noqa: E402
from store.ingest import discover  # noqa: E402
from store.duckdb_store import connect  # noqa: E402
from store.workloads import generate, write_jsonl  # noqa: E402


def assert_same(a, b, path="profile"):
    """Equal structure and values; floats equal to 1e-9 relative (sums in another order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), f"{path}: keys differ: {sorted(a.keys() ^ b.keys())}"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{path}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ray_logs")
    write_jsonl(generate("coding_assistant", 70, seed=1), root / "a" / "coding-1.jsonl")
    write_jsonl(generate("coding_assistant", 70, seed=2), root / "a" / "coding-2.jsonl")
    write_jsonl(generate("deep_research", 60, seed=3), root / "b" / "research-3.jsonl")
    first = json.loads((root / "a" / "coding-1.jsonl").read_text().splitlines()[0])
    conflicting = {**first, "output_tokens": first["output_tokens"] + 1}
    extra = [json.dumps(first),  # identical duplicate of a call in another file: skipped
             json.dumps(conflicting),  # same id, other content: quarantined
             '{"request_id": "broken"',  # not JSON: quarantined
             *map(json.dumps, generate("deep_research", 8, seed=4))]
    (root / "c").mkdir()
    (root / "c" / "mixed.jsonl").write_text("\n".join(extra) + "\n")
    return root


def test_shards_balance_bytes(logs):
    files = discover([logs])
    plan = plan_shards(files, 2)
    assert sorted(p for group in plan for p in group) == sorted(str(p) for p, _ in files)
    sizes = [sum(Path(p).stat().st_size for p in g) for g in plan]
    largest = max(p.stat().st_size for p, _ in files)
    assert len(plan) == 2 and max(sizes) - min(sizes) <= largest  # greedy: off by at most one file


@pytest.mark.slow
def test_ray_profile_equals_single_node(logs, tmp_path):
    options = FitOptions(min_calls=30)
    local, local_report = fit_profile([logs], tmp_path / "local", options=options)
    timings: dict[str, float] = {}
    remote, remote_report = fit_profile_ray([logs], tmp_path / "ray", options=options, num_cpus=2, shards=3,
                                            timings=timings)
    assert (remote_report.loaded, remote_report.quarantined, remote_report.duplicates) == \
        (local_report.loaded, local_report.quarantined, local_report.duplicates) == (local_report.loaded, 2, 1)
    assert set(local.data) == set(remote.data) and "workflows" in remote.data
    assert_same(local.data, remote.data)
    assert remote.manifest["counts"] == local.manifest["counts"]
    assert remote.manifest["engine"]["shards"] == 3
    assert timings["ingested"] > 0 and timings["fitted"] > 0
    queries = {
        "calls": "SELECT count(*), sum(output_tokens), sum(call_index), sum(gap_after_s) FROM calls",
        "tools": "SELECT count(*), round(sum(latency_s), 6), count(DISTINCT timing_source) FROM tool_calls",
        # the same records are quarantined; a conflict's reason may name another copy of the original
        "quarantine": "SELECT count(*), list((file, line, field) ORDER BY file, line) FROM quarantine",
    }
    a, b = connect(tmp_path / "local" / "store.duckdb"), connect(tmp_path / "ray" / "store.duckdb")
    for name, sql in queries.items():
        ra, rb = a.execute(sql).fetchone(), b.execute(sql).fetchone()
        assert_same(list(ra), list(rb), name)
    assert a.execute("SELECT count(*) FROM quarantine").fetchone()[0] == 2  # conflict + broken line


@pytest.mark.slow
def test_ray_engine_refuses_a_store_with_calls_and_is_strict_on_request(logs, tmp_path):
    fit_profile([logs / "b"], tmp_path / "p", options=FitOptions(min_calls=30))
    with pytest.raises(ValueError, match="already holds"):
        fit_with_ray([logs], tmp_path / "p", num_cpus=1)
    with pytest.raises(IngestError, match="strict mode"):
        fit_with_ray([logs / "c"], tmp_path / "q", num_cpus=1, strict=True)
    assert not (tmp_path / "q" / "CURRENT").exists()
