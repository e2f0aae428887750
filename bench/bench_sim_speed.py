"""Speed of the discrete-event simulator: wall and CPU time per simulated call, per policy.

The simulator has to replay a *large* trace (issue 16: 100k calls per policy per load level in
under a minute) and its cost per call must not grow with the trace: a cost that is linear in the
number of calls shows as the same **CPU ms per call** at 10k and at 100k calls. This bench
generates a ``coding-assistant`` workload of about ``--calls`` calls (≈ 13 calls per workflow;
the profile that drives ``ours`` is fit once on 400 other workflows and kept under ``--out``),
replays it at one load level under each policy and prints, per policy and size:

    calls   wall s   CPU ms/call   avg JCT s   outcome digest

The **avg JCT** and the **digest** (SHA-1 of every call's admission, first-token and finish
times, preemption count and recomputed tokens, rounded to 1 µs / exact integers) show that a
speed change did not change what was simulated: for the same seed they must be identical before
and after. Arrivals follow ``profiler simulate``'s rule (``simulator.runner.compare``): Poisson at
``load × λ_sat`` (``--arrivals closed``: a closed population of ``load × C_kv`` sessions).

Examples::

    python bench/bench_sim_speed.py                                  # 100k calls, 3 policies, peak
    python bench/bench_sim_speed.py --calls 10000,100000             # linearity: ms/call at both
    python bench/bench_sim_speed.py --calls 10000 --policies ours --profile-out prof.txt
    python bench/bench_sim_speed.py --load medium --arrivals closed --json out.json
    python bench/bench_sim_speed.py --calls 3000 --policies all --json before.json   # old code
    python bench/bench_sim_speed.py --calls 3000 --policies all --check before.json  # new code

``--check FILE`` compares each row's avg JCT and digest with the row of the same policy, size,
load and arrivals in FILE (an earlier ``--json``) and exits 1 on any difference: the test that a
speed change left every call's outcome as it was.

``--profile-out FILE`` runs each policy under cProfile and writes the top functions (cumulative
and own time) there; timings under cProfile are ~2× slower, so the table is then not a figure.
"""
from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import math
import os
import pstats
import struct
import time
from pathlib import Path

from simulator.config import ClusterConfig, hardware_config
from simulator.engine import SimResult
from simulator.runner import (ALL_POLICIES, Prepared, arrival_times, critical_path_jct, parse_load,
                              parse_policies, prepare, saturating_concurrency, simulate)
from simulator.sources import generated

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_POLICIES = "sglang-default,continuum-ttl,ours"


def outcome_digest(res: SimResult) -> str:
    """SHA-1 over every call's (admit, first token, finish) times at 1 µs and its preemptions and
    recomputed tokens: equal digests = the same simulated outcome, call by call."""
    h = hashlib.sha1()
    for r in res.requests:
        times = [0 if math.isnan(x) else int(round(x * 1e6)) for x in (r.t_admit, r.t_first, r.t_finish)]
        h.update(struct.pack("<qqqqq", *times, r.preempts, r.recomputed))
    return h.hexdigest()[:12]


def workflows_for(calls: int, seed: int) -> int:
    """Workflows whose generated replay has about ``calls`` calls (a 300-workflow pilot gives the
    mean calls per workflow)."""
    pilot = generated("coding-assistant", n_train=0, n_test=300, seed=seed).test
    per_wf = len(pilot) / len({r["workflow_id"] for r in pilot})
    return max(10, int(round(calls / per_wf)))


