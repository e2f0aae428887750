"""Call by call: the simulator's replay of a stored real-engine run beside the engine's own records.

``python bench/engine_calls.py docs/measurements/engine-platform-contention-s9-2026-11-29.json
docs/measurements/engine-s9-2026-11-29-calls.tar.gz`` rebuilds the stored condition as
``bench/engine_resimulate.py`` does (the run's calibrated step time and limits, the same
workloads), replays every seed and arm in the current simulator, and sets its calls beside the
engine's records of the same run (``bench_engine.py --out`` keeps one JSONL per arm and seed).
Per arm it prints where the time goes apart:

* **wait + prefill** — first token − arrival (the engine's TTFT: queueing, admission, prefill);
* **decode** — (end − first token) per generated token after the first: the step time under the
  run's real batch and contention;
* **in flight** — Σ call latency ÷ the run's span (Little's law: how many calls the arm held at
  once, all replicas together), and the workflows' JCT with the share spent outside calls
  (tool gaps and the client);
* **cache** — prompt share served from cache, per call as the engine reported it
  (``cached_tokens``), and the prompt tokens as the engine counted them against the simulator's;
* **wait + prefill by group** — every simulated call matched to the engine's record of it, grouped
  (no simulated wait / simulated wait / host-tier hit / new tokens), the mean beside the 10th
  percentile: a prefill cost the simulator lacks (a load-back, a per-call overhead) shows in the
  fast calls of the groups it touches, a queue it lacks only in the mean.

``--fit-template`` instead fits the engine's chat template to the prompt counts of the run's
records (:func:`fit_template`): how the simulated replica's prompt sizes were measured.

Why: an arm's avg JCT can be off for many reasons (a queue that formed in one and not the
other, a step time that does not hold under load, the cache); the per-call split says which,
before a change to the simulator is tried.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine_resimulate import rebuild, simulated_runs  # noqa: E402
from bench.engine_sim import ChatTemplate, fit_chat_template, scaled_records  # noqa: E402
from simulator.engine import SimResult  # noqa: E402
from simulator.workload import renamed  # noqa: E402

FIELDS = ("calls", "wait_prefill_s", "decode_ms_per_token", "latency_s", "in_flight", "jct_avg_s",
          "outside_calls_share", "cached_share", "prompt_tokens")


def load_call_records(source: Path) -> dict[str, list[dict]]:
    """Every ``<condition>-<arm>-seed<N>.jsonl`` in ``source`` (a run's ``FILE-calls/`` folder, or a
    .tar.gz of such folders), keyed ``<folder>/<file name without .jsonl>``."""
    if source.is_dir():
        files = [(f"{p.parent.name}/{p.stem}", p.read_text()) for p in sorted(source.rglob("*.jsonl"))]
    else:
        with tarfile.open(source) as tar:
            files = [(f"{Path(m.name).parent.name}/{Path(m.name).stem}", tar.extractfile(m).read().decode())
                     for m in tar.getmembers() if m.isfile() and m.name.endswith(".jsonl")]
    out: dict[str, list[dict]] = {}
    for key, text in files:
        rows = []
        for i, line in enumerate(io.StringIO(text), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{source}: {key}.jsonl line {i}: not JSON ({e.msg})") from None
        out[key] = rows
    return out


def run_records(records: dict[str, list[dict]], out_file: str | None, name: str) -> list[dict]:
    """The records of run ``name`` (``<condition>-<arm>-seed<N>``): from the folder the run wrote
    (``<stem of its --out>-calls``) when there, else the only file of that name."""
    if out_file:
        key = f"{Path(out_file).stem}-calls/{name}"
        if key in records:
            return records[key]
    found = [k for k in records if k.rsplit("/", 1)[-1] == name]
    if len(found) != 1:
        raise ValueError(f"call records {name}.jsonl: {'none' if not found else 'several: ' + ', '.join(found)} "
                         f"(pass the run's own FILE-calls/ folder)")
    return records[found[0]]


def measured_split(records: list[dict]) -> dict:
    """The per-call split (see the module doc) of one engine run's call records."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("t_first_token") is not None]
    if not ok:
        raise ValueError("no successful call with a first token in the records")
    t0 = min(r["t_arrival"] for r in records)
    t1 = max(r["t_finish"] for r in records)
    lat = np.array([r["t_finish"] - r["t_arrival"] for r in ok])
    by_wf: dict[str, list[dict]] = {}
    for r in records:
        by_wf.setdefault(r["workflow_id"], []).append(r)
    jct = np.array([max(r["t_finish"] for r in rs) - min(r["t_arrival"] for r in rs) for rs in by_wf.values()])
    in_calls = np.array([_union([(r["t_arrival"], r["t_finish"]) for r in rs]) for rs in by_wf.values()])
    dec = [(r["t_finish"] - r["t_first_token"]) / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1]
    prompt = sum(r["input_tokens"] for r in ok)
    return {"calls": len(ok), "wait_prefill_s": float(np.mean([r["t_first_token"] - r["t_arrival"] for r in ok])),
            "decode_ms_per_token": 1e3 * float(np.mean(dec)), "latency_s": float(lat.mean()),
            "in_flight": float(lat.sum() / (t1 - t0)), "jct_avg_s": float(jct.mean()),
            "outside_calls_share": float(1 - in_calls.sum() / jct.sum()),
            "cached_share": sum(r.get("cached_tokens") or 0 for r in ok) / max(prompt, 1), "prompt_tokens": prompt}


