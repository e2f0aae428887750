"""Benchmark: workflow synthesis (PFA → pruned regex → session estimates) on three data sets.

    python bench/bench_synth.py                 # all three sets
    python bench/bench_synth.py --only swe      # just the SWE-agent traces

For each set the logs are split 70/30 by workflow (``profiler split``'s md5 rule), each side is
ingested into its own DuckDB store (``store.ingest``), the synth section is fitted on the
train side and the held-out side is replayed call by call. Printed per set: the synthesized
regex, next-agent top-1 (per call, and per step: after each fan-out group), regex / PFA /
session acceptance, remaining-calls MAE (and the position-only baseline), and for the
generated sets the prompt-composition scores and a **prefix oracle**: top-1 of the best
possible predictor that sees the same prefix, estimated from a prefix tree over many more
generated workflows (no sequence model can beat it, so it bounds top-1).

(a) ``datasets/swe_agent/swe_agent_glm45_bs4.jsonl``: one agent (``main``), so the alphabet is
    the first tool run after each call (``tool_names[1]``). (b) ``coding_assistant`` and
    (c) ``deep_research`` from ``store.workloads.generate`` (with text).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
import timeit
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from store.ingest import ingest  # noqa: E402
from store.split import split_logs  # noqa: E402
from store.duckdb_store import connect  # noqa: E402
from store.workloads import generate, write_jsonl  # noqa: E402
from synth.evaluation import score_sequences  # noqa: E402
from synth.fit import DEFAULT_ALPHA, fit_sequences  # noqa: E402
from synth.pfa import PFA  # noqa: E402
from synth.profile_section import (agent_timings, build_workflows_section,  # noqa: E402
                                    evaluate_workflows)
from synth.sequences import CallRow, build_sequence, load_sequences  # noqa: E402
from synth.session import WorkflowPaths  # noqa: E402

SWE = REPO / "datasets" / "swe_agent" / "swe_agent_glm45_bs4.jsonl"


def stores(logs: Path, work: Path, seed: int):
    """(train connection, test connection) after a 70/30 split by workflow."""
    split_logs([logs], work / "split", train=0.7, seed=seed)
    cons = []
    for side in ("train", "test"):
        con = connect(None)
        ingest(con, [work / "split" / side])
        cons.append(con)
    return cons


def fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def show(name: str, section: dict, scores: dict, extra: str = "") -> None:
    na, path, rc = scores["next_agent"], scores["path"], scores["remaining_calls"]
    print(f"\n== {name}")
    print(f"regex            : {section['regex']}")
    print(f"train acceptance : PFA {fmt(section['train_acceptance'])}, "
          f"regex {fmt(section['train_regex_acceptance'])}  "
          f"(states: {section['states']})")
    print(f"next-agent top-1 : per call {fmt(na['top1_accuracy'])} (n={na['n']}), "
          f"per step {fmt(na['step_top1_accuracy'])} (n={na['n_steps']})")
    print(f"acceptance       : regex {fmt(path['regex_acceptance'])}, PFA "
          f"{fmt(path['pfa_acceptance'])}, session {fmt(path['session_acceptance'])} "
          f"(n={path['n_workflows']} held-out workflows)")
    print(f"remaining calls  : MAE {fmt(rc['mae'])} (position-only baseline "
          f"{fmt(rc['baseline_mae'])}), known share {fmt(rc['known_share'])}")
    if extra:
        print(extra)


def swe(work: Path, seed: int) -> None:
    train_con, test_con = stores(SWE, work / "swe", seed)
    tools = Counter(row[0] for row in train_con.execute(
        "SELECT coalesce(tool_names[1], 'no_tool') FROM calls").fetchall()
        + test_con.execute("SELECT coalesce(tool_names[1], 'no_tool') FROM calls").fetchall())
    named = train_con.execute("""SELECT count(DISTINCT workflow_id) FILTER (WHERE tool_names[1]
        NOT IN ('tool')), count(DISTINCT workflow_id) FROM calls""").fetchone()
    print(f"\nSWE-agent traces: first-tool alphabet over both sides: {dict(tools.most_common())}")
    print(f"train workflows with real tool names: {named[0]} of {named[1]}")
    timings = agent_timings(train_con, alphabet="tool")["swe_agent"]
    train = load_sequences(train_con, alphabet="tool")["swe_agent"]
    test = load_sequences(test_con, alphabet="tool")["swe_agent"]
    section = fit_sequences(train, timings)
    show("(a) SWE-agent, tool alphabet, all workflows", section,
         score_sequences(section, test).summary())
    has_names = [s for s in train if set(s.calls) != {"tool"}]
    has_names_test = [s for s in test if set(s.calls) != {"tool"}]
    if has_names and has_names_test:
        section = fit_sequences(has_names, timings)
        show(f"(a') SWE-agent, tool alphabet, only workflows with real tool names "
             f"({len(has_names)} train / {len(has_names_test)} test)", section,
             score_sequences(section, has_names_test).summary())
    agent_train = load_sequences(train_con)["swe_agent"]
    section = fit_sequences(agent_train, agent_timings(train_con)["swe_agent"])
    show("(a'') SWE-agent, agent alphabet (single agent 'main')", section,
         score_sequences(section, load_sequences(test_con)["swe_agent"]).summary())


def oracle_top1(spec: str, test_sequences, n_workflows: int, seed: int) -> tuple[float, float]:
    """Top-1 of the empirical best prefix predictor (prefix tree of many workflows)."""
    per_wf = defaultdict(list)
    for r in generate(spec, n_workflows, seed=seed + 1000):
        per_wf[r["workflow_id"]].append(CallRow(r["request_id"], r["agent_id"], r["t_arrival"],
                                                r["t_finish"], tuple(r.get("parent_request_ids")
                                                                     or ()) or None))
    big = [build_sequence(spec, wf, calls) for wf, calls in per_wf.items()]
    out = []
    for level in ("calls", "step_symbols"):
        tree = PFA.prefix_tree([getattr(s, level) for s in big])
        hit = total = 0
        for seq in test_sequences:
            symbols = getattr(seq, level)
            q = tree.initial
            for i in range(len(symbols) - 1):
                q = tree.trans[q].get(symbols[i]) if q is not None else None
                total += 1
                if q is not None and tree.counts[q]:
                    hit += max(tree.counts[q], key=tree.counts[q].get) == symbols[i + 1]
        out.append(hit / total)
    return out[0], out[1]


def generated(spec: str, work: Path, n: int, seed: int, oracle_n: int) -> None:
    logs = work / spec / "logs.jsonl"
    write_jsonl(generate(spec, n, seed=seed, with_text=True), logs)
    train_con, test_con = stores(logs, work / spec, seed)
    t = time.perf_counter()
    sections = build_workflows_section(train_con, {"prune": 0.05})
    fit_s = time.perf_counter() - t
    t = time.perf_counter()
    scores = evaluate_workflows({"workflows": sections}, test_con)
    eval_s = time.perf_counter() - t
    section = sections[spec]
    test = load_sequences(test_con)[spec]
    call_oracle, step_oracle = oracle_top1(spec, test, oracle_n, seed)
    pc = scores.get("prompt_composition") or {}
    paths = WorkflowPaths.from_section(section)
    first = test[0].calls[0]
    assert paths.advance(paths.start(), first) is not None
    per_call_us = 1e6 * min(timeit.repeat(
        lambda: paths.estimates(paths.advance(paths.start(), first)),
        number=20000, repeat=3)) / 20000
    extra = "\n".join([
        f"prefix oracle    : per call {call_oracle:.3f}, per step {step_oracle:.3f} "
        f"(prefix tree of {oracle_n} further workflows)",
        f"prompt templates : exact {fmt(pc.get('exact_share'))}, covered chars "
        f"{fmt(pc.get('covered_char_share'))} (n={pc.get('n_prompts')} held-out prompts)",
        f"session cost     : start+advance+estimates {per_call_us:.2f} µs per call",
        f"time             : fit {fit_s:.1f} s, eval {eval_s:.1f} s "
        f"(alpha={DEFAULT_ALPHA}, prune=0.05)",
    ])
    show(f"({'b' if spec == 'coding_assistant' else 'c'}) {spec}, {n} generated workflows",
         section, scores, extra)
    for agent, template in sorted(section.get("prompt_composition", {})
                                  .get("templates", {}).items()):
        shown = template if len(template) < 160 else template[:70] + " … " + template[-80:]
        print(f"  template {agent:11s}: {shown!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["swe", "coding_assistant", "deep_research"])
    ap.add_argument("--workflows", type=int, default=600, help="generated workflows per set")
    ap.add_argument("--oracle-workflows", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_synth_") as tmp:
        work = Path(tmp)
        if args.only in (None, "swe"):
            swe(work, args.seed)
        for spec in ("coding_assistant", "deep_research"):
            if args.only in (None, spec):
                generated(spec, work, args.workflows, args.seed, args.oracle_workflows)


if __name__ == "__main__":
    main()
