"""Benchmark: wall time and peak memory of `profiler fit` on N generated calls.

    python bench/bench_fit.py --calls 1000000

Generates a coding-assistant workload of at least N calls (not timed), then runs
`profiler fit` in a fresh process on it and prints its wall time, its CPU time (user + system,
all threads: on a shared machine it moves far less with the load than the wall time does) and
peak RSS (the child's ru_maxrss).
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--workload", default="coding-assistant")
    ap.add_argument("--workdir", type=Path, default=None, help="keep data here (default: a temp dir)")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_fit_"))
    logs = work / "logs" / f"{args.workload}-{args.calls}.jsonl"
    if not logs.exists():
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "profiler", "generate", "--workload", args.workload,
                        "--calls", str(args.calls), "--out", str(logs)], check=True)
        print(f"generated {args.calls:,} calls in {time.perf_counter() - t:.1f} s "
              f"({logs.stat().st_size / 1e6:.0f} MB)")
    out = work / "profile"
    shutil.rmtree(out, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_before = before.ru_utime + before.ru_stime  # the generator's, when it ran
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "profiler", "fit", str(logs.parent), "--out", str(out), "-q"],
                   check=True)
    wall = time.perf_counter() - t
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_mb, cpu = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime - cpu_before
    print(f"profiler fit on {args.calls:,} calls: wall {wall:.1f} s, cpu {cpu:.1f} s, peak RSS {peak_mb:.0f} MB "
          f"(target for 1M: < 30 s; load average {os.getloadavg()[0]:.1f})")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
