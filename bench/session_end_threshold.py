"""Choose ``profiler gateway --session-end-p``: how well the served ``p_end`` flags last calls.

For each bundled real trace set the workflows are split 70/30 by workflow (``profiler split``'s
rule, seed 0), a profile is fit on the train side, and every held-out workflow is replayed call by
call through a ``predictors.Predictor`` exactly as served (``annotate`` at arrival, ``observe`` at
completion: :func:`scoring.remaining_eval.held_out_calls` order). For each threshold ``t`` the
script reports, over the calls the profile predicts (``known``):

* ``last_flagged`` — the share of held-out **last** calls whose ``p_end >= t`` (the signal fires
  where it should: the session's KV is released at once);
* ``nonlast_flagged`` — the share of **non-last** calls whose ``p_end >= t`` (a false end: the
  session's prefix is dropped and its next call re-prefills it).

Run: ``python bench/session_end_threshold.py [--json out.json]`` (a few minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from store import ingest  # noqa: E402
from fitting.profile_fit import FitOptions, fit_profile  # noqa: E402
from scoring.remaining_eval import held_out_calls, served_annotations  # noqa: E402
from store.split import split_logs  # noqa: E402
from store.duckdb_store import connect  # noqa: E402

SETS = {
    "swe_agent_glm45": ROOT / "datasets/swe_agent/swe_agent_glm45_bs4.jsonl",
    "mini_swe_agent_gemini3": ROOT / "datasets/real/mini_swe_agent_gemini3.jsonl",
    "agentless_pr28": ROOT / "datasets/real/agentless_pr28.jsonl",
    "whowhen_magentic_captain": ROOT / "datasets/real/seq_whowhen_magentic_captain.jsonl",
}
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


def served_p_end(profile_dir: Path, test_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(p_end served (NaN: none), known, is_last)`` for every held-out call."""
    con = connect(None)
    try:
        ingest.ingest(con, [test_dir])
        calls = held_out_calls(con)
    finally:
        con.close()
    anns = list(served_annotations(str(profile_dir), calls))
    p_end = np.array([np.nan if a.p_end is None else a.p_end for a in anns], dtype=float)
    known = np.array([a.known for a in anns], dtype=bool)
    wf_key = (calls["workflow_type_id"] + "\x00" + calls["workflow_id"]).to_numpy()
    is_last = np.append(wf_key[1:] != wf_key[:-1], True)
    return p_end, known, is_last


def _q(values: np.ndarray, q: float) -> float | None:
    return round(float(np.quantile(values, q)), 4) if len(values) else None


def measure(name: str, path: Path, work: Path) -> dict:
    split_logs([path], work / name, train=0.7, seed=0)
    fit_profile([work / name / "train"], work / name / "profile", options=FitOptions(seed=0))
    p_end, known, is_last = served_p_end(work / name / "profile", work / name / "test")
    have = known & ~np.isnan(p_end)
    out = {"calls": int(len(p_end)), "workflows": int(is_last.sum()),
           "known_with_p_end": int(have.sum()),
           "last_known": int((have & is_last).sum()), "nonlast_known": int((have & ~is_last).sum()),
           "p_end_last_min": _q(p_end[have & is_last], 0.0),
           "p_end_last_median": _q(p_end[have & is_last], 0.5),
           "p_end_nonlast_max": _q(p_end[have & ~is_last], 1.0),
           "thresholds": {}}
    for t in THRESHOLDS:
        hit = have & (p_end >= t)
        out["thresholds"][str(t)] = {
            "last_flagged": float(hit[is_last].sum() / max(1, (have & is_last).sum())),
            "nonlast_flagged": float(hit[~is_last].sum() / max(1, (have & ~is_last).sum()))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--sets", nargs="*", default=list(SETS), help="which sets (default: all)")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sets:
            results[name] = measure(name, SETS[name], Path(tmp))
            r = results[name]
            print(f"{name}: {r['workflows']} held-out workflows, {r['calls']} calls, "
                  f"{r['known_with_p_end']} known with p_end ({r['last_known']} last); p_end of last "
                  f"calls min {r['p_end_last_min']} median {r['p_end_last_median']}, of non-last "
                  f"calls max {r['p_end_nonlast_max']}")
            for t, v in r["thresholds"].items():
                print(f"  p_end >= {t:<4}  last calls flagged {v['last_flagged']:6.1%}   "
                      f"non-last calls flagged {v['nonlast_flagged']:6.1%}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
