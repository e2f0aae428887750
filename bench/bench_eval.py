"""Accuracy benchmark: fit on 70 % of workflows, score on the other 30 %, for the real SWE-agent
traces and generated coding-assistant / deep-research sets, printed side by side.

    python bench/bench_eval.py [--workflows 400] [--json]

For every data set: output-length coverage and mean band width against the naive global band,
tool-latency p95 coverage and KS distance, and whatever the profile's extensions add (next-agent
accuracy, path acceptance, remaining-calls error, prompt composition).
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_one(name: str, logs: list[Path], work: Path) -> dict:
    from scoring.evaluation import evaluate
    from fitting.profile_fit import fit_profile
    from store.split import split_logs

    split_logs(logs, work / name / "split", train=0.7, seed=0)
    profile, _ = fit_profile([work / name / "split" / "train"], work / name / "profile")
    result, _ = evaluate(profile, [work / name / "split" / "test"])
    result["regexes"] = {wt: s.get("regex") for wt, s in profile.data.get("workflows", {}).items()}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workflows", type=int, default=400, help="workflows per generated set")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from store.workloads import generate, write_jsonl

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sets = {"swe_agent (real)": [REPO / "datasets" / "swe_agent" / "swe_agent_glm45_bs4.jsonl"]}
        for wl in ("coding_assistant", "deep_research"):
            path = work / "gen" / f"{wl}.jsonl"
            write_jsonl(generate(wl, args.workflows, seed=3, with_text=True), path)
            sets[f"{wl} (generated)"] = [path]
        results = {name: run_one(name.split()[0], logs, work) for name, logs in sets.items()}
    if args.json:
        print(json.dumps(results, indent=1, default=str))
        return
    print(f"{'data set':28} {'calls':>6} {'cover':>6} {'width':>7} {'global':>7} {'tool p95 cov':>12} {'KS max':>7}")
    for name, r in results.items():
        ol, tl = r["output_len"], r["tool_latency"]
        print(f"{name:28} {r['calls']:6d} {ol['coverage']:6.3f} {ol['mean_width']:7.0f} "
              f"{ol['global_band_width']:7.0f} {tl['p95_coverage']:12.3f} {tl['ks_max']:7.3f}")
    extra = [k for k in ("next_agent", "path", "remaining_calls", "prompt_composition")
             if any(k in r for r in results.values())]
    for key in extra:
        print(f"\n{key}:")
        for name, r in results.items():
            print(f"  {name:28} {r.get(key)}")
    for name, r in results.items():
        for wt, rx in r["regexes"].items():
            print(f"regex {wt}: {rx}")


if __name__ == "__main__":
    main()
