"""Choose the autoscalers' settings on a validation draw, never on the measured seeds.

The pythia-like scenario with **another workload** (generation/split seed 1; the reported runs
use seed 0) and **another arrival draw** (seed 9; the reported runs use 0, 1, 2). Every setting
of each recommender runs under ``sglang-default`` and ``ours``; the setting with the lowest mean
avg JCT over the two becomes the default of :class:`simulator.autoscale.AutoscaleOptions`:

* reactive: ``queue_target`` ∈ {1, 4, 16, 64} × ``scale_down_window_s`` ∈ {300, 60};
* predictive: ``horizon_calls`` ∈ {1, 2, 3, 5, 10} × ``in_flight`` ∈ {yes, no} ×
  ``scale_down_window_s`` ∈ {300, 60}.

    python bench/autoscale_validation.py            # ≈ 15 min on 2 shared cores

Prints one JSON line per run, then the settings ranked per recommender.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from simulator.autoscale import AutoscaleOptions
from simulator.runner import prepare_scenario, simulate

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload-seed", type=int, default=1)
    ap.add_argument("--arrival-seed", type=int, default=9)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "autoscale_validation")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    prep, cfg = prepare_scenario("pythia-like", seed=args.workload_seed,
                                 profile_dir=args.out / f"profile-{args.workload_seed}")
    n = len(prep.workload.workflows)
    arr = np.sort(np.random.default_rng([args.arrival_seed, 43]).uniform(0.0, prep.scenario.burst_s, size=n))
    rows: list[dict] = []

    def run(name: str, **kw) -> None:
        t = time.perf_counter()
        _, row = simulate(prep, name, cfg, arr, mode="burst", autoscale=AutoscaleOptions(**kw))
        rec = {"name": name, **kw, "avg": round(row["avg_jct_s"], 1), "p95": round(row["p95_jct_s"], 1),
               "gpu_held_s": row["gpu_held_s"], "wall_s": round(time.perf_counter() - t, 1)}
        rows.append(rec)
        print(json.dumps(rec), flush=True)

    for base in ("sglang-default", "ours"):
        run(base)
    for base in ("sglang-default", "ours"):
        for w in (300.0, 60.0):
            for q in (1.0, 4.0, 16.0, 64.0):
                run(f"{base}+reactive", scale_down_window_s=w, queue_target=q)
            for h in (1, 2, 3, 5, 10):
                for f in (True, False):
                    run(f"{base}+predictive", scale_down_window_s=w, horizon_calls=h, in_flight=f)
    by: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if "+" in r["name"]:
            base, mode = r["name"].split("+")
            key = (mode, *((k, r[k]) for k in ("scale_down_window_s", "queue_target", "horizon_calls",
                                               "in_flight") if k in r))
            by[key][base] = r["avg"]
    print("\nsettings by mean avg JCT over sglang-default and ours (lower first):")
    for key, per in sorted(by.items(), key=lambda kv: (kv[0][0], np.mean(list(kv[1].values())))):
        print(f"  {key}: {per} mean {np.mean(list(per.values())):.1f}")
    (args.out / "grid.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
