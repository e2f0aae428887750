"""Real-engine A/B: two SGLang replicas, one replayed workload, plain vs the project's hints.

    python bench/bench_engine.py [--seeds 0 1 2] [--workflows 12] [--concurrency 6] [--json]

Runs on this CPU-only machine (tiny local model, ``--load-format dummy``, the test stand-ins of
``tests/sglang/cpu_standins/``) or on a GPU machine (``--model-dir`` with a real ``config.json``
and tokenizer, e.g. an 8B Llama config with ``--load-format dummy``: realistic step times, no
weights; see docs/sglang.md). Two replicas with a small KV pool (``--pool-tokens``) so the
prefix cache is under pressure, and two set-ups, each fed the *same* replayed workload through
the project's gateway (``profiler replay``, closed loop, recorded gaps scaled by
``--time-scale``):

* **baseline** — plain SGLang at its defaults (LRU radix cache, no priority scheduling, plugin
  off) behind the gateway in ``--routing round-robin`` with no SGLang fields: round robin;
* **hints** — SGLang with the plugin (priority scheduling, ``--default-priority-value``, the
  ``workflow-retention`` backend) behind the gateway with ``--routing capacity`` and
  ``--sglang-fields`` (the profile's predictions as ``priority`` + ``custom_params``);
* with ``--ablation`` also **no-priority** — the same without ``--enable-priority-scheduling``
  (retention + capacity routing only), to tell the priority's share from the rest.

The workload is generated coding-assistant workflows (``profiler.workloads``): the profile is
fitted on one generated set and a disjoint set (other seed) is replayed, prompts and outputs
scaled by ``--token-scale`` in both (the profile must predict the lengths the replay sends). Per seed, both set-ups replay the same workflows after a cache flush; all four
replicas run from the start and the two set-ups alternate per seed, so background load on a
shared machine hits both alike. The table gives avg and P95 workflow JCT and the ratio
hints / baseline.
Not yet here: sglang-router's cache-aware policy as a second baseline, and the simulator's
figure for the same set-up (issue 13, item 4).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.sglang.real_server import SGLangServer, build_tiny_model  # noqa: E402  (launcher only)

PRIORITY_FLAGS = ["--enable-priority-scheduling", "--schedule-policy", "fcfs", "--default-priority-value", "250"]
RETENTION_FLAGS = ["--radix-cache-backend", "workflow-retention"]
#: set-up -> (server flags, plugin on, gateway with capacity routing + --sglang-fields)
SETUPS = {
    "baseline": ([], False, False),
    "hints": (PRIORITY_FLAGS + RETENTION_FLAGS, True, True),
    # ablation: everything but priority scheduling (SGLang ignores `priority` without the flag)
    "no-priority": (RETENTION_FLAGS, True, True),
}


def start_pair(model: Path, work: Path, name: str, pool: int, running: int) -> list[SGLangServer]:
    flags, plugin, _ = SETUPS[name]
    common = ["--max-total-tokens", str(pool), "--max-running-requests", str(running), "--enable-cache-report"]
    servers = []
    for i in range(2):
        srv = SGLangServer(model, work / f"{name}-{i}.log", extra_args=common + flags,
                           env={"AWP_SGLANG_PLUGIN": "1" if plugin else "0", "AWP_LOG_EVERY_S": "5"})
        srv.start()
        print(f"  {name} replica {i} ready in {srv.startup_s:.0f}s ({srv.url})", file=sys.stderr)
        servers.append(srv)
    return servers


@contextmanager
def gateway(urls: list[str], profile: Path, hints: bool, budget_s: float):
    """The project's gateway on a real port: round robin and no SGLang fields (baseline), or
    capacity routing + ``--sglang-fields`` (hints); predictions in process from ``profile``."""
    from prometheus_client import CollectorRegistry

    from serving_hooks.annotator import LocalAnnotator
    from serving_hooks.gateway import Gateway, GatewayOptions, create_gateway_app
    from serving_hooks.server_thread import serve_in_thread
    from serving_hooks.service import prediction_service
    from serving_hooks.upstreams import CapacityRouting, RoundRobinRouter

    registry = CollectorRegistry()
    service = prediction_service(profile, registry, "profiler_gateway")
    router = CapacityRouting(urls) if hints else RoundRobinRouter(urls)
    gw = Gateway(router, LocalAnnotator(service), options=GatewayOptions(sglang_fields=hints, budget_s=budget_s),
                 registry=registry, service=service)
    with serve_in_thread(create_gateway_app(gw), server_header=False, date_header=False) as srv:
        yield srv.url, registry


def run_setup(servers: list[SGLangServer], profile: Path, plan: list, hints: bool, seed: int,
              concurrency: int, time_scale: float, budget_s: float, tag: str = "") -> dict:
    from serving_hooks.replay import ReplayOptions, replay
    from serving_hooks.replay_report import summarize

    for s in servers:
        httpx.post(s.url + "/flush_cache", timeout=60, trust_env=False)
    with gateway([s.url for s in servers], profile, hints, budget_s) as (url, registry):
        result = replay(plan, url, ReplayOptions(concurrency=concurrency, time_scale=time_scale, seed=seed,
                                                 run_tag=f"{'h' if hints else 'b'}{seed}{tag}"))
        outcomes = {m.labels["outcome"]: int(m.value) for metric in registry.collect()
                    if metric.name == "profiler_gateway_annotate" for m in metric.samples
                    if m.name.endswith("_total")}
    summary = summarize(result)
    summary["annotate_outcomes"] = outcomes
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--workflows", type=int, default=16, help="workflows replayed per seed")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--time-scale", type=float, default=0.02)
    ap.add_argument("--token-scale", type=float, default=0.05)
    ap.add_argument("--pool-tokens", type=int, default=2500, help="KV pool of each replica")
    ap.add_argument("--max-running", type=int, default=2)
    ap.add_argument("--budget-ms", type=float, default=100.0,
                    help="gateway annotation budget (its default 5 ms is for an unloaded machine; here, "
                         "with 2 shared cores, most calls would go out unannotated)")
    ap.add_argument("--ablation", action="store_true",
                    help="also run 'no-priority': plugin + capacity routing without priority scheduling")
    ap.add_argument("--model-dir", type=Path, help="model folder (config.json + tokenizer); default: tiny local")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from profiler import fitting
    from profiler.workloads import generate, write_jsonl
    from serving_hooks.replay_plan import load_plan

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        model = args.model_dir or build_tiny_model(work / "model")
        # the profile learns the lengths the replay will really send (scaled), otherwise the
        # gateway's drift check sees every band missed and shadows the workflow type
        train = [{**r, "input_tokens": round(r["input_tokens"] * args.token_scale),
                  "output_tokens": max(1, round(r["output_tokens"] * args.token_scale))}
                 for r in generate("coding_assistant", 80, seed=1000)]
        write_jsonl(train, work / "train" / "ca.jsonl")
        fitting.fit_profile([work / "train"], work / "profile", options=fitting.FitOptions(min_calls=5))
        plans = {}
        for seed in args.seeds:
            write_jsonl(generate("coding_assistant", args.workflows, seed=seed), work / f"replay{seed}" / "ca.jsonl")
            plans[seed], _ = load_plan([work / f"replay{seed}"], token_scale=args.token_scale)
        names = ["baseline", "hints"] + (["no-priority"] if args.ablation else [])
        rows: dict[str, dict[int, dict]] = {n: {} for n in names}
        # both pairs up at once (an idle server sleeps), runs interleaved per seed, so a change
        # in the machine's background load hits both set-ups alike
        pairs = {}
        try:
            for name in names:
                pairs[name] = start_pair(model, work, name, args.pool_tokens, args.max_running)
            for seed in args.seeds:
                for name in (names if seed % 2 == 0 else names[::-1]):
                    rows[name][seed] = s = run_setup(pairs[name], work / "profile", plans[seed], SETUPS[name][2],
                                                     seed, args.concurrency, args.time_scale, args.budget_ms / 1000,
                                                     tag=name[:2])
                    print(f"  {name} seed {seed}: JCT avg {s['workflows']['jct_s']['avg']:.2f}s "
                          f"p95 {s['workflows']['jct_s']['p95']:.2f}s, errors {s['calls']['errors']}, "
                          f"cached {s['tokens']['cached_fraction'] or 0:.1%}, annotate {s['annotate_outcomes']}",
                          file=sys.stderr)
        finally:
            for name, servers in pairs.items():
                for srv in servers:
                    srv.stop()
                    counters = [l for l in srv.log_text().splitlines() if "plugin counters" in l]
                    if counters:
                        print(f"  {name} {srv.url}: {counters[-1].split('] ', 1)[-1]}", file=sys.stderr)

    out = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "seeds": {},
           "annotate_outcomes": {seed: rows["hints"][seed]["annotate_outcomes"] for seed in args.seeds}}
    for seed in args.seeds:
        b, h = rows["baseline"][seed], rows["hints"][seed]
        out["seeds"][seed] = {
            name: {"jct_avg_s": r["workflows"]["jct_s"]["avg"], "jct_p95_s": r["workflows"]["jct_s"]["p95"],
                   "errors": r["calls"]["errors"], "cached_fraction": r["tokens"]["cached_fraction"],
                   "calls": r["calls"]["count"]} for name, r in ((n, rows[n][seed]) for n in names)}
        out["seeds"][seed]["ratio_avg"] = h["workflows"]["jct_s"]["avg"] / b["workflows"]["jct_s"]["avg"]
        out["seeds"][seed]["ratio_p95"] = h["workflows"]["jct_s"]["p95"] / b["workflows"]["jct_s"]["p95"]
        if args.ablation:
            a = rows["no-priority"][seed]
            out["seeds"][seed]["ratio_avg_no_priority"] = a["workflows"]["jct_s"]["avg"] / b["workflows"]["jct_s"]["avg"]
            out["seeds"][seed]["ratio_p95_no_priority"] = a["workflows"]["jct_s"]["p95"] / b["workflows"]["jct_s"]["p95"]
    out["mean_ratio_avg"] = float(np.mean([v["ratio_avg"] for v in out["seeds"].values()]))
    out["mean_ratio_p95"] = float(np.mean([v["ratio_p95"] for v in out["seeds"].values()]))
    if args.ablation:
        for k in ("avg", "p95"):
            out[f"mean_ratio_{k}_no_priority"] = float(np.mean([v[f"ratio_{k}_no_priority"]
                                                               for v in out["seeds"].values()]))
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{'seed':>4} {'base avg':>9} {'base p95':>9} {'hint avg':>9} {'hint p95':>9} {'avg ratio':>9} "
          f"{'p95 ratio':>9} {'cached b/h':>12}")
    for seed, v in out["seeds"].items():
        b, h = v["baseline"], v["hints"]
        print(f"{seed:>4} {b['jct_avg_s']:>8.2f}s {b['jct_p95_s']:>8.2f}s {h['jct_avg_s']:>8.2f}s "
              f"{h['jct_p95_s']:>8.2f}s {v['ratio_avg']:>9.3f} {v['ratio_p95']:>9.3f} "
              f"{(b['cached_fraction'] or 0):>5.1%}/{(h['cached_fraction'] or 0):.1%}")
    print(f"mean ratio (hints / baseline): avg JCT {out['mean_ratio_avg']:.3f}, P95 JCT {out['mean_ratio_p95']:.3f}")
    if args.ablation:
        for seed, v in out["seeds"].items():
            a = v["no-priority"]
            print(f"  no-priority seed {seed}: avg {a['jct_avg_s']:.2f}s p95 {a['jct_p95_s']:.2f}s "
                  f"(ratios {v['ratio_avg_no_priority']:.3f} / {v['ratio_p95_no_priority']:.3f}), "
                  f"cached {(a['cached_fraction'] or 0):.1%}")
        print(f"mean ratio (no-priority / baseline): avg JCT {out['mean_ratio_avg_no_priority']:.3f}, "
              f"P95 JCT {out['mean_ratio_p95_no_priority']:.3f}")


if __name__ == "__main__":
    main()
