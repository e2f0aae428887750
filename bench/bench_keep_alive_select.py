"""The served keep-alive TTL with and without the online choice among candidates, side by side.

    python bench/bench_keep_alive_select.py [--sets agentless,swe_agent,mini_swe,messy,drift-team]
                                            [--side test|train] [--split time|random] [--cold]
                                            [--grid 1000:1:30,1000:2:30]

Per set (real sets as ``bench/bench_real.py`` finds them; messy: seeds 0, 1, 2 at 200 workflows;
drift-team: the generated 400-workflow set, seed 0): split by time (each type's first 70 % of
workflows train), fit, and replay the rest through the serving ``Predictor`` twice — keep-alive
calibration on, the candidate selection (:mod:`predictors.keep_alive_selection`) off and on —
scoring both on the same idle gaps exactly as ``profiler eval --online`` does. Per set: coverage
and KV-seconds per covered gap of each, *on minus off* and *on minus every baseline* (idle-gap p95,
tool p95, NAT trie) ± the delete-one-workflow jackknife error ("DOMINATED": the other ahead beyond
one), and which candidate served per type with its switches. ``--side train`` splits the training
part by time again and replays its later 30 %: the side the selector's constants are chosen on.
``--grid`` lists ``half_life:margin:min_outcomes[:warm_gaps]`` settings of the selector to replay (default: the shipped ones).
``--split random`` splits 70/30 by workflow (seeded hash) instead of by time. The selector starts
from the fit's forward replay of the training side stored in the profile (its warm start; "warm"
names the candidate that evidence serves first); ``--cold`` starts it from no evidence instead;
``--scores`` prints every candidate's figures in the warm start and on the server's own gaps.
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import predictors.keep_alive_selection as ks  # noqa: E402
from bench.bench_keep_alive_online import time_split  # noqa: E402
from bench.bench_real import real_source  # noqa: E402
from fitting.profile_fit import fit_profile  # noqa: E402
from predictors.keep_alive_compare import compare_held  # noqa: E402
from scoring.evaluation import keep_alive_baseline_ttls, keep_alive_cost  # noqa: E402
from scoring.online_eval import replay_served, stream_calls, stream_gaps  # noqa: E402
from store import ingest as ingest_mod  # noqa: E402
from store.duckdb_store import connect  # noqa: E402
from store.workloads import generate, write_jsonl  # noqa: E402


def sources(name: str, work: Path) -> list[tuple[str, Path]]:
    """``(label, file)`` of one set name."""
    if name == "messy":
        out = []
        for seed in (0, 1, 2):
            path = work / f"messy{seed}" / "messy.jsonl"
            write_jsonl(generate("messy", 200, seed=seed), path)
            out.append((f"messy{seed}", path))
        return out
    if name == "drift-team":
        path = work / "drift-team" / "drift-team.jsonl"
        write_jsonl(generate("drift-team", 400, seed=0), path)
        return [("drift-team", path)]
    return [(name, real_source(name, None))]


def split(path: Path, work: Path, side: str, order: str) -> tuple[Path, Path]:
    """(train, test) folders of ``path``: by time (:func:`time_split`) or by a seeded hash of the
    workflow id (``order="random"``), 70/30; ``side="train"`` splits the training part again."""
    return time_split(path, work, side, "time" if order == "time" else "hash")


def fmt_vs(v: dict[str, Any]) -> str:
    kv = "n/a" if v["kv_s_diff"] is None else f"{v['kv_s_diff']:+.3f}±{(v['kv_s_diff_se'] or 0):.3f}"
    return f"{v['coverage_diff']:+.4f}±{(v['coverage_diff_se'] or 0):.4f}; {kv}" + (" DOMINATED" if v["dominated"] else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="agentless,swe_agent,mini_swe,messy,drift-team",
                    help="comma-separated: agentless, swe_agent, mini_swe, messy, drift-team")
    ap.add_argument("--side", choices=("test", "train"), default="test",
                    help="test: the time split's later 30 %%; train: its training part split again")
    ap.add_argument("--grid", default=f"{ks.HALF_LIFE:g}:{ks.MARGIN:g}:{ks.MIN_OUTCOMES:g}:{ks.WARM_GAPS:g}",
                    help="half_life:margin:min_outcomes[:warm_gaps] of the selector, comma-separated "
                         "(default: the shipped ones; warm_gaps: the most effective gaps the warm start counts for)")
    ap.add_argument("--split", choices=("time", "random"), default="time",
                    help="time: each type's first 70 %% of workflows train; random: a seeded 70/30 by workflow")
    ap.add_argument("--cold", action="store_true",
                    help="start the selector from no evidence (not the profile's warm start)")
    ap.add_argument("--scores", action="store_true",
                    help="also print each candidate's coverage / KV-s per covered gap per type: in the warm "
                         "start (the training side's forward replay) and on the server's own gaps (a replay "
                         "whose selector never switches)")
    a = ap.parse_args()
    grid = [(*(float(x) for x in g.split(":")), ks.WARM_GAPS)[:4] for g in a.grid.split(",")]
    print(f"# {' '.join(sys.argv)}  (side {a.side}, split {a.split}, {'cold' if a.cold else 'warm'} start)", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-ka-select-") as tmp:
        work = Path(tmp)
        for name in a.sets.split(","):
            for label, path in sources(name, work):
                t0 = time.perf_counter()
                w = work / label
                train, test = split(path, w, a.side, a.split)
                profile, _ = fit_profile([train], w / "profile")
                if not profile.data.get("idle_gap"):
                    print(f"{label}: no idle-gap TTL", flush=True)
                    continue
                con = connect(None)
                ingest_mod.ingest(con, [test])
                calls = stream_calls(con)
                gap = stream_gaps(con, calls)
                groups = (calls["workflow_type_id"].astype(str) + "\x1f" + calls["workflow_id"].astype(str)).to_numpy()
                off = replay_served(profile, calls, online=True, keep_alive_selection=False)[2]
                base = keep_alive_baseline_ttls(profile, con, calls)
                for half_life, margin, min_outcomes, warm_gaps in grid:
                    sel = ks.KeepAliveSelector(half_life=half_life, margin=margin, min_outcomes=min_outcomes,
                                               warm=not a.cold, warm_gaps=warm_gaps)
                    sel.warm_start({wt: v.get("selection_warm_start")
                                    for wt, v in profile.data["idle_gap"]["workflow_types"].items()})
                    warm = {wt: s["served"] for wt, s in sel.status().items()}
                    _, _, on, _, rw = replay_served(profile, calls, online=True, keep_alive_selection=sel)
                    m = ~np.isnan(gap) & ~np.isnan(on) & ~np.isnan(off)
                    if not m.any():
                        print(f"{label}: no scored idle gap (order-only times)", flush=True)
                        break
                    held = {k: keep_alive_cost(gap[m], t[m]) for k, t in
                            {"off": off, "on": on, **base}.items()}
                    figs = " ".join(f"{k} {c.covered.mean():.3f}/{c.kv_s_per_covered_gap:.2f}"
                                    if c.kv_s_per_covered_gap is not None else f"{k} n/a"
                                    for k, c in held.items())
                    print(f"{a.side} {label:11s} h={half_life:g} m={margin:g} min={min_outcomes:g} warm≤{warm_gaps:g} gaps={int(m.sum())} | {figs}", flush=True)
                    print(f"    on − off: {fmt_vs(compare_held(gap[m], held['on'].held, held['off'].held, groups[m]))}"
                          + "".join(f" | on − {k}: {fmt_vs(compare_held(gap[m], held['on'].held, held[k].held, groups[m]))}"
                                    for k in base) + f" | off − tool_p95: "
                          f"{fmt_vs(compare_held(gap[m], held['off'].held, held['tool_p95'].held, groups[m]))}", flush=True)
                    for wt, s in rw["keep_alive_selection"].items():
                        calls_by = {k: v for k, v in s["served_calls"].items() if v}
                        print(f"    {wt}: warm {warm.get(wt, '-')}, served now {s['served']}, switches {s['switches']}, "
                              f"calls {calls_by}", flush=True)
                if a.scores:
                    warm_sel = ks.KeepAliveSelector()
                    warm_sel.warm_start({wt: v.get("selection_warm_start")
                                         for wt, v in profile.data["idle_gap"]["workflow_types"].items()})
                    own = ks.KeepAliveSelector(warm=False, min_outcomes=math.inf)
                    replay_served(profile, calls, online=True, keep_alive_selection=own)
                    for side, st in (("warm start", warm_sel.status()), ("server's own gaps", own.status())):
                        for wt, v in st.items():
                            print(f"    {wt} {side}: " + ", ".join(
                                f"{c} {x['coverage']:.4f}/{x['kv_s_per_covered_gap']:.3f}"
                                for c, x in v["candidates"].items() if x["coverage"] is not None), flush=True)
                con.close()
                print(f"    ({time.perf_counter() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
