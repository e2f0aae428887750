"""Ours vs naive baselines on real traces and the messy generator, on held-out workflows.

    python bench/bench_real.py [--sets agentless,whowhen,swe_agent,mini_swe,messy] [--cv K]
                               [--messy-seeds 0,1,2] [--messy-workflows 200] [--json]
    python bench/bench_real.py --sets coding-assistant,deep-research   # generated sets + Bayes bound
    python bench/bench_real.py --split time      # train on the 70 % that started first, test on the rest

For every real set (the full files in ``../shared/datasets/`` when that folder exists, else the
small copies in ``datasets/real/``; ``--data`` picks another folder) and for the messy workload
(several seeds): split 70/30 by workflow (``profiler split``, seed 0), fit on train (``profiler
fit``), score on test (``profiler eval``), and print one "ours vs baselines" table (a column per
set; n/a where the eval does not compute a score yet). With ``--cv K`` every set is scored by
K-fold cross-validation by workflow instead (``profiler eval --cv K``): mean ± std over folds.
The messy column is the mean ± std over its seeds.

The generated Pythia workloads (``coding-assistant``, ``deep-research``: 400 workflows, seed 0)
are sets too; for them the bench also prints the **Bayes bound** of next-agent top-1: the
generator's own structure is simulated (``profiler.workloads._expand``, 200,000 workflows) to get
P(next | whole history), and the oracle that predicts its arg-max is scored on the same held-out
calls (``bayes_top1_heldout``; on a 70/30 split) beside its expectation (``bayes_top1_expected``).

The command line, the data source of every set and the wall time are printed with the table;
``--json`` prints all of it, every eval result included, as one object.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from collections import Counter, defaultdict
from typing import Any

import numpy as np
from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from profiler.baseline_table import baseline_rows, baseline_table  # noqa: E402
from profiler.commands.common import print_json  # noqa: E402
from profiler.cross_validation import aggregate, cross_validate, nest  # noqa: E402
from profiler.evaluation import evaluate  # noqa: E402
from profiler.fitting import fit_profile  # noqa: E402
from profiler.split import split_logs  # noqa: E402
from profiler.workloads import _expand, generate, load_spec, write_jsonl  # noqa: E402

#: Short name -> file name of the real sets (in ../shared/datasets or datasets/real).
REAL_SETS = {
    "agentless": "agentless_pr28.jsonl",
    "whowhen": "seq_whowhen_magentic_captain.jsonl",
    "swe_agent": "swe_agent_glm45_bs4.jsonl",
    "mini_swe": "mini_swe_agent_gemini3.jsonl",
}
#: Generated sets (workload name -> workflows) scored beside their Bayes bound.
GENERATED = {"coding-assistant": 400, "deep-research": 400}
SHARED = REPO.parent / "shared" / "datasets"
SMALL = REPO / "datasets" / "real"
#: The full SWE-agent set ships in the repository itself (datasets/swe_agent/): datasets/real/
#: has no copy of it, so `profiler fit datasets/` reads each call once.
BUNDLED = REPO / "datasets" / "swe_agent"


def real_source(name: str, data: Path | None) -> Path:
    """The file of real set ``name``: in ``data`` if given, else the full set, else the copy."""
    for folder in ([data, BUNDLED] if data else [SHARED, SMALL, BUNDLED]):
        path = folder / REAL_SETS[name]
        if path.exists():
            return path
    raise SystemExit(f"error: {REAL_SETS[name]} not found in {data or f'{SHARED} or {SMALL}'}")


def bayes_top1(workload: str, test: Path, n_sim: int = 200_000, seed: int = 12345) -> dict[str, float]:
    """Next-agent top-1 of the Bayes oracle of a generated workload (see the module docstring):
    ``bayes_top1_expected`` = E[max_y P(y | history)] per scored call, ``bayes_top1_heldout`` =
    the oracle's hits on the held-out sequences in ``test`` (a file or folder of records)."""
    spec = load_spec(workload)
    rng = np.random.default_rng(seed)
    table: dict[tuple[str, ...], Counter] = defaultdict(Counter)
    for _ in range(n_sim):
        seq = [a for stage in _expand(spec["structure"], rng) for a in stage]
        for i in range(1, len(seq)):
            table[tuple(seq[:i])][seq[i]] += 1
    hits = sum(max(c.values()) for c in table.values())
    events = sum(sum(c.values()) for c in table.values())
    calls: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for f in ([test] if test.is_file() else sorted(test.rglob("*.jsonl"))):
        for line in f.open():
            r = json.loads(line)
            calls[r["workflow_id"]].append((r["t_arrival"], r["agent_id"]))
    ok = n = 0
    for rows in calls.values():
        seq = [a for _, a in sorted(rows)]
        for i in range(1, len(seq)):
            row = table.get(tuple(seq[:i]))
            n += 1
            ok += bool(row) and min(row, key=lambda y: (-row[y], y)) == seq[i]
    return {"bayes_top1_expected": hits / events, "bayes_top1_heldout": ok / max(n, 1)}


