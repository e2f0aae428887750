"""Crash safety of an incremental fit: a kill -9 or a full disk at every statement and file write.

The second batch continues workflows already in the store, so the fit takes their stored calls out
and re-derives them (the path that lost data before ingest was one transaction). At every fault
point of that fit (:mod:`store.faults`) the fit is killed (``os._exit(137)`` in a forked
child: no cleanup, no rollback, exactly like kill -9) or hits a full disk (``ENOSPC``), then run
again; after the re-run the store holds every call exactly once, quarantine has no duplicate
rows, no temp folder is left, and the profile is byte-for-byte the one an uninterrupted fit
writes.
"""
from __future__ import annotations

import collections
import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from store import faults
from fitting.profile_fit import FitOptions, fit_profile
from store.profile_artifact import load_profile
from store.duckdb_store import StoreError
from store.workloads import generate

OPTIONS = FitOptions(conditional=False)


def _write(path: Path, records: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Two log batches (the second continues every workflow of the first, with one bad record),
    a store fitted on the first, and the reference: the uninterrupted incremental fit."""
    root = tmp_path_factory.mktemp("crash")
    by_wf = collections.defaultdict(list)
    for rec in generate("coding_assistant", 6, seed=3):
        by_wf[rec["workflow_id"]].append(rec)
    first, second = [], []
    for recs in by_wf.values():
        recs.sort(key=lambda r: r["t_arrival"])
        first += recs[: len(recs) // 2]
        second += recs[len(recs) // 2:]
    bad = dict(second[0], request_id="bad", output_tokens=1e30)  # quarantined: over the ceiling
    _write(root / "logs1" / "a.jsonl", first)
    _write(root / "logs2" / "b.jsonl", second + [bad, "{not json"])
    base = root / "base"
    fit_profile([root / "logs1"], base, options=OPTIONS)
    ref = root / "ref"
    shutil.copytree(base, ref)
    labels: list[str] = []
    faults.hook = labels.append
    try:
        fit_profile([root / "logs1", root / "logs2"], ref, options=OPTIONS)
    finally:
        faults.hook = None
    return {"root": root, "base": base, "paths": [root / "logs1", root / "logs2"], "labels": labels,
            "calls": len(first) + len(second), "ref": snapshot(ref)}


def snapshot(profile_root: Path) -> dict:
    """What must match the uninterrupted fit: profile.json, calls, tool rows, quarantine."""
    prof = load_profile(profile_root)
    con = duckdb.connect(str(profile_root / "store.duckdb"), read_only=True)
    try:
        q = lambda sql: con.execute(sql).fetchall()  # noqa: E731
        return {
            "profile": (prof.path / "profile.json").read_text(),
            "version": prof.version,
            "calls": q("SELECT count(*), count(DISTINCT request_id) FROM calls")[0],
            "call_rows": q("SELECT request_id, call_index, workflow_calls, prev_request_id, next_request_id, "
                           "gap_after_s FROM calls ORDER BY request_id"),
            "tool_calls": q("SELECT count(*) FROM tool_calls")[0][0],
            "quarantine": q("SELECT file, line, reason FROM quarantine ORDER BY ALL"),
            "files": q("SELECT path, rows_loaded FROM ingested_files ORDER BY ALL"),
            "temps": sorted(p.name for p in (profile_root / "versions").iterdir() if p.name.startswith(".")),
        }
    finally:
        con.close()


def _at(n: int, action):
    """A fault hook that runs ``action(label)`` at the ``n``-th point (0-based)."""
    seen = [0]

    def hook(label: str) -> None:
        if seen[0] == n:
            action(label)
        seen[0] += 1
    return hook


def test_reference_fit_is_incremental_and_has_every_call(setup):
    ref = setup["ref"]
    assert ref["calls"] == (setup["calls"], setup["calls"])
    assert any(r[2].startswith("out of range: output_tokens") for r in ref["quarantine"])
    assert ref["temps"] == []
    labels = setup["labels"]
    # the dangerous statements are among the points: the old rows of continued workflows are
    # deleted and re-inserted, inside the transaction
    assert {"sql: DELETE FROM calls t", "sql: BEGIN TRANSACTION", "sql: COMMIT", "committed",
            "rename CURRENT"} <= set(labels)
    assert len(labels) >= 30


@pytest.mark.slow  # ~20 s alone: 43 forked fits and their re-runs
def test_kill_at_every_point_loses_and_duplicates_nothing(setup, tmp_path):
    labels, ref = setup["labels"], setup["ref"]
    for n, label in enumerate(labels):
        work = tmp_path / f"kill{n}"
        shutil.copytree(setup["base"], work)
        pid = os.fork()
        if pid == 0:  # child: the fit, killed at point n
            try:
                faults.hook = _at(n, lambda _label: os._exit(137))
                fit_profile(setup["paths"], work, options=OPTIONS)
            finally:
                os._exit(0)  # reached only if point n was never hit
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 137, f"point {n} ({label}) was not reached"
        fit_profile(setup["paths"], work, options=OPTIONS)  # the re-run
        got = snapshot(work)
        assert got["calls"] == ref["calls"], f"kill at {n} ({label}): calls lost or duplicated"
        assert got == ref, f"kill at {n} ({label}): store or profile differs from the uninterrupted fit"
        shutil.rmtree(work)


def _enospc(label: str) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def _duckdb_full(label: str) -> None:
    raise duckdb.IOException('IO Error: Could not write file "store.duckdb.wal": No space left on device')


@pytest.mark.slow  # ~12 s alone
def test_full_disk_at_every_write_loses_and_duplicates_nothing(setup, tmp_path):
    """ENOSPC (as an OSError, or as DuckDB reports it) at the first occurrence of every distinct
    statement from BEGIN on and at every file write (before BEGIN only temp tables are written;
    the kill test covers those points)."""
    labels, ref = setup["labels"], setup["ref"]
    begin = labels.index("sql: BEGIN TRANSACTION")
    points = [n for n in range(begin, len(labels)) if labels[n] not in labels[begin:n]]
    assert len(points) >= 20
    for n in points:
        label = labels[n]
        work = tmp_path / f"full{n}"
        shutil.copytree(setup["base"], work)
        before = snapshot(work)
        faults.hook = _at(n, _duckdb_full if label.startswith("sql") and n % 2 else _enospc)
        try:
            with pytest.raises((OSError, StoreError)) as info:
                fit_profile(setup["paths"], work, options=OPTIONS)
        finally:
            faults.hook = None
        assert "No space left" in str(info.value) or "disk is full" in str(info.value)
        if label not in ("committed", "mkdtemp") and not label.startswith(("write", "rename")):
            # failed before the commit: the store is exactly as before
            assert snapshot(work)["calls"] == before["calls"], f"full disk at {n} ({label})"
        fit_profile(setup["paths"], work, options=OPTIONS)
        assert snapshot(work) == ref, f"full disk at {n} ({label}): differs after the re-run"
        shutil.rmtree(work)


@pytest.mark.slow
def test_stale_temp_folders_are_removed_by_the_next_fit(setup, tmp_path):
    work = tmp_path / "stale"
    shutil.copytree(setup["base"], work)
    (work / "versions" / ".tmp-999999999-abc").mkdir()     # its process is gone
    (work / "versions" / ".tmp-legacy").mkdir()            # the old naming, no pid
    (work / "versions" / f".tmp-{os.getpid()}-live").mkdir()  # a live writer's: kept
    fit_profile(setup["paths"], work, options=OPTIONS)
    left = sorted(p.name for p in (work / "versions").iterdir() if p.name.startswith("."))
    assert left == [f".tmp-{os.getpid()}-live"]


CLI_WITH_FULL_DISK = textwrap.dedent("""
    import errno, sys
    from store import faults
    from profiler.cli import main
    def hook(label):
        if label == {label!r}:
            raise OSError(errno.ENOSPC, "No space left on device", {filename!r})
    faults.hook = hook
    sys.argv = ["profiler", *sys.argv[1:]]
    main()
""")


@pytest.mark.parametrize("label,filename", [("sql: DELETE FROM calls t", None),
                                            ("write profile.json", "profile.json")])
@pytest.mark.slow
def test_cli_full_disk_is_one_line_error(setup, tmp_path, label, filename):
    work = tmp_path / "cli"
    shutil.copytree(setup["base"], work)
    before = snapshot(work)
    script = CLI_WITH_FULL_DISK.format(label=label, filename=filename)
    run = subprocess.run([sys.executable, "-c", script, "fit", *map(str, setup["paths"]), "--out", str(work), "--append", "-q"],
                         capture_output=True, text=True)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "disk is full" in lines[0], run.stderr
    after = snapshot(work)
    if label.startswith("sql"):
        assert after == before  # rolled back
    assert after["version"] == before["version"]  # CURRENT still names the old profile


@pytest.mark.slow
def test_cli_lock_conflict_is_one_line_error(setup, tmp_path):
    work = tmp_path / "locked"
    shutil.copytree(setup["base"], work)
    holder = duckdb.connect(str(work / "store.duckdb"))  # this process holds the store's lock
    try:
        run = subprocess.run([sys.executable, "-m", "profiler", "fit", str(setup["paths"][1]), "--out", str(work),
                              "--append", "-q"], capture_output=True, text=True)
    finally:
        holder.close()
    assert run.returncode != 0 and "Traceback" not in run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert "in use by another process" in line and f"PID {os.getpid()}" in line


@pytest.fixture
def small_disk(tmp_path):
    """A real 16 MiB tmpfs (needs root and mount rights: skipped elsewhere)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.slow
def test_real_full_disk_on_a_small_tmpfs(setup, small_disk):
    """The disk really fills (DuckDB's own writes and the profile's): one-line error, the store
    as before, and after freeing space the re-run equals the uninterrupted fit."""
    work = small_disk / "profile"
    shutil.copytree(setup["base"], work)
    before = snapshot(work)
    filler = small_disk / "filler"
    with open(filler, "wb") as fh:  # leave ~64 KiB free
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        fh.write(b"\0" * max(0, free - 64 * 1024))
    run = subprocess.run([sys.executable, "-m", "profiler", "fit", *map(str, setup["paths"]), "--out", str(work), "--append", "-q"],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("error:") and "disk is full" in line
    filler.unlink()
    assert snapshot(work)["calls"] == before["calls"]
    fit_profile(setup["paths"], work, options=OPTIONS)
    assert snapshot(work) == setup["ref"]


@pytest.mark.slow
def test_real_file_size_limit_is_one_line_error(setup, tmp_path):
    """Issue 24: a real RLIMIT_FSIZE (``ulimit -f``; Python ignores SIGXFSZ, so writes fail with
    EFBIG, which DuckDB reports as "File too large") gave a 38-line traceback and exit 1. Now:
    one line, exit 2, the store as before."""
    import resource

    work = tmp_path / "limited"
    shutil.copytree(setup["base"], work)
    before = snapshot(work)
    limit = 16 * 1024  # the new batch does not fit in the WAL under it

    def small_files() -> None:  # in the child only
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    run = subprocess.run([sys.executable, "-m", "profiler", "fit", *map(str, setup["paths"]), "--out", str(work), "--append", "-q"],
                         capture_output=True, text=True, preexec_fn=small_files)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("error:") and "file-size limit" in line
    assert snapshot(work)["calls"] == before["calls"]
