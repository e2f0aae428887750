"""Real-engine A/B: two SGLang replicas, one replayed workload, three fronts, and the simulator.

    python bench/bench_engine.py --seeds 0 1 2                 # CPU: tiny local model
    python bench/bench_engine.py --gpu --model-config llama-8b  # GPU: 8B Llama shape, no weights

Two replicas with a small KV pool (``--pool-tokens``, memory pressure on the prefix cache), the
*same* replayed workload (``profiler replay``: closed loop, ``--concurrency`` workflows in flight,
recorded gaps × ``--time-scale``, lengths × ``--token-scale``) through three fronts, side by side:

* **round-robin** — plain SGLang at its defaults (LRU radix cache, FCFS, plugin off) behind the
  project's gateway in ``--routing round-robin`` without SGLang fields;
* **router** — the same plain replicas behind the real ``sglang-router`` (PyPI
  ``sglang-router``, Rust) at its defaults — the ``cache_aware`` policy, started as its README
  does (``python -m sglang_router.launch_router --worker-urls …``; :mod:`bench.engine_router`);
  a fresh router per run, so its prefix tree starts empty like the flushed engines;
* **hints** — SGLang as docs/sglang.md deploys it: the project's plugin (``AWP_SGLANG_PLUGIN=1``),
  priority scheduling with ``--default-priority-value 250``, preemption threshold
  ``--preemption-threshold`` (500), ``--retraction-policy priority``, the ``workflow-retention``
  backend and HiCache with a host tier (``--hicache-ratio 2``, write-back: the plugin's prefetch
  stages there) — behind the gateway with ``--routing capacity`` and ``--sglang-fields`` (the
  profile's predictions as ``priority`` + ``custom_params``), the profile fitted on the replay's
  clock (gaps × ``--time-scale``, :func:`serving_hooks.replay_plan.on_replay_clock`);
* with ``--ablation`` also **no-priority** — hints without ``--enable-priority-scheduling``.

The workload is generated coding-assistant workflows: the profile is fitted on one generated set
and disjoint sets (other seeds) are replayed, lengths scaled by ``--token-scale`` in both. Per
seed every set-up replays the same workflows after a cache flush; on CPU all replica pairs run
from the start and the set-ups rotate their order per seed, so background load hits all alike
(on ``--gpu`` one pair at a time, to fit one GPU). Then the **simulator** (:mod:`bench.engine_sim`),
calibrated to these replicas from a calibration replay (step-time constants fitted on its call
records) and configured from the servers' own start-up line (KV pool, chunk, running cap),
replays the same trace under the matching policies; the table prints the simulated ratio next
to the measured one.

``--gpu`` (untested here: written on a CPU-only machine): the ``llama-8b`` model folder
(:mod:`bench.engine_models`, ``--load-format dummy``, bfloat16, no download), replicas placed on
the visible GPUs in turn, ``--mem-fraction-static`` split between replicas sharing a GPU, and
GPU-sized defaults (pool, running cap, scales, workflows) where not given.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.engine_models import MODEL_CONFIGS, write_model  # noqa: E402
from bench.engine_router import SGLangRouter, router_available  # noqa: E402
from tests.sglang.real_server import SGLangServer, free_port  # noqa: E402  (launcher only)

#: The hints replicas as docs/sglang.md deploys them (flag names from SGLang 0.5.23's
#: ``arg_groups/fields/schedule.py``): preemption only across a real priority gap (SGLang's
#: default threshold is 10 on the gateway's 0-2,000 scale, so nearly any aging difference
#: preempted and re-prefilled a running call; ``--preemption-threshold`` sets it) and retraction
#: of the lowest priority first when the KV pool is full (default ``length``).
PRIORITY_FLAGS = ["--enable-priority-scheduling", "--schedule-policy", "fcfs", "--default-priority-value", "250",
                  "--retraction-policy", "priority"]
RETENTION_FLAGS = ["--radix-cache-backend", "workflow-retention"]
#: HiCache with a host tier twice the device pool, so the plugin's prefetch has somewhere to stage
HICACHE_FLAGS = ["--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-write-policy", "write_back"]
#: on CPU: the IO backend and layout the test stand-ins patch (tests/sglang/cpu_standins), as
#: tests/sglang/test_real_server.py runs HiCache
HICACHE_CPU_FLAGS = ["--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first"]
#: replica pair -> (server flags, plugin on)
PAIRS = {
    "plain": ([], False),
    "hints": (PRIORITY_FLAGS + RETENTION_FLAGS + HICACHE_FLAGS, True),
    # ablation: everything but priority scheduling (SGLang ignores `priority` without the flag)
    "no-priority": (RETENTION_FLAGS + HICACHE_FLAGS, True),
}
#: set-up -> (replica pair, front: gateway round robin | sglang-router | gateway with hints)
SETUPS = {
    "round-robin": ("plain", "gateway-rr"),
    "router": ("plain", "sglang-router"),
    "hints": ("hints", "gateway-hints"),
    "no-priority": ("no-priority", "gateway-hints"),
}
#: defaults per machine: CPU (tiny model, 2 shared cores) and GPU (8B Llama shape, one H100-class GPU)
DEFAULTS = {
    "cpu": {"model_config": "tiny", "workflows": 16, "concurrency": 8, "time_scale": 0.02, "token_scale": 0.05,
            "pool_tokens": 2500, "max_running": 2, "budget_ms": 100.0, "calib_workflows": 4},
    "gpu": {"model_config": "llama-8b", "workflows": 48, "concurrency": 24, "time_scale": 0.02,
            "token_scale": 0.25, "pool_tokens": 30000, "max_running": 16, "budget_ms": 20.0,
            "calib_workflows": 6},
}


class BenchServer(SGLangServer):
    """The tests' launcher with the bench's dtype and, on GPU, a GPU id and memory share."""

    def __init__(self, *a, dtype: str = "float32", gpu_id: int | None = None,
                 mem_fraction: float | None = None, **kw) -> None:
        super().__init__(*a, **kw)
        self.dtype, self.gpu_id, self.mem_fraction = dtype, gpu_id, mem_fraction

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("--dtype") + 1] = self.dtype
        if self.gpu_id is not None:
            cmd += ["--base-gpu-id", str(self.gpu_id)]
        if self.mem_fraction is not None:
            cmd += ["--mem-fraction-static", f"{self.mem_fraction:.3f}"]
        return cmd


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def start_pair(model: Path, work: Path, pair: str, args: argparse.Namespace) -> list[SGLangServer]:
    flags, plugin = PAIRS[pair]
    flags = list(flags)
    if "--enable-priority-scheduling" in flags:
        flags += ["--priority-scheduling-preemption-threshold", str(args.preemption_threshold)]
    if "--enable-hierarchical-cache" in flags and not args.gpu:
        flags += HICACHE_CPU_FLAGS
    common = ["--max-total-tokens", str(args.pool_tokens), "--max-running-requests", str(args.max_running),
              "--enable-cache-report"]
    servers = []
    n_gpu = gpu_count() if args.gpu else 0
    for i in range(2):
        kw: dict = {"dtype": "float32"}
        if args.gpu:
            per_gpu = math.ceil(2 / n_gpu)
            kw = {"dtype": "bfloat16", "gpu_id": i % n_gpu, "mem_fraction": 0.85 / per_gpu}
        srv = BenchServer(model, work / f"{pair}-{i}.log", extra_args=common + flags,
                          env={"AWP_SGLANG_PLUGIN": "1" if plugin else "0", "AWP_LOG_EVERY_S": "5"}, **kw)
        srv.start(timeout_s=900 if args.gpu else 420)
        print(f"  {pair} replica {i} ready in {srv.startup_s:.0f}s ({srv.url})", file=sys.stderr)
        servers.append(srv)
    return servers


@contextmanager
def front(kind: str, urls: list[str], profile: Path, budget_s: float, log: Path):
    """The front the replay talks to: ``(url, registry or None)``."""
    if kind == "sglang-router":
        with SGLangRouter(urls, free_port(), log) as router:
            yield router.url, None
        return
    from prometheus_client import CollectorRegistry

    from serving_hooks.annotator import LocalAnnotator
    from serving_hooks.gateway import Gateway, GatewayOptions, create_gateway_app
    from serving_hooks.server_thread import serve_in_thread
    from serving_hooks.service import prediction_service
    from serving_hooks.upstreams import CapacityRouting, RoundRobinRouter

    hints = kind == "gateway-hints"
    registry = CollectorRegistry()
    service = prediction_service(profile, registry, "profiler_gateway")
    router = CapacityRouting(urls) if hints else RoundRobinRouter(urls)
    gw = Gateway(router, LocalAnnotator(service), options=GatewayOptions(sglang_fields=hints, budget_s=budget_s),
                 registry=registry, service=service)
    with serve_in_thread(create_gateway_app(gw), server_header=False, date_header=False) as srv:
        yield srv.url, registry


def flush(servers: list[SGLangServer]) -> None:
    for s in servers:
        httpx.post(s.url + "/flush_cache", timeout=60, trust_env=False)


def run_setup(name: str, servers: list[SGLangServer], profile: Path, plan: list, seed: int,
              args: argparse.Namespace, work: Path) -> dict:
    from serving_hooks.replay import ReplayOptions, replay
    from serving_hooks.replay_report import summarize

    flush(servers)
    kind = SETUPS[name][1]
    done = [0]
    total = sum(len(wf.calls) for wf in plan)

    def tick(_call) -> None:
        done[0] += 1
        if sys.stderr.isatty():
            print(f"\r    {name} seed {seed}: {done[0]}/{total} calls", end="", file=sys.stderr, flush=True)

    with front(kind, [s.url for s in servers], profile, args.budget_ms / 1000, work / "router.log") as (url, registry):
        result = replay(plan, url, ReplayOptions(concurrency=args.concurrency, time_scale=args.time_scale, seed=seed,
                                                 run_tag=f"{name[:2]}{seed}"), on_call=tick)
        outcomes = ({m.labels["outcome"]: int(m.value) for metric in registry.collect()
                     if metric.name == "profiler_gateway_annotate" for m in metric.samples
                     if m.name.endswith("_total")} if registry is not None else {})
    if sys.stderr.isatty():
        print("\r", end="", file=sys.stderr)
    summary = summarize(result)
    summary["annotate_outcomes"] = outcomes
    return summary


def engine_counters(log_text: str) -> dict:
    """What one replica's log says about the run: the plugin's last counters line (cumulative:
    ``requeued_preempted``/``requeued_retracted`` are the re-prefills of preempted and retracted
    calls, ``prefetch_*`` the host staging), the plugin's on/off line, and SGLang's own
    retractions (``KV cache pool is full. Retract requests. #retracted_reqs: N``)."""
    out: dict = {"plugin": "on" if "agent-workflow plugin on" in log_text else
                 "off" if "agent-workflow plugin off" in log_text else "unknown"}
    lines = [l for l in log_text.splitlines() if "agent-workflow plugin counters:" in l]
    if lines:
        out["plugin_counters"] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", lines[-1].split("counters:", 1)[1])}
    out["sglang_retracted_reqs"] = sum(int(n) for n in re.findall(r"#retracted_reqs: (\d+)", log_text))
    return out


def calibration_records(servers: list[SGLangServer], plan: list, args: argparse.Namespace) -> list[dict]:
    """Replay ``plan`` straight to one plain replica, one workflow at a time then two: the call
    records the simulator's step time is fitted on."""
    from serving_hooks.replay import ReplayOptions, replay
    from serving_hooks.replay_report import call_records

    recs: list[dict] = []
    for conc in (1, 2):
        flush(servers)
        res = replay(plan, servers[0].url, ReplayOptions(concurrency=conc, time_scale=args.time_scale, seed=conc,
                                                        run_tag=f"cal{conc}"))
        recs += call_records(res)
    flush(servers)
    return recs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--workflows", type=int, help="workflows replayed per seed (CPU 16, GPU 48)")
    ap.add_argument("--concurrency", type=int, help="workflows in flight (CPU 8, GPU 24)")
    ap.add_argument("--time-scale", type=float, help="× recorded tool/think gaps (0.02)")
    ap.add_argument("--token-scale", type=float, help="× recorded prompt and output lengths (CPU 0.05, GPU 0.25)")
    ap.add_argument("--pool-tokens", type=int, help="KV pool of each replica (CPU 2500, GPU 30000)")
    ap.add_argument("--max-running", type=int, help="--max-running-requests of each replica (CPU 2, GPU 16)")
    ap.add_argument("--preemption-threshold", type=int, default=500,
                    help="--priority-scheduling-preemption-threshold of the hints replicas (docs/sglang.md: 500 "
                         "on the gateway's 0-2,000 priority scale; SGLang's default is 10)")
    ap.add_argument("--budget-ms", type=float,
                    help="gateway annotation budget (CPU 100: its default 5 ms is for an unloaded machine; "
                         "with 2 shared cores most calls would go out unannotated; GPU 20)")
    ap.add_argument("--setups", nargs="+", default=["round-robin", "router", "hints"], choices=list(SETUPS),
                    help="set-ups to run (default: round-robin router hints)")
    ap.add_argument("--ablation", action="store_true", help="also run 'no-priority'")
    ap.add_argument("--calib-workflows", type=int, help="workflows of the calibration replay (CPU 4, GPU 6)")
    ap.add_argument("--no-sim", action="store_true", help="skip the calibration replay and the simulator")
    ap.add_argument("--gpu", action="store_true", help="GPU machine: bfloat16, llama-8b shape, GPU defaults")
    ap.add_argument("--model-config", choices=MODEL_CONFIGS, help="model folder written here (CPU tiny, GPU llama-8b)")
    ap.add_argument("--model-dir", type=Path, help="an existing model folder (config.json + tokenizer) instead")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    for k, v in DEFAULTS["gpu" if args.gpu else "cpu"].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.ablation and "no-priority" not in args.setups:
        args.setups.append("no-priority")
    if "router" in args.setups and not router_available():
        ap.error("the 'router' set-up needs sglang-router: pip install -e '.[bench]'")
    if args.gpu and gpu_count() == 0:
        ap.error("--gpu: no CUDA device visible (torch.cuda.is_available() is False)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from fitting import profile_fit as fitting
    from store.workloads import generate, write_jsonl
    from serving_hooks.replay_plan import load_plan, on_replay_clock

    names = list(dict.fromkeys(args.setups))
    pairs_needed = list(dict.fromkeys(SETUPS[n][0] for n in names))
    runs = [(seed, name) for i, seed in enumerate(args.seeds)
            for name in names[i % len(names):] + names[:i % len(names)]]
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = args.model_dir or write_model(work / "model", args.model_config)
        # the profile learns the lengths the replay will really send (scaled), otherwise the
        # gateway's drift check sees every band missed and shadows the workflow type
        # ... and on the replay's clock (gaps x --time-scale): fitted on recorded times its TTLs
        # and ages would be 1/time-scale too long for the replayed traffic (serving_hooks.replay_plan)
        train = on_replay_clock([{**r, "input_tokens": round(r["input_tokens"] * args.token_scale),
                                  "output_tokens": max(1, round(r["output_tokens"] * args.token_scale))}
                                 for r in generate("coding_assistant", 80, seed=1000)], args.time_scale)
        write_jsonl(train, work / "train" / "ca.jsonl")
        fitting.fit_profile([work / "train"], work / "profile", options=fitting.FitOptions(min_calls=5))
        plans, raw = {}, {}
        for seed in args.seeds:
            raw[seed] = list(generate("coding_assistant", args.workflows, seed=seed))
            write_jsonl(raw[seed], work / f"replay{seed}" / "ca.jsonl")
            plans[seed], _ = load_plan([work / f"replay{seed}"], token_scale=args.token_scale)
        calib_plan = None
        if not args.no_sim:
            write_jsonl(generate("coding_assistant", args.calib_workflows, seed=900), work / "calib" / "ca.jsonl")
            calib_plan, _ = load_plan([work / "calib"], token_scale=args.token_scale)

        rows: dict[str, dict[int, dict]] = {n: {} for n in names}
        engine: dict[str, list[dict]] = {p: [] for p in PAIRS}   # per replica, over the whole run
        calib: list[dict] = []
        limits_log = ""
        k = [0]

        def do_runs(pair_servers: dict[str, list[SGLangServer]], todo: list[tuple[int, str]]) -> None:
            for seed, name in todo:
                k[0] += 1
                rows[name][seed] = s = run_setup(name, pair_servers[SETUPS[name][0]], work / "profile",
                                                 plans[seed], seed, args, work)
                elapsed = time.monotonic() - t_start
                print(f"  [{k[0]}/{len(runs)}] {name} seed {seed}: JCT avg {s['workflows']['jct_s']['avg']:.2f}s "
                      f"p95 {s['workflows']['jct_s']['p95']:.2f}s, errors {s['calls']['errors']}, "
                      f"cached {s['tokens']['cached_fraction'] or 0:.1%}"
                      + (f", annotate {s['annotate_outcomes']}" if s["annotate_outcomes"] else "")
                      + f"  ({elapsed / 60:.1f} min elapsed)", file=sys.stderr)

        def stop_all(pairs: dict[str, list[SGLangServer]]) -> None:
            for pair, servers in pairs.items():
                for srv in servers:
                    srv.stop()
                    engine[pair].append(engine_counters(srv.log_text()))
                    print(f"  {pair} {srv.url}: {engine[pair][-1]}", file=sys.stderr)

        def with_pairs(wanted: list[str], todo: list[tuple[int, str]]) -> None:
            nonlocal calib, limits_log
            pairs: dict[str, list[SGLangServer]] = {}
            try:
                for pair in wanted:
                    pairs[pair] = start_pair(model, work, pair, args)
                if "plain" in pairs and calib_plan is not None and not calib:
                    print("  calibration replay (one plain replica, 1 then 2 workflows in flight)", file=sys.stderr)
                    calib = calibration_records(pairs["plain"], calib_plan, args)
                    limits_log = pairs["plain"][0].log_text()
                do_runs(pairs, todo)
            finally:
                stop_all(pairs)

        if args.gpu:        # one pair at a time: two 8B replicas fill one GPU
            for pair in (["plain"] if calib_plan is not None and "plain" not in pairs_needed else []) + pairs_needed:
                with_pairs([pair], [(s, n) for s, n in runs if SETUPS[n][0] == pair])
        else:               # every pair up at once, set-ups interleaved per seed
            with_pairs(list(dict.fromkeys((["plain"] if calib_plan is not None else []) + pairs_needed)), runs)

        out = build_output(args, names, rows)
        out["engine_counters"] = {p: v for p, v in engine.items() if v}
        if calib_plan is not None:
            out["simulator"] = simulate(args, names, raw, calib, limits_log, work / "profile")
    print_report(out, args, names)
    for pair, reps in out.get("engine_counters", {}).items():
        c = [r.get("plugin_counters", {}) for r in reps]
        print(f"{pair} replicas: plugin {'/'.join(r['plugin'] for r in reps)}; re-prefills preempted "
              f"{[x.get('requeued_preempted', 0) for x in c]} retracted (plugin) "
              f"{[x.get('requeued_retracted', 0) for x in c]} (SGLang log) {[r['sglang_retracted_reqs'] for r in reps]}; "
              f"prefetch planned {[x.get('prefetch_planned', 0) for x in c]} skipped for no host tier "
              f"{[x.get('prefetch_skipped_no_host_tier', 0) for x in c]}", file=sys.stderr)


def build_output(args: argparse.Namespace, names: list[str], rows: dict[str, dict[int, dict]]) -> dict:
    out: dict = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "seeds": {}}
    for seed in args.seeds:
        out["seeds"][seed] = {
            name: {"jct_avg_s": r["workflows"]["jct_s"]["avg"], "jct_p95_s": r["workflows"]["jct_s"]["p95"],
                   "errors": r["calls"]["errors"], "cached_fraction": r["tokens"]["cached_fraction"],
                   "calls": r["calls"]["count"], "annotate_outcomes": r["annotate_outcomes"]}
            for name, r in ((n, rows[n][seed]) for n in names)}
    out["ratios"] = ratios({s: v for s, v in out["seeds"].items()}, names)
    return out


def ratios(per_seed: dict[int, dict[str, dict]], names: list[str]) -> dict[str, dict]:
    """Per treatment (hints, no-priority) and baseline (round-robin, router): JCT ratio
    treatment / baseline per seed and the mean over seeds, for avg and P95 JCT."""
    out: dict[str, dict] = {}
    for treat in (n for n in names if n in ("hints", "no-priority")):
        for base in (n for n in names if n in ("round-robin", "router")):
            r = {"avg": [], "p95": []}
            for v in per_seed.values():
                r["avg"].append(v[treat]["jct_avg_s"] / v[base]["jct_avg_s"])
                r["p95"].append(v[treat]["jct_p95_s"] / v[base]["jct_p95_s"])
            out[f"{treat}/{base}"] = {"avg": r["avg"], "p95": r["p95"], "mean_avg": float(np.mean(r["avg"])),
                                      "mean_p95": float(np.mean(r["p95"]))}
    return out


def simulate(args: argparse.Namespace, names: list[str], raw: dict[int, list[dict]], calib: list[dict],
             limits_log: str, profile: Path) -> dict:
    """Calibrate on the calibration replay, then simulate every seed's trace (see bench.engine_sim)."""
    from bench.engine_sim import calibrate, cluster, scaled_records, server_limits, simulate_setups

    step = calibrate(calib, source=f"calibration replay on SGLang ({len(calib)} calls)")
    limits = server_limits(limits_log)
    cfg = cluster(limits, step)
    print(f"  simulator: decode step t0={step.t0 * 1e3:.2f} ms + c={step.c:.3g} s per KV token; prefill "
          f"p0={step.prefill_t0 * 1e3:.1f} ms + a={step.a * 1e3:.3f} ms/token + a_ctx={step.a_ctx * 1e3:.4f} ms/token "
          f"(MdAPE prefill {step.prefill_mdape:.2f} on {step.n_prefill} calls, decode {step.decode_mdape:.2f} "
          f"on {step.n_decode}); {limits}", file=sys.stderr)
    seeds = {seed: simulate_setups(scaled_records(raw[seed], args.token_scale, args.time_scale), profile, cfg,
                                   args.concurrency, names, preemption_threshold=args.preemption_threshold)
             for seed in args.seeds}
    return {"step": step.to_dict(), "limits": limits, "seeds": seeds, "ratios": ratios(seeds, names)}


def print_report(out: dict, args: argparse.Namespace, names: list[str]) -> None:
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return
    short = {"round-robin": "RR", "router": "router", "hints": "hints", "no-priority": "no-prio"}
    head = f"{'seed':>4} " + " ".join(f"{short[n] + ' avg':>11} {short[n] + ' p95':>11}" for n in names)
    print("measured JCT (s) and prompt share served from cache")
    print(head + "   cached " + "/".join(short[n] for n in names))
    for seed, v in out["seeds"].items():
        print(f"{seed:>4} " + " ".join(f"{v[n]['jct_avg_s']:>11.2f} {v[n]['jct_p95_s']:>11.2f}" for n in names)
              + "   " + "/".join(f"{(v[n]['cached_fraction'] or 0):.0%}" for n in names)
              + (f"   errors {sum(v[n]['errors'] for n in names)}" if any(v[n]['errors'] for n in names) else ""))
    sim = out.get("simulator")
    if sim:
        print("simulated JCT (s), same trace, calibrated step time")
        for seed, v in sim["seeds"].items():
            print(f"{seed:>4} " + " ".join(f"{v[n]['jct_avg_s']:>11.2f} {v[n]['jct_p95_s']:>11.2f}" for n in names)
                  + "   " + "/".join(f"{v[n]['cached_fraction']:.0%}" for n in names))
    if not out["ratios"]:
        return
    print(f"\n{'ratio (mean over ' + str(len(args.seeds)) + ' seeds)':<34} {'measured avg':>12} {'(seed range)':>13} "
          f"{'measured p95':>12}" + (f" {'simulated avg':>13} {'simulated p95':>13}" if sim else ""))
    for key, r in out["ratios"].items():
        spread = f"({min(r['avg']):.2f}-{max(r['avg']):.2f})"
        line = f"{key:<34} {r['mean_avg']:>12.3f} {spread:>13} {r['mean_p95']:>12.3f}"
        if sim:
            s = sim["ratios"][key]
            line += f" {s['mean_avg']:>13.3f} {s['mean_p95']:>13.3f}"
        print(line)
    print("(ratio < 1: the treatment's JCT is shorter than the baseline's)")


if __name__ == "__main__":
    main()
