"""Mean and tail of ours against the baselines, and the choice of the priority's tail bound.

For each seed it prepares one workload (a ``--scenario`` or a ``--workload`` at ``--load``), runs
the baselines (``sglang-default``, ``continuum-ttl``, the clairvoyant ``oracle-srpt``) and ours
under each candidate (``--candidates``: ``label=field:value;field:value`` of ``PriorityPolicy``
parameters, ``capacity.<field>`` of ``CapacityPolicy``, or ``kv_preemption:1`` / ``:0``;
``label=default`` for the defaults), and prints per seed and policy the avg / P95 /
P99 JCT, the share of the oracle's gain it takes,

    G = (avg JCT continuum-ttl − avg JCT ours) / (avg JCT continuum-ttl − avg JCT oracle-srpt),

the headroom (``continuum-ttl − oracle-srpt``, s), P95 ÷ the best baseline's P95 (the best of
``sglang-default`` and ``continuum-ttl``), the routing-caused recompute share (``routing rc``) and
the sessions the router moved, and the mean of each over the seeds. Choose a
parameter on validation seeds (≥ 100), report it on others. ``--json`` writes every row.

    python bench/bench_tail.py --scenario agent-platform --seeds 100,101 \\
        --candidates 'd=default' 'c8=remaining_cap:8' 'slot=kv_preemption:0'
    python bench/bench_tail.py --workload datasets/real --load peak --seeds 100 \\
        --candidates 'd=default' 'a1e-4=aging_per_s:1e-4' 'k4=slowdown_bound:4'
    python bench/bench_tail.py --scenario agent-platform --seeds 100 \\
        --candidates 'd=default' 'm3=capacity.move_gain_ratio:3'
    python bench/bench_tail.py --scenario agent-platform --seeds 100 \\
        --candidates 'd=default' 'mono=monotone:1' 'sr5=rank_skill_min:0.5'
    python bench/bench_tail.py --workload MIX --load peak --seeds 100,101 \\
        --candidates 'd=default' 'g5=oldest_share:0.05' 'g10=oldest_share:0.1'
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from policies import CapacityPolicy, PriorityPolicy
from simulator.config import ClusterConfig
from simulator.ours import OursOptions
from simulator.runner import compare, parse_load, prepare, prepare_scenario

BASELINES = ("sglang-default", "continuum-ttl", "oracle-srpt")
#: Baselines ours' tail is held against (the oracle is a reference, not a deployable baseline).
TAIL_BASELINES = ("sglang-default", "continuum-ttl")


def parse_candidate(text: str) -> tuple[str, OursOptions]:
    """``label=field:value;field:value`` (or ``label=default``) → (label, OursOptions): each
    field a ``PriorityPolicy`` parameter, ``capacity.<field>`` a ``CapacityPolicy`` one (the
    router's move rule, e.g. ``capacity.move_gain_ratio:3``), or ``kv_preemption`` (1/0) of
    ``OursOptions``."""
    label, _, spec = text.partition("=")
    kwargs: dict = {}
    cap: dict = {}
    kv = OursOptions().kv_preemption
    if spec and spec != "default":
        for item in spec.split(";"):
            key, _, value = item.partition(":")
            key = key.strip()
            if key == "kv_preemption":
                kv = bool(float(value))
            elif key in ("overdue_by_start", "monotone"):
                kwargs[key] = bool(float(value))
            elif key.startswith("capacity."):
                cap[key.removeprefix("capacity.")] = float(value)
            else:
                kwargs[key] = None if value.strip() == "none" else float(value)
    return label.strip(), OursOptions(priority_policy=PriorityPolicy(**kwargs), kv_preemption=kv,
                                      capacity_policy=CapacityPolicy(**cap))


def figures(rows: dict[str, dict], ours: str) -> dict:
    """G, headroom and the P95 / P99 ratio of ``ours`` against the best baseline."""
    cont, orc, row = rows["continuum-ttl"], rows["oracle-srpt"], rows[ours]
    head = cont["avg_jct_s"] - orc["avg_jct_s"]
    best95 = min(rows[b]["p95_jct_s"] for b in TAIL_BASELINES)
    best99 = min(rows[b]["p99_jct_s"] for b in TAIL_BASELINES)
    return {"avg": row["avg_jct_s"], "p95": row["p95_jct_s"], "p99": row["p99_jct_s"],
            "G": (cont["avg_jct_s"] - row["avg_jct_s"]) / head if head > 1e-9 else float("nan"),
            "headroom_s": head, "p95_vs_best": row["p95_jct_s"] / best95,
            "p99_vs_best": row["p99_jct_s"] / best99,
            "routing_rc": row.get("routing_recompute_share", float("nan")),
            "moved": row.get("capacity_moved_sessions", float("nan"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", help="a profiler simulate --scenario name")
    ap.add_argument("--workload", help="a log folder or generated workload (with --load)")
    ap.add_argument("--load", default="peak")
    ap.add_argument("--seeds", default="100")
    ap.add_argument("--candidates", nargs="+", default=["default=default"])
    ap.add_argument("--profile-dir", default=None, help="cache of fitted train profiles")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if bool(args.scenario) == bool(args.workload):
        ap.error("give one of --scenario or --workload")
    parse_load(args.load)
    cands = [parse_candidate(c) for c in args.candidates]
    profile_dir = args.profile_dir or tempfile.mkdtemp(prefix="bench-tail-")
    out: dict = {"args": vars(args) | {"json": str(args.json)}, "seeds": {}}
    per: dict[str, list[dict]] = {label: [] for label, _ in cands}
    for seed in [int(s) for s in args.seeds.split(",")]:
        t0 = time.perf_counter()
        if args.scenario:
            prep, cfg = prepare_scenario(args.scenario, seed=seed, profile_dir=profile_dir)
            mode, levels = prep.scenario.arrivals, [prep.scenario.load]
        else:
            prep = prepare(args.workload, seed=seed, profile_dir=profile_dir,
                           max_load=parse_load(args.load))
            cfg, mode, levels = ClusterConfig(), "poisson", [args.load]
        base = compare(prep, BASELINES, levels, cfg, arrivals_mode=mode)
        level = next(iter(base["loads"]))
        rows = dict(base["loads"][level]["policies"])
        for label, opts in cands:
            res = compare(prep, ["ours"], levels, cfg, arrivals_mode=mode, ours=opts)
            rows[label] = res["loads"][level]["policies"]["ours"]
        out["seeds"][seed] = rows
        print(f"seed {seed} ({time.perf_counter() - t0:.0f} s): " + ", ".join(
            f"{b} avg {rows[b]['avg_jct_s']:.0f} P95 {rows[b]['p95_jct_s']:.0f} "
            f"P99 {rows[b]['p99_jct_s']:.0f}" for b in BASELINES), flush=True)
        for label, _ in cands:
            f = figures(rows, label)
            per[label].append(f)
            print(f"  {label:14s} avg {f['avg']:7.1f}  P95 {f['p95']:7.1f} ({f['p95_vs_best']:.2f}x)  "
                  f"P99 {f['p99']:7.1f} ({f['p99_vs_best']:.2f}x)  G {f['G']:+.2f}  "
                  f"headroom {f['headroom_s']:.0f} s  routing rc {100 * f['routing_rc']:.1f} %  "
                  f"moved {f['moved']}", flush=True)
    print("mean over seeds:")
    for label, fs in per.items():
        m = {k: float(np.mean([f[k] for f in fs])) for k in fs[0]}
        print(f"  {label:14s} avg {m['avg']:7.1f}  P95 ratio {m['p95_vs_best']:.3f} (max "
              f"{max(f['p95_vs_best'] for f in fs):.3f})  P99 ratio {m['p99_vs_best']:.3f}  "
              f"G {m['G']:+.2f}  headroom {m['headroom_s']:.0f} s  routing rc max "
              f"{100 * max(f['routing_rc'] for f in fs):.1f} %")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