def simulated_split(res: SimResult) -> dict:
    """The same split of one simulated run (every request, times from the simulator's clock)."""
    reqs = [q for q in res.requests if q is not None]
    lat = np.array([q.t_finish - q.t_issue for q in reqs])
    t0, t1 = min(q.t_issue for q in reqs), max(q.t_finish for q in reqs)
    by_wf: dict[int, list] = {}
    for q in reqs:
        by_wf.setdefault(q.wf, []).append(q)
    jct = res.wf_finish - res.wf_arrival
    in_calls = np.array([_union([(q.t_issue, q.t_finish) for q in by_wf[w]]) for w in range(len(jct))])
    dec = [(q.t_finish - q.t_first) / (q.output_tokens - 1) for q in reqs if q.output_tokens > 1]
    prompt = sum(q.input_tokens for q in reqs)
    per_replica = np.bincount([q.replica for q in reqs], minlength=res.config.replicas)
    return {"calls": len(reqs), "wait_prefill_s": float(np.mean([q.t_first - q.t_issue for q in reqs])),
            "decode_ms_per_token": 1e3 * float(np.mean(dec)), "latency_s": float(lat.mean()),
            "in_flight": float(lat.sum() / (t1 - t0)), "jct_avg_s": float(np.mean(jct)),
            "outside_calls_share": float(1 - in_calls.sum() / jct.sum()),
            "cached_share": sum(q.gpu_hit + q.host_hit for q in reqs) / max(prompt, 1), "prompt_tokens": prompt,
            "calls_per_replica": per_replica.tolist(),
            "busy_share_per_replica": [round(b / res.makespan_s, 3) for b in res.replica_busy_s]}


def matched_calls(records: list[dict], res: SimResult) -> list[dict]:
    """Each simulated call beside the engine's record of the same call (the bench appends
    ``-<arm><seed>`` to the replay's request id): the first-token time on both sides, the
    simulated wait before admission and the prompt tokens the simulator computed (not cached)."""
    by_id = {r["request_id"].rsplit("-", 1)[0]: r for r in records
             if r.get("status") == "ok" and r.get("t_first_token") is not None}
    out = []
    for q in res.requests:
        r = None if q is None else by_id.get(q.call.request_id)
        if r is not None:
            out.append({"measured_s": r["t_first_token"] - r["t_arrival"], "simulated_s": q.t_first - q.t_issue,
                        "simulated_wait_s": q.t_admit - q.t_issue, "new_tokens": q.input_tokens - q.gpu_hit - q.host_hit,
                        "host_hit": q.host_hit})
    return out


#: groups of :func:`first_token_groups`: (label, test on a matched call)
FIRST_TOKEN_GROUPS = (
    ("no simulated wait", lambda c: c["simulated_wait_s"] < 1e-3),
    ("simulated wait", lambda c: c["simulated_wait_s"] >= 1e-3),
    ("host-tier hit", lambda c: c["host_hit"] > 0),
    ("new tokens < 100", lambda c: c["new_tokens"] < 100),
    ("new tokens 100-299", lambda c: 100 <= c["new_tokens"] < 300),
    ("new tokens >= 300", lambda c: c["new_tokens"] >= 300),
)


def first_token_groups(calls: list[dict]) -> dict[str, dict]:
    """Wait + prefill per group of matched calls, measured and simulated: the mean (queueing
    included) and the 10th percentile (a call that met no queue: the prefill itself). A prefill
    cost the simulator lacks (HiCache's load-back, a per-call overhead) shows in the 10th
    percentile of the groups it touches; a queue it lacks only in the mean."""
    out = {}
    for label, test in FIRST_TOKEN_GROUPS:
        sel = [c for c in calls if test(c)]
        if sel:
            m = np.array([c["measured_s"] for c in sel])
            s = np.array([c["simulated_s"] for c in sel])
            out[label] = {"calls": len(sel), "measured_mean_s": float(m.mean()), "simulated_mean_s": float(s.mean()),
                          "measured_p10_s": float(np.percentile(m, 10)), "simulated_p10_s": float(np.percentile(s, 10))}
    return out


