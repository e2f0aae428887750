"""Online calibration on time-ordered splits: does the served band follow drift?

    python bench/bench_online_calibration.py [--workflows 400] [--seed 0] [--train 0.7] [LOG ...]

For each log (default: the ``messy`` generated workload, whose release at the midpoint changes
agents and lengths, the stationary ``coding-assistant``, and ``drift-team``, whose prompt
variant b's narrow agents grow 1.5–3×; or the flat log files given), the
first ``--train`` share of workflows by start time trains a profile (``profiler fit``), and the
rest is replayed in arrival order by :func:`scoring.online_eval.online_scores` (what
``profiler eval --online`` prints): each band served before its call, each finished call fed
back. Prints one line per log: coverage and mean width of the online (calibrated) band, the
static (fitted) band, the per-agent empirical band and the global band, the width ratio online /
empirical, how many bands the global arm served (:mod:`predictors.online_calibration`) and how
often a key switched arms, and which workflow types' drift alarm fired; then the same per type.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from store import ingest as ingest_mod  # noqa: E402
from fitting.profile_fit import fit_profile  # noqa: E402
from scoring.online_eval import online_scores  # noqa: E402
from store.duckdb_store import connect  # noqa: E402
from store.workloads import generate, write_jsonl  # noqa: E402

GENERATED = ("messy", "coding-assistant", "drift-team")


def time_split(records: list[dict], train: float) -> tuple[list[dict], list[dict]]:
    """The first ``train`` share of workflows by start time, and the rest."""
    starts: dict[tuple, float] = {}
    for r in records:
        key = (r["workflow_type_id"], r["workflow_id"])
        starts[key] = min(starts.get(key, r["t_arrival"]), r["t_arrival"])
    order = sorted(starts, key=lambda k: (starts[k], k))
    first = set(order[: int(round(len(order) * train))])
    return ([r for r in records if (r["workflow_type_id"], r["workflow_id"]) in first],
            [r for r in records if (r["workflow_type_id"], r["workflow_id"]) not in first])


def run(name: str, records: list[dict], train: float, work: Path) -> dict:
    tr, te = time_split(records, train)
    write_jsonl(iter(tr), work / f"{name}-train.jsonl")
    write_jsonl(iter(te), work / f"{name}-test.jsonl")
    profile, _ = fit_profile([work / f"{name}-train.jsonl"], work / f"p-{name}")
    con = connect(None)
    try:
        ingest_mod.ingest(con, [work / f"{name}-test.jsonl"])
        return online_scores(profile, con)
    finally:
        con.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="*", type=Path, help="flat JSONL logs (default: the generated workloads)")
    ap.add_argument("--workflows", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train", type=float, default=0.7)
    ap.add_argument("--json", action="store_true", help="print each full result")
    args = ap.parse_args()
    sources = ([(p.stem, [json.loads(line) for line in p.open() if line.strip()]) for p in args.logs]
               or [(w, list(generate(w, args.workflows, seed=args.seed))) for w in GENERATED])
    with tempfile.TemporaryDirectory() as d:
        for name, records in sources:
            r = run(name, records, args.train, Path(d))
            if args.json:
                print(json.dumps({name: r}, indent=1, default=str))
            emp = r["baselines"]["per_agent_empirical"]
            on, st = r["online"], r["static"]
            fired = sorted(wt for wt, a in r["drift_alarm"].items() if a["fired"])
            glob = r["baselines"]["global"]
            arms = r.get("band_arms") or {}
            served = sum(a["served"] for a in arms.values())
            from_global = sum(a["served_global"] for a in arms.values())
            print(f"{name}: {r['scored']} calls, nominal {r['nominal']:.2f} | online cov {on['coverage']:.4f} "
                  f"width {on['mean_width']:.0f} (worst window {on['worst_window_coverage']}) | static cov "
                  f"{st['coverage']:.4f} width {st['mean_width']:.0f} | per-agent empirical cov "
                  f"{emp['coverage']:.4f} width {emp['mean_width']:.0f} | global cov {glob['coverage']:.4f} "
                  f"width {glob['mean_width']:.0f} | online/empirical width "
                  f"{r['width_vs_per_agent_empirical']:.3f} | global arm served {from_global}/{served}, "
                  f"switches {sum(a['switches'] for a in arms.values())} | alarm fired: {fired or 'none'}",
                  flush=True)
            for wt, t in sorted(r["by_type"].items()):
                a = arms.get(wt) or {}
                print(f"    {wt}: {t['calls']} calls | online cov {t['online']['coverage']:.4f} width "
                      f"{t['online']['mean_width']:.0f} | static cov {t['static']['coverage']:.4f} width "
                      f"{t['static']['mean_width']:.0f} | global arm served {a.get('served_global', 0)}/"
                      f"{a.get('served', 0)}, switches {a.get('switches', 0)}, at the end: "
                      f"{', '.join(a.get('global_at_end') or []) or 'none'}", flush=True)


if __name__ == "__main__":
    main()
