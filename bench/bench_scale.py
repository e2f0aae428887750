"""Benchmark: `profiler fit` wall time and peak memory at 1M (and, on request, 10M) calls,
single-node and with the Ray engine, with the time split per stage.

    python bench/bench_scale.py                       # 1M calls, local engine
    python bench/bench_scale.py --engine both         # 1M calls, local and ray side by side
    python bench/bench_scale.py --with-10m            # also 10M calls (long: ~5 min to generate, ~9 to fit)
    python bench/bench_scale.py --profile-ingest      # seconds per SQL statement of the 1M ingest

Logs are generated once per size into ``--workdir`` (default ``$TMPDIR/profiler-bench-scale``)
as 16 JSONL shards alternating the coding-assistant and deep-research workloads,
and reused by later runs. Each fit runs in a fresh child process on a fresh profile folder;
peak RSS is the largest sum of resident memory over the child and all its descendants (Ray's
raylet, GCS and workers included), sampled every 0.2 s from /proc. Target: 10M calls in under
5 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import Pool
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARDS = 16
WORKLOADS = ("coding_assistant", "deep_research")


# ------------------------------------------------------------------------------ logs
def _write_shard(job: tuple[int, int, str]) -> int:
    """Write one shard of whole workflows (at least ``calls`` calls); returns the calls written."""
    from store.workloads import generate, write_jsonl

    shard, calls, folder = job
    records = generate(WORKLOADS[shard % 2], None, seed=1000 + shard)
    return write_jsonl(_whole_workflows(records, calls), Path(folder) / f"shard-{shard:02d}.jsonl")


def _whole_workflows(records, calls: int):
    """Records until at least ``calls`` were given, ending on a workflow boundary."""
    n, current = 0, None
    for rec in records:
        if n >= calls and rec["workflow_id"] != current:
            return
        current = rec["workflow_id"]
        n += 1
        yield rec


def ensure_logs(workdir: Path, calls: int, procs: int) -> Path:
    folder = workdir / f"logs-{calls}"
    marker = folder / "DONE"
    if marker.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    t = time.perf_counter()
    per_shard = -(-calls // SHARDS)
    with Pool(procs) as pool:
        written = sum(pool.map(_write_shard, [(i, per_shard, str(folder)) for i in range(SHARDS)]))
    size = sum(p.stat().st_size for p in folder.glob("*.jsonl"))
    marker.write_text(json.dumps({"calls": written, "bytes": size}))
    print(f"generated {written:,} calls ({size / 1e9:.2f} GB) in {time.perf_counter() - t:.0f} s -> {folder}",
          flush=True)
    return folder


# ------------------------------------------------------------------------------ measuring
def _tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and every descendant, from /proc."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            parents[int(entry)] = int(fields[1])
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    tree, frontier = {root}, [root]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier and p not in tree]
        tree.update(kids)
        frontier = kids
    return sum(rss.get(p, 0) for p in tree)


def measure(cmd: list[str]) -> tuple[float, int, str]:
    """(wall s, peak tree RSS bytes, stdout) of one child process."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _tree_rss_bytes(proc.pid))
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    wall = time.perf_counter() - t
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"fit failed ({proc.returncode}): {' '.join(cmd)}")
    return wall, peak[0], out


CHILD_LOCAL = r"""
import json, sys, time
import fitting.profile_fit as f

def hwm_mb():  # this process's peak resident memory so far
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) // 1024

starts = [("ingest", time.perf_counter(), 0)]
def mark(label):
    starts.append((label, time.perf_counter(), hwm_mb()))
ingest = f.ingest_mod.ingest
def timed_ingest(*a, **k):
    r = ingest(*a, **k); mark("fit setup"); return r
f.ingest_mod.ingest = timed_ingest
fit_from_store = f.fit_from_store
def timed_fit(con, options, progress=lambda m: None):
    def step(msg):
        mark(msg.split(" over ")[0]); progress(msg)
    data = fit_from_store(con, options, step)
    mark("write profile")
    return data
f.fit_from_store = timed_fit
if sys.argv[3] != "default":  # cap DuckDB's memory (it spills to disk past it); default: the store's (1/4 of RAM)
    connect = f.connect
    def capped(path, read_only=False):
        con = connect(path, read_only)
        con.execute(f"SET memory_limit = '{sys.argv[3]}'")
        return con
    f.connect = capped
profile, report = f.fit_profile([sys.argv[1]], sys.argv[2])
mark("end")
phases = {a[0]: round(b[1] - a[1], 2) for a, b in zip(starts, starts[1:])}
peak_after = {a[0]: b[2] for a, b in zip(starts, starts[1:])}
print(json.dumps({"calls": profile.manifest["counts"]["calls"], "phases": phases,
                  "peak_mb_after_phase": peak_after}))
"""

