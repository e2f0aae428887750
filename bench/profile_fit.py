"""Where a fit's time goes: wall and CPU seconds per phase, and per SQL statement of the ingest.

    python bench/profile_fit.py LOGS [--out DIR] [--cprofile N]

Runs ``fitting.profile_fit.fit_profile`` on LOGS (files or folders) into a fresh profile folder, in
this process, and prints

* each phase — ingest, then the sections of :func:`fitting.profile_fit.fit_from_store` as they
  report progress — with its wall time and the CPU time of the process (user + system, every
  DuckDB thread included; on a shared machine the CPU time moves far less with the load than the
  wall time does);
* the wall time of every statement the ingester sends to the store, largest first (the
  statements go through :func:`store.duckdb_store.execute`);
* with ``--cprofile N``, the N functions with the most cumulative time (cProfile).

The profile version printed at the end identifies the fitted profile: same logs and code, same
version (it is a hash of ``profile.json``). To reuse the 1M-call log of bench/bench_fit.py:
``python bench/bench_fit.py --calls 1000000 --workdir W`` once, then
``python bench/profile_fit.py W/logs``.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import re
import resource
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import fitting.profile_fit as fitting
from store import derive, ingest, duckdb_store as store


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="profile folder (default: a temp dir, removed)")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N", help="print the top N functions")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="profile_fit_")) / "profile"
    shutil.rmtree(out, ignore_errors=True)

    statements: dict[str, float] = defaultdict(float)
    plain_execute = store.execute

    def timed_execute(con, sql, params=None):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        result = plain_execute(con, sql, params)
        statements[re.sub(r"\s+", " ", sql.strip())[:90]] += time.perf_counter() - t
        return result

    ingest.execute = derive.execute = timed_execute

    marks = [("ingest", time.perf_counter(), cpu_seconds())]

    def mark(label: str) -> None:
        marks.append((label, time.perf_counter(), cpu_seconds()))

    plain_ingest, plain_fit = fitting.ingest_mod.ingest, fitting.fit_from_store

    def timed_ingest(*a, **k):  # type: ignore[no-untyped-def]
        report = plain_ingest(*a, **k)
        mark("fit setup")
        return report

    def timed_fit(con, options, progress=lambda msg: None):  # type: ignore[no-untyped-def]
        def step(msg: str) -> None:
            mark(msg.split(" over ")[0])
            progress(msg)
        data = plain_fit(con, options, step)
        mark("write profile, close the store")
        return data

    fitting.ingest_mod.ingest, fitting.fit_from_store = timed_ingest, timed_fit
    prof = cProfile.Profile() if args.cprofile else None
    if prof:
        prof.enable()
    profile, report = fitting.fit_profile(args.logs, out)
    if prof:
        prof.disable()
    mark("end")

    print(report.summary())
    for (label, t0, c0), (_, t1, c1) in zip(marks, marks[1:]):
        print(f"{label:60s} wall {t1 - t0:7.2f} s  cpu {c1 - c0:7.2f} s")
    print(f"{'total':60s} wall {marks[-1][1] - marks[0][1]:7.2f} s  cpu {marks[-1][2] - marks[0][2]:7.2f} s"
          f"  (profile version {profile.version})")
    print("\ningest statements, wall s:")
    for sql, seconds in sorted(statements.items(), key=lambda kv: -kv[1])[:12]:
        print(f"{seconds:8.2f}  {sql}")
    if prof:
        print()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(args.cprofile)
    if args.out is None:
        shutil.rmtree(out.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
