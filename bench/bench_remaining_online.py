"""Choose the online remaining-work selection's parameters on training data only.

    python bench/bench_remaining_online.py [--seeds 3,4,5,6,7,8,9] [--inner-seeds 0,1,...,9]
                                           [--half-lives 10,20,40] [--margins 2,3]
                                           [--min-sessions 8] [--workflows 200]

:mod:`predictors.online_selection` switches a workflow type's served remaining work among the
fit's candidates (the fitted table, the position median, ``mrl``) once the paired concordance
evidence of ended sessions for one over the served one passes ``margin`` (z), over an exponential
window of ``half_life`` sessions, after ``min_sessions`` effective sessions. Its
parameters must not be tuned on the figures ``bench/bench_real.py --time`` reports (messy seeds
0, 1, 2 and the real sets' time splits), so they are chosen here on

* **outer** splits of messy seeds the bench does not report (``--seeds``): per seed, the
  generator's 200 workflows split by start time (``profiler split --by-time``, 70/30), fit on
  the first 70 %, replay the rest;
* **inner** splits of every seed (``--inner-seeds``, the reported ones included): the *training*
  side of that time split split by time again (70/30 of it), fit on its first part, replay its
  last: forward in time inside the training workflows, where the test side is never read.

Every split is fit once (``profiler fit``) and replayed through the serving ``Predictor``
(:func:`scoring.online_eval.replay_served`: arrival order, a session ended at its last call's
finish) once static and once per parameter pair; the C-index is ``profiler eval --online``'s
(:func:`scoring.online_eval.remaining_online`). Per parameter triple it prints the mean and worst
``online − static`` over the splits, the mean and worst ``online − max(static, position median,
mrl)`` and on how many splits the selection switched.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fitting.profile_fit import fit_profile  # noqa: E402
from predictors.online_selection import RemainingSelector  # noqa: E402
from scoring.online_eval import remaining_online, replay_served, stream_calls  # noqa: E402
from store import ingest as ingest_mod  # noqa: E402
from store.duckdb_store import connect  # noqa: E402
from store.split import split_logs  # noqa: E402
from store.workloads import generate, write_jsonl  # noqa: E402


def split(work: Path, seed: int, inner: bool, workflows: int) -> tuple[Path, Path]:
    """(train, test) folders of one split (module doc)."""
    log = work / f"messy{seed}.jsonl"
    if not log.exists():
        write_jsonl(generate("messy", workflows, seed=seed), log)
    outer = work / f"s{seed}"
    split_logs([log], outer, train=0.7, seed=0, order="time")
    if not inner:
        return outer / "train", outer / "test"
    split_logs([outer / "train"], outer / "inner", train=0.7, seed=0, order="time")
    return outer / "inner" / "train", outer / "inner" / "test"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="3,4,5,6,7,8,9", help="messy seeds scored on their outer time split")
    ap.add_argument("--inner-seeds", default="0,1,2,3,4,5,6,7,8,9", help="messy seeds scored inside their training side")
    ap.add_argument("--half-lives", default="10,20,40")
    ap.add_argument("--margins", default="2,3")
    ap.add_argument("--min-sessions", default="8", help="effective sessions of evidence before any switch")
    ap.add_argument("--workflows", type=int, default=200)
    args = ap.parse_args()
    grid = [(float(h), float(m), float(n)) for h in args.half_lives.split(",") for m in args.margins.split(",")
            for n in args.min_sessions.split(",")]
    splits = [(int(s), False) for s in args.seeds.split(",") if s] + [(int(s), True) for s in args.inner_seeds.split(",") if s]
    rows: dict[tuple[float, float, float], list[tuple[float, float, float, int]]] = {p: [] for p in grid}
    with tempfile.TemporaryDirectory(prefix="bench-rw-online-") as tmp:
        work = Path(tmp)
        for seed, inner in splits:
            train, test = split(work, seed, inner, args.workflows)
            profile, _ = fit_profile([train], work / f"profile{seed}{'i' if inner else ''}")
            con = connect(None)
            ingest_mod.ingest(con, [test])
            calls = stream_calls(con)
            static = replay_served(profile, calls, online=False)[4]["served"]
            line = []
            for h, m, n in grid:
                on = replay_served(profile, calls, online=False,
                                   remaining_selection=RemainingSelector(half_life=h, margin=m, min_sessions=n))[4]
                rw = remaining_online(profile, calls, on["served"], static, on["selection"])
                c_on, c_st = rw["online"]["c_index"], rw["static"]["c_index"]
                c_pm = max(rw["baselines"][b]["c_index"] for b in ("position_median", "mrl"))
                switches = sum(v["switches"] for v in on["selection"].values())
                rows[h, m, n].append((c_on, c_st, c_pm, switches))
                line.append(f"h{h:g}/m{m:g}/n{n:g}: {c_on:.3f}")
            con.close()
            print(f"seed {seed} {'inner' if inner else 'outer'}: static {c_st:.3f}, best baseline {c_pm:.3f}; "
                  + ", ".join(line), flush=True)
    print(f"\n{len(splits)} splits; online − static, online − max(static, position median, mrl), splits switched")
    for (h, m, n), r in rows.items():
        a = np.array(r)
        d, best = a[:, 0] - a[:, 1], a[:, 0] - np.maximum(a[:, 1], a[:, 2])
        print(f"half_life {h:g}, margin {m:g}, min_sessions {n:g}: online − static mean {d.mean():+.4f} worst {d.min():+.4f}; "
              f"vs max mean {best.mean():+.4f} worst {best.min():+.4f}; switched on {int((a[:, 3] > 0).sum())}")


if __name__ == "__main__":
    main()
