"""Does the coverage drift alarm fire on a drifting workload and stay quiet on a stationary one?

    python bench/bench_drift_alarm.py [--workflows 400] [--seed 0]

For each workload (``messy``: a release at the midpoint of the log changes agents and lengths;
``coding-assistant``: stationary), the first half of the workflows by start time trains a profile
(``profiler fit``); the second half is replayed through :class:`predictors.Predictor` in arrival
order (``annotate`` at each call's arrival, ``observe`` at its finish, as the gateway does), and
the fitted bands' outcomes feed :class:`predictors.coverage_monitor.CoverageMonitor` (online
calibration off: bench/bench_online_calibration.py scores the calibrated band). Prints, per
workload and workflow type: replayed calls, served-band coverage, the alarm state at the end and
the number of outcomes before it first fired.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from predictors.predictor import Predictor  # noqa: E402
from fitting.profile_fit import fit_profile  # noqa: E402
from store.workloads import generate, write_jsonl  # noqa: E402


def replay(workload: str, n: int, seed: int, work: Path) -> dict:
    records = list(generate(workload, n, seed=seed))
    starts = {}
    for r in records:
        starts[r["workflow_id"]] = min(starts.get(r["workflow_id"], r["t_arrival"]), r["t_arrival"])
    order = sorted(starts, key=starts.get)
    train_ids = set(order[: len(order) // 2])
    train = [r for r in records if r["workflow_id"] in train_ids]
    test = [r for r in records if r["workflow_id"] not in train_ids]
    write_jsonl(iter(train), work / f"{workload}.jsonl")
    profile, _ = fit_profile([work / f"{workload}.jsonl"], work / f"p-{workload}")
    p = Predictor(profile, online_calibration=False)   # the fitted bands, as the alarm judges them
    events = sorted([(r["t_arrival"], 0, i) for i, r in enumerate(test)]
                    + [(r["t_finish"], 1, i) for i, r in enumerate(test)])
    first_alarm, seen, hits, calls = {}, {}, {}, {}
    for _t, kind, i in events:
        r = test[i]
        meta = {k: r[k] for k in ("workflow_type_id", "workflow_id", "agent_id")}
        if kind == 0:
            p.annotate(meta, request_id=r["request_id"], input_tokens=r["input_tokens"])
            continue
        hit = p.observe({"app_metadata": meta, "request_id": r["request_id"],
                         "output_tokens": r["output_tokens"]})
        if hit is None:
            continue
        wt = r["workflow_type_id"]
        seen[wt] = seen.get(wt, 0) + 1
        hits[wt] = hits.get(wt, 0) + hit
        calls[wt] = calls.get(wt, 0) + 1
        if p.coverage_monitor.status()[wt]["alarm"] and wt not in first_alarm:
            first_alarm[wt] = seen[wt]
    status = p.coverage_monitor.status()
    return {wt: {"calls": calls[wt], "coverage": round(hits[wt] / calls[wt], 4),
                 "alarm_at_end": status[wt]["alarm"], "first_alarm_after": first_alarm.get(wt)}
            for wt in calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workflows", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for workload in ("messy", "coding-assistant"):
            print(workload, replay(workload, args.workflows, args.seed, Path(d)))


if __name__ == "__main__":
    main()