def split_fit_eval(logs: list[Path], work: Path, by: str = "hash") -> dict[str, Any]:
    """70/30 split by workflow, fit on 70, eval on 30 (the profiler's own code paths); ``by``
    ``"time"``: the 70 % that started first is train (train on the past, test on the future)."""
    split_logs(logs, work / "split", train=0.7, seed=0, by=by)
    profile, _ = fit_profile([work / "split" / "train"], work / "profile")
    result, _ = evaluate(profile, [work / "split" / "test"])
    return result


def score(logs: list[Path], work: Path, cv: int | None, by: str = "hash") -> dict[str, Any] | Exception:
    """The eval (or CV) result, or the exception that stopped the fit or eval (the bench goes on
    with the other sets and reports it)."""
    try:
        return cross_validate(logs, cv, seed=0, progress=False) if cv else split_fit_eval(logs, work, by)
    except Exception as exc:  # noqa: BLE001 - reported per set, never hidden
        return exc


def over_seeds(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several seeds' results as one CV-shaped result (mean ± std over seeds), for the table.

    A CV result per seed contributes its fold-weighted mean."""
    flat = [{**r["mean"], "calls": r["calls"], "workflows": r["workflows"]} if "folds" in r else r
            for r in results]
    summary = aggregate(flat)
    return {"folds": results, "summary": summary,
            "mean": nest({k: s["weighted_mean"] for k, s in summary.items()})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="agentless,whowhen,swe_agent,mini_swe,messy",
                    help="comma-separated: " + ", ".join([*REAL_SETS, "messy", *GENERATED]))
    ap.add_argument("--cv", type=int, default=None, metavar="K", help="K-fold CV by workflow instead of one 70/30 split")
    ap.add_argument("--split", choices=("hash", "time"), default="hash",
                    help="without --cv: split by the hash of the workflow id (default) or in time "
                         "(the 70 %% of workflows that started first is train)")
    ap.add_argument("--messy-seeds", default="0,1,2", help="seeds of the messy workload")
    ap.add_argument("--messy-workflows", type=int, default=200, help="workflows per messy seed")
    ap.add_argument("--data", type=Path, default=None, help="folder with the real sets (default: ../shared/datasets, else datasets/real)")
    ap.add_argument("--json", action="store_true", help="one JSON object: command, sources, times, every result")
    args = ap.parse_args()
    names = [s.strip() for s in args.sets.split(",") if s.strip()]
    unknown = [n for n in names if n not in REAL_SETS and n != "messy" and n not in GENERATED]
    if unknown:
        ap.error(f"unknown set(s) {', '.join(unknown)}: choose from {', '.join([*REAL_SETS, 'messy', *GENERATED])}")
    command = "python " + " ".join(shlex.quote(a) for a in [str(Path(sys.argv[0])), *sys.argv[1:]])
    err = Console(stderr=True)
    if args.cv and args.split != "hash":
        ap.error("--split time is a single past/future split: leave out --cv")
    out: dict[str, Any] = {"command": command, "mode": f"{args.cv}-fold CV by workflow" if args.cv
                           else "70/30 split by workflow start time (train on the past)"
                           if args.split == "time" else "70/30 split by workflow (seed 0)", "sets": {}}
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        work = Path(tmp)
        for name in names:
            t0 = time.perf_counter()
            if name == "messy":
                seeds = [int(s) for s in args.messy_seeds.split(",")]
                per_seed = []
                for seed in seeds:
                    with err.status(f"messy seed {seed}"):
                        path = work / f"messy{seed}" / "messy.jsonl"
                        write_jsonl(generate("messy", args.messy_workflows, seed=seed), path)
                        per_seed.append(score([path], work / f"messy{seed}", args.cv, args.split))
                failed = [r for r in per_seed if isinstance(r, Exception)]
                result = failed[0] if failed else over_seeds(per_seed)
                source = f"profiler generate --messy --workflows {args.messy_workflows} --seed {{{args.messy_seeds}}}"
                label = f"messy ×{len(seeds)} seeds"
            elif name in GENERATED:
                path = work / name / f"{name}.jsonl"
                with err.status(f"{name}: generating"):
                    write_jsonl(generate(name, GENERATED[name], seed=0), path)
                    result = score([path], work / name, args.cv, args.split)
                    if not isinstance(result, Exception):
                        held_out = path if args.cv else work / name / "split" / "test"
                        result["bayes"] = bayes_top1(name, held_out)
                source = f"profiler generate --workload {name} --workflows {GENERATED[name]} --seed 0"
                label = name
            else:
                path = real_source(name, args.data)
                with err.status(f"{name}: {path}"):
                    result = score([path], work / name, args.cv, args.split)
                source, label = str(path), name
            elapsed = time.perf_counter() - t0
            entry: dict[str, Any] = {"source": source, "seconds": round(elapsed, 1)}
            if isinstance(result, Exception):  # the fit or eval itself crashed: report, go on
                entry["error"] = f"{type(result).__name__}: {result}"
            else:
                entry.update(result=result, table=baseline_rows(result))
            out["sets"][label] = entry
            err.print(f"{label}: {elapsed:.1f} s" + (f" — FAILED: {entry['error']}" if "error" in entry else ""))
    if args.json:
        print_json(out)
        return
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(f"[bold]{command}[/]", highlight=False)
    console.print(f"mode: {out['mode']}")
    for label, s in out["sets"].items():
        if "error" in s:
            console.print(f"  {label}: {s['source']} — [red]fit/eval failed[/]: {s['error']}", highlight=False)
            continue
        r = s["result"]
        size = (f"{r['calls']:,} held-out calls, {r['workflows']:,} workflows" if "calls" in r
                else f"{r['mean'].get('calls', 0):,.0f} held-out calls per seed on average")
        console.print(f"  {label}: {s['source']} ({size}; {s['seconds']} s)", highlight=False)
        if "bayes" in r:
            b, na = r["bayes"], (r.get("mean", r).get("next_agent") or {})
            console.print(f"    next-agent top-1 Bayes bound: {b['bayes_top1_expected']:.3f} expected, "
                          f"{b['bayes_top1_heldout']:.3f} on these held-out calls"
                          + (" (all workflows)" if "folds" in r else "")
                          + f"; ours {na.get('top1_accuracy', float('nan')):.3f}", highlight=False)
    spread = "; mean ± std over folds" if args.cv else ""
    spread += "; messy: mean ± std over seeds" if "messy" in names else ""
    console.print(baseline_table({label: s["result"] for label, s in out["sets"].items() if "result" in s},
                                 title=f"ours vs baselines on held-out workflows ({out['mode']}{spread})"))


if __name__ == "__main__":
    main()