def run_policy(prep: Prepared, name: str, cfg: ClusterConfig, level: str, arrivals: str,
               seed: int, profiler: cProfile.Profile | None) -> dict:
    """One policy at one load: ``profiler simulate``'s arrivals and window, timed."""
    wl = prep.workload
    c_kv, _ = saturating_concurrency(prep.source.test, cfg)
    t_sat = float(critical_path_jct(wl, cfg, cfg.kv_capacity_tokens).mean())
    share = parse_load(level)
    sessions = max(1, int(round(share * c_kv)))
    rate = share * c_kv / t_sat
    arr = arrival_times(wl, rate, seed, arrivals, None, sessions, t_sat)
    closed = sessions if arrivals == "closed" else None
    w0, c0 = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    res, row = simulate(prep, name, cfg, arr, None, None, closed, (0.2, 0.2), arrivals)
    if profiler is not None:
        profiler.disable()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    n = wl.n_calls
    return {"policy": name, "calls": n, "workflows": len(wl.workflows), "sessions": sessions,
            "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "cpu_ms_per_call": round(1e3 * cpu / n, 4),
            "events": res.events, "avg_jct_s": row["avg_jct_s"], "digest": outcome_digest(res)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", default="100000",
                    help="comma list of trace sizes in calls (e.g. 10000,100000: CPU ms/call at "
                         "both shows whether the cost per call grows with the trace)")
    ap.add_argument("--policies", default=DEFAULT_POLICIES,
                    help=f"comma list of policies (default {DEFAULT_POLICIES}; any name "
                         "`profiler simulate --policies` takes; `all`: every policy and variant)")
    ap.add_argument("--load", default="peak",
                    help="one load level: low, medium, peak (0.5/1.0/1.5 × λ_sat) or a share")
    ap.add_argument("--arrivals", default="poisson", choices=("poisson", "closed"),
                    help="poisson (profiler simulate's default) or a closed population")
    ap.add_argument("--replicas", type=int, default=4, help="engine replicas (default cluster: 4)")
    ap.add_argument("--seed", type=int, default=0, help="seed of generation and arrivals")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench_sim_speed",
                    help="folder for the fitted profile (reused across runs)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    ap.add_argument("--check", type=Path, default=None,
                    help="compare avg JCT and digests with an earlier --json (exit 1 if any differ)")
    ap.add_argument("--profile-out", type=Path, default=None,
                    help="run under cProfile and write the top functions here (slower!)")
    args = ap.parse_args()

    policies = list(ALL_POLICIES) if args.policies == "all" else parse_policies(args.policies)
    parse_load(args.load)
    sizes = [int(x) for x in args.calls.split(",") if x.strip()]
    cfg = hardware_config(replicas=args.replicas)
    args.out.mkdir(parents=True, exist_ok=True)
    prof = cProfile.Profile() if args.profile_out else None
    rows = []
    print(f"{'policy':16s} {'calls':>8s} {'wall s':>8s} {'CPU ms/call':>12s} {'avg JCT s':>11s} "
          f"{'digest':>13s}", flush=True)
    for size in sizes:
        n_wf = workflows_for(size, args.seed)
        prep = prepare("coding-assistant", n_wf, seed=args.seed, cfg=cfg,
                       profile_dir=args.out / f"profile-coding-assistant-s{args.seed}")
        for name in policies:
            row = run_policy(prep, name, cfg, args.load, args.arrivals, args.seed, prof)
            row.update(load=args.load, arrivals=args.arrivals)
            rows.append(row)
            print(f"{name:16s} {row['calls']:8d} {row['wall_s']:8.1f} {row['cpu_ms_per_call']:12.3f} "
                  f"{row['avg_jct_s']:11.3f} {row['digest']:>13s}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=float))
    if prof is not None:
        buf = io.StringIO()
        st = pstats.Stats(prof, stream=buf)
        st.sort_stats("cumulative").print_stats(45)
        st.sort_stats("tottime").print_stats(45)
        args.profile_out.write_text(buf.getvalue())
        print(f"wrote {args.profile_out}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.check:
        raise SystemExit(check(rows, json.loads(args.check.read_text())))


def check(rows: list[dict], before: list[dict]) -> int:
    """Rows whose avg JCT or digest differ from ``before`` (matched on policy, calls, load and
    arrivals); prints each and returns 1 if any differ (0 if all match, 2 if none matched)."""
    key = lambda r: (r["policy"], r["calls"], r["load"], r["arrivals"])   # noqa: E731
    old = {key(r): r for r in before}
    matched = differ = 0
    for r in rows:
        o = old.get(key(r))
        if o is None:
            continue
        matched += 1
        if o["digest"] != r["digest"] or o["avg_jct_s"] != r["avg_jct_s"]:
            differ += 1
            print(f"DIFFERS {r['policy']} {r['calls']} calls: avg JCT {o['avg_jct_s']} -> "
                  f"{r['avg_jct_s']}, digest {o['digest']} -> {r['digest']}")
    print(f"check: {matched} rows compared, {differ} differ")
    return 2 if not matched else (1 if differ else 0)


if __name__ == "__main__":
    main()