CHILD_RAY = r"""
import json, sys
from fitting.distributed import fit_with_ray
timings = {}
memory = None if sys.argv[4] == "default" else sys.argv[4]
profile = fit_with_ray([sys.argv[1]], sys.argv[2], num_cpus=int(sys.argv[3]), task_memory=memory,
                       timings=timings)
print(json.dumps({"calls": profile.manifest["counts"]["calls"], "phases": timings}))
"""


CHILD_INGEST_PROFILE = r"""
import re, sys, time
from collections import defaultdict
from store.ingest import ingest
from store.duckdb_store import connect

class Timed:  # the store connection, timing every statement the ingester runs
    def __init__(self, con):
        self._con, self.times = con, defaultdict(float)
    def execute(self, sql, *args, **kwargs):
        t = time.perf_counter()
        result = self._con.execute(sql, *args, **kwargs)
        self.times[re.sub(r"\s+", " ", sql.strip())[:80]] += time.perf_counter() - t
        return result
    def __getattr__(self, name):
        return getattr(self._con, name)

con = Timed(connect(sys.argv[2]))
t = time.perf_counter()
report = ingest(con, [sys.argv[1]])
print(f"ingest {time.perf_counter() - t:.1f} s: {report.summary()}")
for sql, seconds in sorted(con.times.items(), key=lambda kv: -kv[1])[:10]:
    print(f"{seconds:8.2f} s  {sql}")
"""


def profile_ingest(logs: Path, workdir: Path) -> None:
    """Time every SQL statement of one ingest of ``logs`` (which parts of the ingest cost what)."""
    db = workdir / "ingest-profile.duckdb"
    db.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-c", CHILD_INGEST_PROFILE, str(logs), str(db)], check=True, cwd=REPO)
    db.unlink(missing_ok=True)


def run_fit(engine: str, logs: Path, out: Path, cpus: int, memory_limit: str | None) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    memory = memory_limit or "default"
    if engine == "local":
        cmd = [sys.executable, "-c", CHILD_LOCAL, str(logs), str(out), memory]
    else:
        cmd = [sys.executable, "-c", CHILD_RAY, str(logs), str(out), str(cpus), memory]
    wall, peak, stdout = measure(cmd)
    result = json.loads(stdout.strip().splitlines()[-1])
    return {"engine": engine, "memory_limit": memory, "wall_s": round(wall, 1),
            "peak_rss_mb": round(peak / 2**20), **result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, action="append", help="sizes to run (default 1000000)")
    ap.add_argument("--with-10m", action="store_true", help="also run 10,000,000 calls (long)")
    ap.add_argument("--engine", choices=("local", "ray", "both"), default="local")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "profiler-bench-scale")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="Ray workers / generator processes")
    ap.add_argument("--keep", action="store_true", help="keep the fitted profiles")
    ap.add_argument("--profile-ingest", action="store_true",
                    help="instead of fitting, time each SQL statement of the ingest (first size only)")
    ap.add_argument("--memory-limit", action="append", metavar="SIZE",
                    help="DuckDB memory limit, e.g. 2GB (local: the store's connection; ray: each task). "
                         "Repeat to compare; 'default' = the store's default (PROFILER_DUCKDB_MEMORY_LIMIT or "
                         "a quarter of RAM). Default: default")
    args = ap.parse_args()
    sizes = args.calls or [1_000_000]
    if args.with_10m and 10_000_000 not in sizes:
        sizes.append(10_000_000)
    engines = ["local", "ray"] if args.engine == "both" else [args.engine]
    if args.profile_ingest:
        profile_ingest(ensure_logs(args.workdir, sizes[0], args.cpus), args.workdir)
        return
    rows = []
    for calls in sizes:
        logs = ensure_logs(args.workdir, calls, args.cpus)
        for engine in engines:
            for memory in args.memory_limit or ["default"]:
                out = args.workdir / f"profile-{calls}-{engine}"
                row = {"target_calls": calls, **run_fit(engine, logs, out, args.cpus,
                                                        None if memory == "default" else memory)}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if not args.keep:
                    shutil.rmtree(out, ignore_errors=True)
    print(f"\n{'calls':>12} {'engine':>6} {'mem cap':>8} {'wall s':>8} {'peak RSS MB':>12}  phases (s)")
    for r in rows:
        phases = ", ".join(f"{k} {v}" for k, v in r["phases"].items())
        print(f"{r['calls']:>12,} {r['engine']:>6} {r['memory_limit']:>8} {r['wall_s']:>8} "
              f"{r['peak_rss_mb']:>12}  {phases}")


if __name__ == "__main__":
    main()
