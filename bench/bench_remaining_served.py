"""The remaining-tokens order the server serves, with and without the online selection.

    python bench/bench_remaining_served.py [--sets agentless,whowhen,swe_agent,mini_swe,messy]
                                           [--split-seeds 0,1,2] [--messy-seeds 0,1,2] [--json]

For every real set (``bench/bench_real.py``'s sources: ``../shared/datasets`` when it exists,
else ``datasets/real``) and the messy generator (``--messy-seeds``, 200 workflows each): a
time-ordered split (``profiler split --by-time``, 70/30: fit on the workflows that started
first) and random splits by workflow (``--split-seeds``; one per messy seed, split seed 0). Each
split is fit once (``profiler fit``) and its held-out calls replayed through the serving
``Predictor`` twice (:func:`scoring.online_eval.replay_served`: arrival order, a session ended at
its last call's finish): *static*, the fit's served candidate, and *online*, with the
remaining-work selection (:mod:`predictors.online_selection`) switching each type among the fitted
table, the position median and ``mrl``. Scored as ``profiler eval --online`` scores them
(:func:`scoring.online_eval.remaining_online`): the concurrent-session C-index of both beside the
position median and ``mrl`` on the same calls, ``online − baseline`` and ``online − static`` ±
the delete-one-session jackknife se, and per type the candidate the fit served, the one served at
the end and how many switches. The last lines: per split kind, the worst ``online − static``
in se and the sets where the online order is behind a baseline beyond one se.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_real import REAL_SETS, real_source  # noqa: E402
from fitting.profile_fit import fit_profile  # noqa: E402
from scoring.online_eval import remaining_online, replay_served, stream_calls  # noqa: E402
from store import ingest as ingest_mod  # noqa: E402
from store.duckdb_store import connect  # noqa: E402
from store.split import split_logs  # noqa: E402
from store.workloads import generate, write_jsonl  # noqa: E402


def score_split(log: Path, work: Path, order: str, seed: int) -> dict[str, Any] | None:
    """Fit on the train side of one split of ``log``, replay its test side static and online."""
    split_logs([log], work / "split", train=0.7, seed=seed, order=order)
    profile, _ = fit_profile([work / "split" / "train"], work / "profile")
    con = connect(None)
    try:
        ingest_mod.ingest(con, [work / "split" / "test"])
        calls = stream_calls(con)
    finally:
        con.close()
    static = replay_served(profile, calls, online=False)[4]["served"]
    on = replay_served(profile, calls, online=False, remaining_selection=True)[4]
    return remaining_online(profile, calls, on["served"], static, on["selection"])


def fmt(d: dict[str, Any] | None) -> str:
    return "n/a" if not d else f"{d['c_index_diff']:+.3f} ± {d['c_index_diff_se']:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default=",".join([*REAL_SETS, "messy"]),
                    help="comma-separated: real sets (bench_real.py's names) and/or messy")
    ap.add_argument("--split-seeds", default="0,1,2", help="seeds of the random splits of each real set")
    ap.add_argument("--messy-seeds", default="0,1,2", help="messy generator seeds (200 workflows each)")
    ap.add_argument("--data", type=Path, default=None, help="folder of the real sets (default: ../shared/datasets)")
    ap.add_argument("--json", action="store_true", help="print every result as one JSON object at the end")
    args = ap.parse_args()
    t0 = time.time()
    print(f"$ python {' '.join(sys.argv)}  (load average {os.getloadavg()[0]:.2f})", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-rw-served-") as tmp:
        work = Path(tmp)
        jobs: list[tuple[str, Path, str, int]] = []
        for name in args.sets.split(","):
            if name == "messy":
                for s in (int(x) for x in args.messy_seeds.split(",") if x):
                    log = work / f"messy{s}.jsonl"
                    write_jsonl(generate("messy", 200, seed=s), log)
                    jobs += [(f"messy[{s}]", log, "time", 0), (f"messy[{s}]", log, "hash", 0)]
            else:
                log = real_source(name, args.data)
                jobs.append((name, log, "time", 0))
                jobs += [(name, log, "hash", int(s)) for s in args.split_seeds.split(",") if s]
        for k, (label, log, order, seed) in enumerate(jobs):
            rw = score_split(log, work / f"j{k}", order, seed)
            if rw is None:
                continue
            row = {"set": label, "split": "time" if order == "time" else f"random seed {seed}", **rw}
            rows.append(row)
            sel = "; ".join(f"{wt}: {v['start']} → {v['served']} ({v['switches']} switches, served "
                            + ", ".join(f"{c} {n}" for c, n in v["served_sessions"].items() if n) + " sessions)"
                            for wt, v in sorted(rw["selection"].items()))
            c = {k2: rw[k2]["c_index"] for k2 in ("static", "online")}
            c.update({b: rw["baselines"][b]["c_index"] for b in ("position_median", "mrl")})
            print(f"{label:11s} {row['split']:14s} static {c['static']:.3f} online {c['online']:.3f} "
                  f"pm {c['position_median']:.3f} mrl {c['mrl']:.3f} | online−static {fmt(rw['online_minus_static'])}"
                  f" online−pm {fmt(rw['vs_position_median']['online'])} online−mrl {fmt(rw['vs_mrl']['online'])}"
                  f" static−pm {fmt(rw['vs_position_median']['static'])} static−mrl {fmt(rw['vs_mrl']['static'])}"
                  f" | {sel}", flush=True)
    print(f"\n{len(rows)} splits, {time.time() - t0:.0f} s wall, load average {os.getloadavg()[0]:.2f}")
    for kind in ("time", "random"):
        part = [r for r in rows if r["split"].startswith(kind)]
        worse = [f"{r['set']} {r['split']}" for r in part
                 if (d := r["online_minus_static"]) and d["c_index_diff"] < -d["c_index_diff_se"]]
        behind = {w: [f"{r['set']} {r['split']}" for r in part
                      if (d := r[key]["online"]) and d["c_index_diff"] < -d["c_index_diff_se"]]
                  for w, key in (("position median", "vs_position_median"), ("mrl", "vs_mrl"))}
        switched = sum(any(v["switches"] for v in r["selection"].values()) for r in part)
        print(f"{kind}: {len(part)} splits, selection switched on {switched}; online worse than static beyond "
              f"one se: {worse or 'none'}; online behind " + "; ".join(f"{w}: {v or 'none'}" for w, v in behind.items()))
    if args.json:
        print(json.dumps(rows, default=float))


if __name__ == "__main__":
    main()
