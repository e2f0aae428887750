"""Keep-alive TTL, static vs online-calibrated, per time split (and the train-side choice of H).

    python bench/bench_keep_alive_online.py [--sets swe_agent,messy,mini_swe,agentless,drift-team]
                                            [--side test|train] [--split time|random]
                                            [--grid 0.2:10:0:30,0.2:10:1:30]

Per set (messy: seeds 0, 1, 2, 200 workflows each; drift-team: the generated 400-workflow set,
seed 0; real sets as ``bench/bench_real.py`` finds them): split by time (``profiler split
--by-time``, 70/30), fit on the first part and replay the rest through the serving ``Predictor`` (``profiler eval --online``'s ``keep_alive``). With
``--side train`` the *training* part is split by time again (70/30) and that is what is fitted
and replayed: the side the keep-alive calibrator's constants are chosen on, never the reported
test side. ``--split random`` splits 70/30 by a seeded hash of the workflow id instead. ``--grid`` lists ``rate:horizon[:z:half-life:forward-z:floor]`` (κ, the escalation memory H,
the level's dead band: its z, 0 = off, its half-life in outcomes, and the training side's
evidence a type needs to be served through it; and the least stretch the level is served at,
0.25 = the level unfloored) to replay.
One line per set (seed) and pair: static vs online coverage, mean TTL (s), KV-seconds per
covered gap, the online worst-window coverage, the oracle's cost, and each baseline that
dominates the served TTL (``dominated:``, eval's jackknife rule; none: ``-``), the share of calls
served the fitted TTL as fitted (``fitted served``: the level's dead band closed); from the second
setting on, also that setting's served TTL minus the first's on the same gaps (``vs first:``,
± the delete-one-workflow jackknife; ``DOMINATED``: the first ahead beyond one error).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import predictors.online_calibration as oc  # noqa: E402
from bench.bench_real import real_source  # noqa: E402
from fitting.profile_fit import fit_profile  # noqa: E402
from predictors.keep_alive_compare import compare_held  # noqa: E402
from scoring.evaluation import keep_alive_cost  # noqa: E402
from scoring.online_eval import keep_alive_online, replay_served, stream_calls, stream_gaps  # noqa: E402
from store import ingest as ingest_mod  # noqa: E402
from store.duckdb_store import connect  # noqa: E402
from store.split import split_logs  # noqa: E402
from store.workloads import generate, write_jsonl  # noqa: E402


def time_split(path: Path, work: Path, side: str, order: str = "time") -> tuple[Path, Path]:
    """(train, test) folders of ``path`` split 70/30 by time under ``work`` (``order="hash"``: by
    a seeded hash of the workflow id instead); ``side="train"`` splits the training side again
    (its later 30 % as the test, or a 70/30 hash split under another seed: the same seed would
    put every training workflow on the training side again; for choosing constants blind)."""
    split_logs([path], work / "split", train=0.7, seed=0, order=order)
    train, test = work / "split" / "train", work / "split" / "test"
    if side == "train":
        split_logs([train], work / "split2", train=0.7, seed=1, order=order)
        train, test = work / "split2" / "train", work / "split2" / "test"
    return train, test


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="swe_agent,messy,mini_swe,agentless")
    ap.add_argument("--side", choices=("test", "train"), default="test")
    ap.add_argument("--split", choices=("time", "random"), default="time",
                    help="time: each type's first 70 %% of workflows train; random: a seeded 70/30 by workflow")
    ap.add_argument("--grid", default=(f"{oc.KEEP_ALIVE_RATE}:{oc.KEEP_ALIVE_ESCALATION_HORIZON:g}:"
                                       f"{oc.KEEP_ALIVE_DEAD_BAND_Z:g}:{oc.KEEP_ALIVE_DEAD_BAND_HALF_LIFE:g}:"
                                       f"{oc.KEEP_ALIVE_DEAD_BAND_FORWARD_Z:g}:{oc.KEEP_ALIVE_MIN_SERVED_STRETCH:g}"),
                    help="rate:horizon[:z:half-life:forward-z:floor] tuples, comma-separated: κ, the escalation "
                         "memory H, the dead band's z (0: off), half-life and forward z, and the least stretch "
                         "the level is served at (0.25: unfloored; default: the shipped constants)")
    a = ap.parse_args()
    grid = [tuple(float(x) for x in g.split(":")) for g in a.grid.split(",")]
    default_floor = oc.KEEP_ALIVE_MIN_SERVED_STRETCH
    with tempfile.TemporaryDirectory(prefix="bench-ka-") as tmp:
        work = Path(tmp)
        for name in a.sets.split(","):
            sources = []
            if name == "messy":
                for seed in (0, 1, 2):
                    path = work / f"messy{seed}" / "messy.jsonl"
                    write_jsonl(generate("messy", 200, seed=seed), path)
                    sources.append((f"messy{seed}", path))
            elif name == "drift-team":
                path = work / "drift-team" / "drift-team.jsonl"
                write_jsonl(generate("drift-team", 400, seed=0), path)
                sources.append((name, path))
            else:
                sources.append((name, real_source(name, None)))
            for label, path in sources:
                w = work / label
                train, test = time_split(path, w, a.side, "time" if a.split == "time" else "hash")
                profile, _ = fit_profile([train], w / "profile")
                con = connect(None)
                ingest_mod.ingest(con, [test])
                calls = stream_calls(con)
                gap = stream_gaps(con, calls)
                groups = (calls["workflow_type_id"].astype(str) + "\x1f" + calls["workflow_id"].astype(str)).to_numpy()
                first = None
                static = replay_served(profile, calls, online=False)[2]
                for rate, horizon, *band in grid:
                    oc.KEEP_ALIVE_RATE, oc.KEEP_ALIVE_ESCALATION_HORIZON = rate, horizon
                    z, hl, fz, fl = (list(band) + [oc.KEEP_ALIVE_DEAD_BAND_Z, oc.KEEP_ALIVE_DEAD_BAND_HALF_LIFE,
                                                   oc.KEEP_ALIVE_DEAD_BAND_FORWARD_Z,
                                                   default_floor][len(band):])[:4]
                    oc.KEEP_ALIVE_DEAD_BAND_Z, oc.KEEP_ALIVE_DEAD_BAND_HALF_LIFE = z, hl
                    oc.KEEP_ALIVE_DEAD_BAND_FORWARD_Z, oc.KEEP_ALIVE_MIN_SERVED_STRETCH = fz, fl
                    # one online replay per setting: its served TTLs are both what ``profiler eval
                    # --online`` scores (keep_alive_online, as evaluate_online does) and the paired
                    # comparison's
                    _, _, served, _, rw = replay_served(profile, calls, online=True)
                    ka = keep_alive_online(profile, con, calls, served, static, rw["keep_alive_selection"])
                    sm = ~np.isnan(served) & ~np.isnan(static)
                    vs = f" | fitted served {np.isclose(served[sm], static[sm]).mean():.2f}" if sm.any() else ""
                    if first is None:
                        first = served
                    else:
                        m = ~np.isnan(gap) & ~np.isnan(served) & ~np.isnan(first)
                        if m.any():
                            d = compare_held(gap[m], keep_alive_cost(gap[m], served[m]).held,
                                             keep_alive_cost(gap[m], first[m]).held, groups[m])
                            vs += (f" | vs first: {d['coverage_diff']:+.4f}±{d['coverage_diff_se'] or 0:.4f}; "
                                  f"{d['kv_s_diff'] or 0:+.3f}±{d['kv_s_diff_se'] or 0:.3f}"
                                  + (" DOMINATED" if d["dominated"] else ""))
                    if not ka or not ka["gaps"]:
                        print(f"{a.side} {label}: no idle-gap TTL (order-only times)", flush=True)
                        continue
                    on, st = ka["online"], ka["static"]
                    dom = ",".join(f"{k}({v['coverage_diff']:+.4f}±{v['coverage_diff_se']:.4f};"
                                   f"{v['kv_s_diff']:+.3f}±{v['kv_s_diff_se']:.3f})"
                                   for k, v in ka.get("vs_baselines", {}).items() if v.get("dominated")) or "-"
                    print(f"{a.side} {label:10s} rate={rate:g} H={horizon:g} z={z:g} hl={hl:g} fz={fz:g} floor={fl:g} gaps={ka['gaps']} "
                          f"nominal={ka['nominal']:.2f} | static cov={fmt(st['coverage'])} "
                          f"ttl={fmt(st['mean_ttl_s'], '.2f')} kv/cov={fmt(st['kv_s_per_covered_gap'])} | "
                          f"online cov={fmt(on['coverage'])} ttl={fmt(on['mean_ttl_s'], '.2f')} "
                          f"kv/cov={fmt(on['kv_s_per_covered_gap'])} worst={fmt(on['worst_window_coverage'])} "
                          f"| oracle kv/cov={fmt(ka['oracle_kv_s_per_covered_gap'])} | dominated: {dom}{vs}", flush=True)
                con.close()


if __name__ == "__main__":
    main()
