"""Keep-alive TTL on time-ordered splits: coverage, mean TTL, share at the cap, KV-seconds held.

    python bench/bench_keep_alive_drift.py [LOG ...] [--seeds 0 1 2] [--workflows 64]
    python bench/bench_keep_alive_drift.py --families team --half-lives 0.2 0.05 --force-level agent \
        --seeds 0 1 2 3 4 5 6 7 8 9      # the stress check: short half-lives, agent level served

Each log (given files, plus seeded ``messy`` workloads of ``--workflows`` workflows and the
constructed drifting 8-role team of ``tests/test_idle_gap_certified.py``) is split per workflow
type by start time (first ``--train`` share of workflows trains, the rest test, as ``profiler
split --by-time``); the idle-gap model is fit on the training calls exactly as ``profiler fit``
does (``fitting.profile_fit.idle_gap_calls``, cap 600 s) and replayed on the test sessions
(``predict_sessions``); every TTL is bounded as the keep/drop policy serves it (0.5–120 s), as
``profiler eval`` scores it. Prints per set: coverage of the test idle gaps (nominal 0.95),
mean TTL, share of TTLs at the 120 s cap and KV-seconds held per covered gap
(Σ min(TTL, gap) / #covered; docs/keep-alive.md), the half-life and the forward check's choice per
type (``chosen`` or ``pooled``: :meth:`IdleGapModel._forward_check`), and the means over the sets.
``--no-forward`` fits as before the forward check (the before-figures of issue 37 item 4).

Issue 26: drift weighting once sent most TTLs of a small team to the cap (a recency-weighted
quantile its weights could not certify was served as the cap, and the cap won the half-life
choice). The figures in docs/keep-alive.md were made with this script.
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fitting.profile_fit import idle_gap_calls  # noqa: E402
from predictors.idle_gap import IdleGapModel  # noqa: E402
from serving_hooks.policies.keep_drop import KeepDropPolicy  # noqa: E402
from store import ingest as ingest_mod  # noqa: E402
from store.duckdb_store import connect  # noqa: E402
from store.workloads import generate, write_jsonl  # noqa: E402

ROLES = {"ceo": 0.8, "cpo": 1.0, "cto": 1.5, "programmer": 5.0, "reviewer": 2.0, "tester": 7.5,
         "designer": 1.2, "writer": 0.5}


def team_records(n_wf: int, seed: int) -> list[dict]:
    """Flat records of a drifting 8-role team: each role once per workflow, one workflow a day,
    the idle gap after a role ~ LN(ln(median · 3^(wf/(n−1))), 0.8) — tasks grow 3× over the log."""
    rng = np.random.default_rng(seed)
    out = []
    for wf in range(n_wf):
        t = 1.7e9 + wf * 86400.0
        drift = 3.0 ** (wf / max(n_wf - 1, 1))
        for k, (agent, median) in enumerate(ROLES.items()):
            dur = float(rng.lognormal(math.log(3.0), 0.4))
            out.append({"request_id": f"team{seed}-{wf}-{k}", "workflow_type_id": "team", "workflow_id": f"t{wf:04d}",
                        "agent_id": agent, "t_arrival": t, "t_finish": t + dur, "input_tokens": 500,
                        "output_tokens": 100})
            t += dur + float(rng.lognormal(math.log(median * drift), 0.8))
    return out


def grow_records(n_wf: int, seed: int, grow: float = 20.0) -> list[dict]:
    """Flat records of a type whose fast agent's idle gaps grow over the log (median 0.5 s, ×``grow``
    from the first workflow to the last) beside a slow agent's steady ~30 s, alternating, eight calls
    per workflow: shuffled CV picks the agent level, whose entry fit on the past under-covers the
    future, while the pooled per-type quantile (set by the slow agent) stays wide enough
    (``tests/test_idle_gap_forward.py``'s pattern; issue 37 item 4)."""
    rng = np.random.default_rng(seed)
    out = []
    for wf in range(n_wf):
        t = 1.7e9 + wf * 86400.0
        scale = 1 + (grow - 1) * wf / max(n_wf - 1, 1)
        for k in range(8):
            fast = k % 2 == 0
            dur = float(rng.lognormal(math.log(3.0), 0.4))
            out.append({"request_id": f"grow{seed}-{wf}-{k}", "workflow_type_id": "grow", "workflow_id": f"g{wf:04d}",
                        "agent_id": "fast" if fast else "slow", "t_arrival": t, "t_finish": t + dur,
                        "input_tokens": 500, "output_tokens": 100})
            t += dur + float(rng.lognormal(math.log(0.5 * scale if fast else 30.0), 0.3))
    return out


def time_split(path: Path, train: float, work: Path) -> tuple[Path, Path]:
    """The first ``train`` share of each type's workflows by start time, and the rest."""
    con = connect(None)
    try:
        ingest_mod.ingest(con, [path])
        starts = con.execute("SELECT workflow_type_id, workflow_id, min(t_arrival) FROM calls GROUP BY 1, 2").fetchall()
    finally:
        con.close()
    by_type: dict[str, list] = {}
    for wt, wf, t in starts:
        by_type.setdefault(wt, []).append((t, wf))
    first = {(wt, wf) for wt, v in by_type.items() for _, wf in sorted(v)[: int(round(train * len(v)))]}
    records = pd.read_json(path, lines=True)
    side = [(wt, wf) in first for wt, wf in zip(records["workflow_type_id"], records["workflow_id"])]
    tr, te = work / f"{path.stem}-train.jsonl", work / f"{path.stem}-test.jsonl"
    records[side].to_json(tr, orient="records", lines=True)
    records[[not s for s in side]].to_json(te, orient="records", lines=True)
    return tr, te


def gap_rows(path: Path) -> pd.DataFrame:
    con = connect(None)
    try:
        ingest_mod.ingest(con, [path])
        return idle_gap_calls(con)
    finally:
        con.close()


def score(train: Path, test: Path, half_lives: tuple | None = None, force_level: str | None = None,
          forward: bool = True) -> dict[str, float]:
    model = IdleGapModel(max_ttl_s=600.0, **({"half_lives": half_lives} if half_lives else {}),
                         **({} if forward else {"forward_origins": ()})).fit(gap_rows(train))
    if force_level:   # serve this level whatever cross-validation chose (as it chose on the team)
        for info in model.workflow_types_.values():
            if info.get("level") != "none":
                info["level"] = force_level
        model._index()
    rows = gap_rows(test)
    policy = KeepDropPolicy()
    raw = model.predict_sessions(rows)
    gap = rows["gap_after_s"].to_numpy(dtype=float)
    m = ~np.isnan(gap) & ~np.isnan(raw)
    ttl = np.clip(raw[m], policy.min_ttl_s, policy.max_ttl_s)
    g = gap[m]
    covered = g <= ttl
    return {"gaps": int(m.sum()), "coverage": float(covered.mean()), "mean_ttl_s": float(ttl.mean()),
            "at_cap": float(np.mean(ttl >= policy.max_ttl_s)),
            "kv_s_per_covered_gap": float(np.minimum(ttl, g).sum() / max(covered.sum(), 1)),
            "half_life": ",".join(str(v.get("half_life")) for v in model.workflow_types_.values()),
            "forward": ",".join((v.get("forward") or {}).get("served", "-") for v in model.workflow_types_.values())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="*", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--workflows", type=int, default=64)
    ap.add_argument("--train", type=float, default=0.7)
    ap.add_argument("--families", nargs="+", default=["messy", "team"], choices=["messy", "team", "grow"],
                    help="generated sets per seed (grow: a fast agent's gaps growing 20x beside a slow one)")
    ap.add_argument("--no-forward", action="store_true",
                    help="fit without the forward check against the pooled per-type quantile (the fit before it)")
    ap.add_argument("--half-lives", nargs="+", default=None,
                    help="candidate half-lives (fractions of a type's workflows; 'none' = no decay); default: the model's")
    ap.add_argument("--force-level", choices=["agent", "workflow_type"], default=None)
    a = ap.parse_args(argv)
    half_lives = tuple(None if h.lower() == "none" else float(h) for h in a.half_lives) if a.half_lives else None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sets = [(p.stem, p) for p in a.logs]
        for s in a.seeds:
            if "messy" in a.families:
                write_jsonl(generate("messy", a.workflows, seed=s), work / f"messy{s}.jsonl")
                sets.append((f"messy{s}", work / f"messy{s}.jsonl"))
            if "team" in a.families:
                write_jsonl(iter(team_records(a.workflows, s)), work / f"team{s}.jsonl")
                sets.append((f"team{s}", work / f"team{s}.jsonl"))
            if "grow" in a.families:
                write_jsonl(iter(grow_records(a.workflows, s)), work / f"grow{s}.jsonl")
                sets.append((f"grow{s}", work / f"grow{s}.jsonl"))
        results = {}
        print(f"{'set':28s} {'gaps':>5s} {'coverage':>8s} {'mean TTL':>8s} {'at cap':>6s} {'KV-s/cov':>8s}  half-life  forward")
        for name, path in sets:
            r = results[name] = score(*time_split(path, a.train, work), half_lives, a.force_level, not a.no_forward)
            print(f"{name:28s} {r['gaps']:5d} {r['coverage']:8.3f} {r['mean_ttl_s']:8.2f} {r['at_cap']:6.3f} "
                  f"{r['kv_s_per_covered_gap']:8.2f}  {r['half_life']}  {r.get('forward', '-')}", flush=True)
        for family in ("messy", "team", "grow"):
            rs = [r for n, r in results.items() if n.startswith(family)]
            if rs:
                print(f"{'mean ' + family:28s} {'':5s} {np.mean([r['coverage'] for r in rs]):8.3f} "
                      f"{np.mean([r['mean_ttl_s'] for r in rs]):8.2f} {np.mean([r['at_cap'] for r in rs]):6.3f} "
                      f"{np.mean([r['kv_s_per_covered_gap'] for r in rs]):8.2f}")


if __name__ == "__main__":
    main()