def _union(spans: list[tuple[float, float]]) -> float:
    """Length of the union of the time spans (a workflow's time with at least one call out)."""
    total, end = 0.0, -np.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def compare_condition(cond: dict, records: dict[str, list[dict]], seeds: list[int] | None = None,
                      shared_compute: bool = True) -> dict:
    """Per arm and seed the measured and simulated splits of ``cond``, and per arm their means
    (``shared_compute`` False: the replicas simulated as if each had the host to itself)."""
    st = cond["settings"]
    runs, names, seeds = simulated_runs(cond, only=seeds, shared_compute=shared_compute)
    out: dict = {"seeds": {}, "arms": {}, "first_token": {}}
    matched: dict[str, list[dict]] = {}
    for s in seeds:
        row = out["seeds"][s] = {}
        for arm in names:
            mine = run_records(records, st.get("out"), f"{st['condition']}-{arm}-seed{s}")
            row[arm] = {"measured": measured_split(mine), "simulated": simulated_split(runs[s][arm])}
            matched.setdefault(arm, []).extend(matched_calls(mine, runs[s][arm]))
    for arm in names:
        out["arms"][arm] = {side: {f: float(np.mean([out["seeds"][s][arm][side][f] for s in seeds])) for f in FIELDS}
                            for side in ("measured", "simulated")}
        out["first_token"][arm] = first_token_groups(matched.get(arm, []))
    return out


def fit_template(cond: dict, records: dict[str, list[dict]], seeds: list[int] | None = None,
                 arm: str | None = None) -> ChatTemplate:
    """The chat template (:func:`bench.engine_sim.fit_chat_template`) that reproduces the prompt
    counts the engine reported in the stored run ``cond`` (arm ``arm``, default the first, on
    ``seeds``, default all): the replay's plan of every seed (its ids prefixed by the seed, as two
    seeds may replay one workflow) beside that arm's call records."""
    st, names, seeds, _, wl = rebuild(cond, seeds=seeds)
    arm = arm or names[0]
    plan: list[dict] = []
    replayed: list[dict] = []
    for s in seeds:
        def tag(rid: str, s: int = s) -> str:
            return f"s{s}/{rid}"
        plan += [renamed(r, tag) for r in scaled_records(wl.replay[s], 1.0, st["time_scale"])]
        replayed += [dict(r, request_id=tag(r["request_id"]))
                     for r in run_records(records, st.get("out"), f"{st['condition']}-{arm}-seed{s}")]
    return fit_chat_template(plan, replayed)


def render(name: str, cmp: dict) -> str:
    """The comparison as text: per arm, measured / simulated / error for every field."""
    lines = [f"== {name}: per call, measured (engine records) vs simulated, mean over {len(cmp['seeds'])} seeds"]
    lines.append(f"{'arm':>12} {'field':>22} {'measured':>10} {'simulated':>10} {'sim/meas':>9}")
    for arm, sides in cmp["arms"].items():
        for f in FIELDS:
            m, s = sides["measured"][f], sides["simulated"][f]
            lines.append(f"{arm:>12} {f:>22} {m:>10.3f} {s:>10.3f} {s / m if m else float('nan'):>9.2f}")
        per = [cmp["seeds"][k][arm]["simulated"]["calls_per_replica"] for k in cmp["seeds"]]
        lines.append(f"{arm:>12} {'sim calls per replica':>22} {per}")
        for label, g in cmp.get("first_token", {}).get(arm, {}).items():
            lines.append(f"{arm:>12} {'wait+prefill, ' + label:>38}: {g['calls']:>5} calls, mean "
                         f"{g['measured_mean_s']:.3f} / {g['simulated_mean_s']:.3f} s, p10 "
                         f"{g['measured_p10_s']:.3f} / {g['simulated_p10_s']:.3f} s (measured / simulated)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("measurement", type=Path, help="a bench_engine.py --out JSON with its simulator section")
    ap.add_argument("calls", type=Path, help="that run's call records: its FILE-calls/ folder, or a .tar.gz of it")
    ap.add_argument("--condition", nargs="+", help="only these conditions (default: every one with a simulator)")
    ap.add_argument("--seeds", nargs="+", type=int, help="only these seeds (default: all the run's)")
    ap.add_argument("--out", type=Path, help="write every seed's and arm's split here (JSON)")
    ap.add_argument("--fit-template", action="store_true",
                    help="instead of the comparison: fit the engine's chat template (tokens per message, "
                         "reply words per token) to the prompt counts in the run's records and print it: "
                         "how bench/engine_sim.CHATML was measured")
    ap.add_argument("--no-shared-compute", action="store_true",
                    help="simulate each replica with the host to itself (the run's replicas shared its cores): "
                         "shows how much of an arm's simulated time is the sharing model's")
    a = ap.parse_args(argv)
    data = json.loads(a.measurement.read_text())
    records = load_call_records(a.calls)
    out = {}
    for name, cond in data["conditions"].items():
        if "simulator" not in cond or (a.condition and name not in a.condition):
            continue
        if a.fit_template:
            tpl = fit_template(cond, records, a.seeds)
            out[name] = tpl.__dict__
            print(f"== {name}: chat template {tpl.msg_tokens} tokens per message, {tpl.gen_tokens} of generation "
                  f"prompt, {tpl.reply_words} reply words per token ({tpl.source})")
            continue
        out[name] = compare_condition(cond, records, a.seeds, not a.no_shared_compute)
        print(render(name, out[name]))
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
