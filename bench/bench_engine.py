"""Real-engine A/B: two SGLang replicas, one replayed workload, several fronts, and the simulator.

    python bench/bench_engine.py --seeds 0 1 2 3 4                        # CPU: tiny local model
    python bench/bench_engine.py --condition multi-agent agent-platform --ablation
    python bench/bench_engine.py --gpu --model-config llama-8b             # GPU: 8B Llama shape, no weights
    python bench/bench_engine.py --estimate --matrix                       # what the issue-34 matrix costs
    python bench/bench_engine.py --matrix --out engine-matrix.json         # ... and run it, ALONE on the machine

Replicas with a tight KV pool replay the *same* workload (``profiler replay``, closed loop)
through every arm (``--setups``) side by side: **round-robin** (plain SGLang behind the gateway),
**router** (the real ``sglang-router`` at its defaults, :mod:`bench.engine_router`),
**routing-only** (gateway ``--routing capacity``, no SGLang fields) and **hints** (SGLang as
docs/sglang.md deploys it: plugin, priority scheduling, ``workflow-retention``, HiCache);
``--ablation`` adds one-mechanism-off arms. ``--condition`` picks presets
(:mod:`bench.engine_conditions`); ``--matrix`` runs the contention conditions.

Why this shape: per seed every arm replays the same workflows after a cache flush, arms
interleave A B | B A so background load hits all alike, and the machine must be quiet
(:mod:`bench.engine_quiet`) — **it must run alone**. Reported (:mod:`bench.engine_report`): per
seed and arm avg/P95 workflow JCT, cache share and queue; per ratio the mean and a 95 % Student-t
interval over seeds; then the simulator (:mod:`bench.engine_sim`), calibrated to these replicas,
replays the same traces and ``fidelity`` judges it. The full description of arms, conditions and
the ``--gpu`` mode is in docs/sglang.md ("bench_engine.py: arms, conditions and reports").
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.engine_conditions import (CONDITIONS, EngineWorkload, condition_settings,  # noqa: E402
                                     prepare_workload, scale_records)
from bench.engine_models import MODEL_CONFIGS, write_model  # noqa: E402
from bench.engine_quiet import IDLE_CPU_LIMIT, SessionCPU, wait_quiet  # noqa: E402
from bench.engine_report import (MIN_QUEUE_SHARE, arm_summary, engine_counters, fidelity,  # noqa: E402
                                 prefill_sequences, queue_samples, queue_summary, ratio_pairs, ratios,
                                 same_seed_ratios, withheld_reasons)
from bench.engine_router import SGLangRouter, router_available  # noqa: E402
from tests.sglang.cpu_standins.awp_cpu_standins import (EXTEND_ATTENTION_CHOICES,  # noqa: E402
                                                         EXTEND_ATTENTION_ENV, GPU_STANDINS_ENV)
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
#: on a CUDA host without ``sgl-kernel`` (bench/gpu_device_run.sh sets ``AWP_GPU_STANDINS=1``): every
#: fused op on its torch path, torch sampling, no CUDA graphs (their capture goes through the
#: kernel's weak-ref op) and HiCache's torch-copied ``direct`` IO (tests/sglang/cpu_standins)
GPU_STANDIN_FLAGS = ["--sampling-backend", "pytorch", "--disable-cuda-graph"]
GPU_STANDIN_ENV = {"SGLANG_FORCE_FUSED_OP_BACKEND": "torch"}
#: the plugin's counters line every second (its names: docs/sglang.md), so a run's last one is fresh
PLUGIN_LOG_EVERY_S = 1
#: replica pair -> (server flags, plugin on, extra environment)
PAIRS: dict[str, tuple[list[str], bool, dict[str, str]]] = {
    "plain": ([], False, {}),
    "hints": (PRIORITY_FLAGS + RETENTION_FLAGS + HICACHE_FLAGS, True, {}),
    # ablations: one mechanism off each (SGLang ignores `priority` without the flag)
    "no-priority": (RETENTION_FLAGS + HICACHE_FLAGS, True, {}),
    "no-retention": (PRIORITY_FLAGS + HICACHE_FLAGS, True, {}),
    "no-prefetch": (PRIORITY_FLAGS + RETENTION_FLAGS + HICACHE_FLAGS, True, {"AWP_PREFETCH": "0"}),
    # no host tier at all (HiCache off, so nothing to stage): what HiCache itself costs on the replica
    "no-host-tier": (PRIORITY_FLAGS + RETENTION_FLAGS, True, {"AWP_PREFETCH": "0"}),
}
#: arm -> (replica pair, front: gateway round robin | sglang-router | gateway capacity routing
#: without / with SGLang fields)
SETUPS = {
    "round-robin": ("plain", "gateway-rr"),
    "router": ("plain", "sglang-router"),
    "routing-only": ("plain", "gateway-routing"),
    "hints": ("hints", "gateway-hints"),
    "no-priority": ("no-priority", "gateway-hints"),
    "no-retention": ("no-retention", "gateway-hints"),
    "no-prefetch": ("no-prefetch", "gateway-hints"),
    "no-host-tier": ("no-host-tier", "gateway-hints"),
    "no-routing": ("hints", "gateway-hints-rr"),
}
DEFAULT_SETUPS = ["round-robin", "router", "hints"]
ABLATION = ["routing-only", "no-priority", "no-retention", "no-prefetch", "no-host-tier", "no-routing"]
#: arms that differ from others only in routing: nothing to compare on one replica
ROUTING_ARMS = ("routing-only", "no-routing", "router")
#: defaults per machine: CPU (tiny model, 2 shared cores) and GPU (8B Llama shape, one H100-class
#: GPU). Running slots are many (8 per CPU replica, 8 workflows in flight over 2 replicas) and the
#: KV pool is what runs out, so calls wait in SGLang's queue where priority can reorder them.
DEFAULTS = {
    "cpu": {"model_config": "tiny", "workflows": 16, "concurrency": 8, "time_scale": 0.02, "token_scale": 0.05,
            "pool_tokens": 2000, "max_running": 8, "budget_ms": 100.0, "calib_workflows": 4, "replicas": 2,
            "coding_token_scale": 1.0, "rate": None},
    "gpu": {"model_config": "llama-8b", "workflows": 48, "concurrency": 24, "time_scale": 0.02,
            "token_scale": 0.25, "pool_tokens": 30000, "max_running": 32, "budget_ms": 20.0,
            "calib_workflows": 6, "replicas": 2, "coding_token_scale": 1.0, "rate": None},
}


class BenchServer(SGLangServer):
    """The tests' launcher with the bench's dtype and, on GPU, a GPU id and memory share."""

    def __init__(self, *a, dtype: str = "float32", gpu_id: int | None = None,
                 mem_fraction: float | None = None, attention_backend: str | None = None, **kw) -> None:
        super().__init__(*a, **kw)
        self.dtype, self.gpu_id, self.mem_fraction = dtype, gpu_id, mem_fraction
        self.attention_backend = attention_backend

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("--dtype") + 1] = self.dtype
        if self.gpu_id is not None:
            cmd += ["--base-gpu-id", str(self.gpu_id)]
        if self.mem_fraction is not None:
            cmd += ["--mem-fraction-static", f"{self.mem_fraction:.3f}"]
        if self.attention_backend:
            cmd += ["--attention-backend", self.attention_backend]
        return cmd


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def calls_dir(args: argparse.Namespace) -> Path:
    """Where ``--out FILE`` keeps every run's call records: ``FILE`` without its suffix + ``-calls/``
    (one JSONL per condition, arm and seed, ``profiler replay --out``'s records)."""
    return args.out.with_name(args.out.stem + "-calls")


def arrivals_label(st: dict) -> str:
    """How a run's workflows arrive, for the printed headers: open loop at a rate, or a closed
    population in flight."""
    return f"open loop at {st['rate']}/s" if st.get("rate") else f"{st['concurrency']} in flight"


def shares_device(args: argparse.Namespace) -> bool:
    """Whether the replicas of an arm share one device: on CPU always (the host's cores), on GPU
    when there are fewer GPUs than replicas (``start_pair`` packs them)."""
    return not args.gpu or gpu_count() < args.replicas


def pair_settings(pair: str, args: argparse.Namespace) -> tuple[list[str], bool, dict[str, str]]:
    """``pair``'s server flags, plugin switch and extra environment on this machine: the preemption
    threshold with priority scheduling; HiCache's torch-copied IO on CPU and on a GPU host without
    ``sgl-kernel`` (``AWP_GPU_STANDINS=1``), which also gets :data:`GPU_STANDIN_FLAGS`."""
    flags, plugin, env = PAIRS[pair]
    flags = list(flags)
    if "--enable-priority-scheduling" in flags:
        flags += ["--priority-scheduling-preemption-threshold", str(args.preemption_threshold)]
    standins = args.gpu and os.environ.get(GPU_STANDINS_ENV) == "1"
    if "--enable-hierarchical-cache" in flags and (standins or not args.gpu):
        flags += HICACHE_CPU_FLAGS
    if standins:
        flags += GPU_STANDIN_FLAGS
        env = {**env, **GPU_STANDIN_ENV}
    return flags, plugin, env


def start_pair(model: Path, work: Path, pair: str, args: argparse.Namespace) -> list[SGLangServer]:
    """The ``--replicas`` replicas of ``pair``, started side by side (on 2 busy cores a start takes
    1-2 min, almost all imports); if one fails, the others are stopped."""
    flags, plugin, env = pair_settings(pair, args)
    common = ["--max-total-tokens", str(args.pool_tokens), "--max-running-requests", str(args.max_running),
              "--enable-cache-report"]
    servers = []
    n_gpu = gpu_count() if args.gpu else 0
    for i in range(args.replicas):
        kw: dict = {"dtype": "float32", "attention_backend": getattr(args, "attention_backend", None)}
        if args.gpu:
            per_gpu = math.ceil(args.replicas / n_gpu)
            kw = {"dtype": "bfloat16", "gpu_id": i % n_gpu, "mem_fraction": 0.85 / per_gpu,
                  "attention_backend": kw["attention_backend"]}
        servers.append(BenchServer(model, work / f"{pair}-{i}.log", extra_args=common + flags,
                                   env={"AWP_SGLANG_PLUGIN": "1" if plugin else "0",
                                        "AWP_LOG_EVERY_S": str(PLUGIN_LOG_EVERY_S),
                                        EXTEND_ATTENTION_ENV: args.cpu_extend_attention,
                                        **env}, **kw))
    with ThreadPoolExecutor(len(servers)) as ex:
        futures = [ex.submit(srv.start, timeout_s=900 if args.gpu else 600) for srv in servers]
        errors = [f.exception() for f in futures]
    if any(errors):
        for srv in servers:
            srv.stop()
        raise next(e for e in errors if e is not None)
    for i, srv in enumerate(servers):
        print(f"  {pair} replica {i} ready in {srv.startup_s:.0f}s ({srv.url})", file=sys.stderr)
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

    registry = CollectorRegistry()
    service = prediction_service(profile, registry, "profiler_gateway")
    router = RoundRobinRouter(urls) if kind in ("gateway-rr", "gateway-hints-rr") else CapacityRouting(urls)
    options = GatewayOptions(sglang_fields=kind in ("gateway-hints", "gateway-hints-rr"), budget_s=budget_s)
    gw = Gateway(router, LocalAnnotator(service), options=options, registry=registry, service=service)
    with serve_in_thread(create_gateway_app(gw), server_header=False, date_header=False) as srv:
        yield srv.url, registry


def flush(servers: list[SGLangServer]) -> None:
    for s in servers:
        httpx.post(s.url + "/flush_cache", timeout=60, trust_env=False)


def log_sizes(servers: list[SGLangServer]) -> list[int]:
    return [s.log_path.stat().st_size if s.log_path.exists() else 0 for s in servers]


def logs_since(servers: list[SGLangServer], sizes: list[int]) -> list[str]:
    """What each replica logged since ``sizes`` (their log sizes before a run)."""
    out = []
    for srv, n in zip(servers, sizes):
        with srv.log_path.open("rb") as f:
            f.seek(n)
            out.append(f.read().decode(errors="replace"))
    return out


def run_setup(name: str, servers: list[SGLangServer], profile: Path, plan: list, seed: int,
              args: argparse.Namespace, work: Path) -> dict:
    """One arm, one seed: flush, replay ``plan`` through the arm's front; the replay's summary
    with the gateway's annotate outcomes and the waiting-queue samples of the replicas' logs."""
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

    sizes = log_sizes(servers)
    with front(kind, [s.url for s in servers], profile, args.budget_ms / 1000, work / "router.log") as (url, registry):
        result = replay(plan, url, ReplayOptions(concurrency=None if args.rate else args.concurrency,
                                                 rate=args.rate, time_scale=args.time_scale, seed=seed,
                                                 run_tag=f"{name[:2]}{seed}"), on_call=tick)
        outcomes = ({m.labels["outcome"]: int(m.value) for metric in registry.collect()
                     if metric.name == "profiler_gateway_annotate" for m in metric.samples
                     if m.name.endswith("_total")} if registry is not None else {})
    if sys.stderr.isatty():
        print("\r", end="", file=sys.stderr)
    r = summarize(result)
    if args.out:                      # every call of the run, for a per-call look at fidelity later
        from serving_hooks.replay_report import call_records
        from store.workloads import write_jsonl
        write_jsonl(call_records(result), calls_dir(args) / f"{args.condition}-{name}-seed{seed}.jsonl")
    logs = logs_since(servers, sizes)
    queues, running = queue_samples("\n".join(logs))
    ok = [c for c in result.calls if c.status == "ok" and c.t_first_token and c.t_finish]
    latency = sum(c.t_finish - c.t_send for c in ok)
    return {"jct_avg_s": r["workflows"]["jct_s"]["avg"], "jct_p95_s": r["workflows"]["jct_s"]["p95"],
            "errors": r["calls"]["errors"], "cached_fraction": r["tokens"]["cached_fraction"],
            "calls": r["calls"]["count"], "annotate_outcomes": outcomes, "wall_s": r["wall_s"],
            "ttft_share": (sum(c.t_first_token - c.t_send for c in ok) / latency) if latency > 0 else None,
            "queue_depth": queue_summary(queues, running), "queue_samples": (queues, running),
            "replica_prefill_seqs": [prefill_sequences(text) for text in logs]}


def final_counters(servers: list[SGLangServer]) -> None:
    """Make each plugin replica log a fresh counters line: with ``--sleep-on-idle`` an idle
    scheduler runs no round (and so writes no line); one ``/health_generate`` after the logging
    period makes it run one (an untagged call: one ``priority_from_default``)."""
    time.sleep(PLUGIN_LOG_EVERY_S + 0.2)
    for s in servers:
        try:
            httpx.get(s.url + "/health_generate", timeout=60, trust_env=False)
        except httpx.HTTPError:
            pass
    time.sleep(0.5)


#: workflows of the warm-up replay each replica gets after it starts (``--warm-up``)
WARM_UP_WORKFLOWS = 2


def warm_up(servers: list[SGLangServer], plan: list, args: argparse.Namespace) -> float:
    """Replay ``plan`` (a few calibration workflows, two in flight) straight to each replica
    after it starts, then flush its cache; returns the seconds it took.

    A fresh replica's first requests pay one-off costs (lazy imports, first-shape kernels,
    allocator growth): on two CPU cores the first arm run after five replicas had started took
    about twice the time of the same seed later (docs/sglang.md, session 8). Warming every
    replica the same way before any measured run takes that out of whichever arm comes first."""
    from serving_hooks.replay import ReplayOptions, replay

    t0 = time.monotonic()
    for srv in servers:
        replay(plan, srv.url, ReplayOptions(concurrency=2, time_scale=args.time_scale, seed=0, run_tag="warm"))
    flush(servers)
    return time.monotonic() - t0


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
        recs += [{**r, "calib_concurrency": conc} for r in call_records(res)]
    flush(servers)
    return recs


#: ``--matrix``: the issue-34 figures in one command, condition -> paired seeds (seeds 0 … n-1);
#: >= 10 for contention, where the done-means ask for them; the estimate keeps the whole <= 45 min
MATRIX = {"contention": 10, "platform-contention": 6, "kv-pressure": 5}
#: settings a condition may fill (None on the command line = unset)
SETTINGS = tuple(DEFAULTS["cpu"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--condition", nargs="+", default=["default"], choices=list(CONDITIONS),
                    help="named presets, run one after the other (bench/engine_conditions.py; default: default)")
    ap.add_argument("--workflows", type=int, help="workflows replayed per seed (CPU 16, GPU 48)")
    ap.add_argument("--concurrency", type=int, help="workflows in flight (CPU 8, GPU 24; contention conditions: "
                    "a multiple of the cluster's running slots)")
    ap.add_argument("--rate", type=float,
                    help="open loop: new workflows per second, Poisson arrivals (seeded like the replay's), no cap "
                         "on those in flight; replaces --concurrency's closed loop (open-contention: 1.8 on CPU)")
    ap.add_argument("--time-scale", type=float, help="× recorded tool/think gaps (0.02)")
    ap.add_argument("--token-scale", type=float, help="× recorded prompt and output lengths (CPU 0.05, GPU 0.25)")
    ap.add_argument("--coding-token-scale", type=float,
                    help="a further × on the prompts of the mix's long coding sessions (1; kv-pressure 4)")
    ap.add_argument("--pool-tokens", type=int, help="KV pool of each replica (CPU 2000, GPU 30000)")
    ap.add_argument("--max-running", type=int, help="--max-running-requests of each replica (CPU 8, GPU 32)")
    ap.add_argument("--replicas", type=int, help="replicas per arm (2; contention and kv-pressure 1)")
    ap.add_argument("--preemption-threshold", type=int, default=500,
                    help="--priority-scheduling-preemption-threshold of the hints replicas (docs/sglang.md: 500 "
                         "on the gateway's 0-2,000 priority scale; SGLang's default is 10)")
    ap.add_argument("--budget-ms", type=float,
                    help="gateway annotation budget (CPU 100: its default 5 ms is for an unloaded machine; "
                         "with 2 shared cores most calls would go out unannotated; GPU 20)")
    ap.add_argument("--setups", nargs="+", choices=list(SETUPS),
                    help="arms to run (default: the condition's own arms, else round-robin router hints)")
    ap.add_argument("--ablation", action="store_true",
                    help="also run " + ", ".join(ABLATION) + " (each one mechanism off; the routing arms "
                         "only with 2+ replicas)")
    ap.add_argument("--calib-workflows", type=int, help="workflows of the calibration replay (CPU 4, GPU 6)")
    ap.add_argument("--no-sim", action="store_true", help="skip the calibration replay and the simulator")
    ap.add_argument("--estimate", action="store_true",
                    help="start nothing: print each condition's wall-time estimate and the simulator's predicted "
                         "ratios with the machine's reference step time (how the conditions' settings were "
                         "picked), then exit")
    ap.add_argument("--matrix", action="store_true",
                    help="the issue-34 matrix in one command: " + ", ".join(f"{c} ({n} seeds)" for c, n in MATRIX.items())
                         + " — replaces --condition and --seeds; the whole matrix's estimate is printed first")
    ap.add_argument("--warm-up", type=int, default=WARM_UP_WORKFLOWS, metavar="N",
                    help="calibration workflows replayed straight to each replica after it starts, before any "
                         f"measured run, so no arm pays a fresh replica's first-request costs (default "
                         f"{WARM_UP_WORKFLOWS}; 0: none)")
    ap.add_argument("--cpu-extend-attention", choices=EXTEND_ATTENTION_CHOICES, default=EXTEND_ATTENTION_CHOICES[0],
                    help="CPU only: an extend's attention with the new tokens' queries only, so a cached prefix "
                         "saves attention work as SGLang's GPU kernels do (new-tokens, default), or SGLang's "
                         "torch-native one over the whole sequence, cached prefix included (sglang; "
                         "tests/sglang/cpu_standins/awp_cpu_standins.py, docs/sglang.md)")
    ap.add_argument("--one-pair-at-a-time", action="store_true",
                    help="start one replica pair at a time (always on --gpu; bounds memory on CPU)")
    quiet = ap.add_argument_group("quiet machine (bench/engine_quiet.py): checked before every run")
    quiet.add_argument("--max-load", type=float, default=1.5,
                       help="1-minute load average at most this × cores (default 1.5: it still remembers the "
                            "bench's own previous run)")
    quiet.add_argument("--max-busy", type=float, default=0.15,
                       help="share of all cores busy in a 2 s probe while no arm runs (default 0.15)")
    quiet.add_argument("--quiet-wait", type=float, default=300.0,
                       help="seconds to wait for a quiet machine before refusing (default 300)")
    quiet.add_argument("--allow-load", action="store_true",
                       help="run anyway when the machine stays loaded, marking the run 'quiet: false'")
    ap.add_argument("--min-queue-share", type=float, default=MIN_QUEUE_SHARE,
                    help="a seed's ratio is withheld when a run's SGLang queue was non-empty in fewer batch "
                         f"samples than this (default {MIN_QUEUE_SHARE}: empty most of the time)")
    ap.add_argument("--gpu", action="store_true", help="GPU machine: bfloat16, llama-8b shape, GPU defaults")
    ap.add_argument("--work-dir", type=Path,
                    help="keep the replicas' logs, the model folder and the profiles here (default: a temporary "
                         "folder removed at the end)")
    ap.add_argument("--attention-backend", help="SGLang --attention-backend of every replica (e.g. triton or "
                    "torch_native on a GPU host without flashinfer; default: SGLang's choice)")
    ap.add_argument("--model-config", choices=MODEL_CONFIGS, help="model folder written here (CPU tiny, GPU llama-8b)")
    ap.add_argument("--model-dir", type=Path, help="an existing model folder (config.json + tokenizer) instead")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    ap.add_argument("--out", type=Path, help="also write the JSON object to this file, and every run's call "
                    "records (JSONL per condition, arm and seed) to FILE's name without suffix + '-calls/'")
    args = ap.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds):
        ap.error("--seeds: each seed once")
    if args.matrix:
        args.condition = list(MATRIX)
    if args.replicas is not None and args.replicas < 1:
        ap.error("--replicas must be >= 1")
    if args.setups is not None:
        args.setups = list(dict.fromkeys(args.setups))
    arms = {a for name in args.condition for a in condition_setups(args, name)}
    if "router" in arms and not router_available() and not args.estimate:
        ap.error("the 'router' set-up needs sglang-router: pip install -e '.[bench]'")
    if args.gpu and not args.estimate and gpu_count() == 0:
        ap.error("--gpu: no CUDA device visible (torch.cuda.is_available() is False)")
    return args


def condition_setups(args: argparse.Namespace, name: str, replicas: int | None = None) -> list[str]:
    """The arms of condition ``name``: ``--setups`` when given, else the condition's own arms,
    else the default three; ``--ablation`` adds each mechanism off (the routing arms only when
    there are 2+ replicas to route between)."""
    own = CONDITIONS[name].setups
    names = list(args.setups or own or DEFAULT_SETUPS)
    if args.ablation:
        names += [n for n in ABLATION if n not in names]
    if replicas == 1:
        names = [n for n in names if n not in ROUTING_ARMS or n in (args.setups or ())]
    return list(dict.fromkeys(names))


def condition_args(args: argparse.Namespace, name: str) -> argparse.Namespace:
    """``args`` with condition ``name``'s settings filled in (:func:`condition_settings`), its
    arms (:func:`condition_setups`) and, under ``--matrix``, its seeds (:data:`MATRIX`)."""
    defaults = DEFAULTS["gpu" if args.gpu else "cpu"]
    out = copy.copy(args)
    if getattr(args, "matrix", False):
        out.seeds = list(range(MATRIX[name]))
    for k, v in condition_settings(name, {k: getattr(args, k) for k in SETTINGS}, defaults).items():
        setattr(out, k, v)
    out.condition = name
    out.setups = condition_setups(args, name, out.replicas)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    estimates = {}
    for name in args.condition:                 # before anything starts: what it will cost
        estimates[name] = estimate_condition(condition_args(args, name))
        print_estimate(name, estimates[name], file=sys.stdout if args.estimate else sys.stderr)
    total = sum(e["total_min"] for e in estimates.values())
    print(f"estimated wall time of the whole run: {total:.0f} min ({len(estimates)} condition(s)); "
          "it must run alone on the machine (docs/sglang.md)", file=sys.stderr if not args.estimate else sys.stdout)
    if args.estimate:
        return
    check = wait_quiet(args.max_load, args.max_busy, args.quiet_wait)   # before starting anything
    if not check.quiet and not args.allow_load:
        sys.exit(f"bench_engine: {not_quiet_message(check, args)}")
    model_cfg = args.model_config or DEFAULTS["gpu" if args.gpu else "cpu"]["model_config"]
    out: dict = {"conditions": {}, "fidelity": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model = args.model_dir or write_model(work / "model", model_cfg)
        for name in args.condition:
            cargs = condition_args(args, name)
            print(f"condition {name}: {CONDITIONS[name].doc}", file=sys.stderr)
            res = run_condition(cargs, model, work / name, estimates[name])
            out["conditions"][name] = res
            if "simulator" in res:
                out["fidelity"][name] = res["fidelity"]
            if args.out:                      # a partial matrix survives a refused condition after it
                args.out.write_text(json.dumps(out, indent=2, default=str))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2, default=str))
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return
    for name, res in out["conditions"].items():
        print_report(name, res, res["settings"]["setups"])


def fit_profiles(wl: EngineWorkload, work: Path) -> dict[int, Path]:
    """One profile per distinct train set (one for all seeds unless the condition fits per seed)."""
    from fitting import profile_fit as fitting
    from store.workloads import write_jsonl

    paths: dict[int, Path] = {}
    fitted: dict[int, Path] = {}
    for seed, train in wl.train.items():
        if id(train) not in fitted:
            d = work / f"profile-{len(fitted)}"
            write_jsonl(train, d / "train" / "train.jsonl")
            fitting.fit_profile([d / "train"], d / "profile", options=fitting.FitOptions(min_calls=5))
            fitted[id(train)] = d / "profile"
        paths[seed] = fitted[id(train)]
    return paths


def run_order(seeds: list[int], names: list[str]) -> list[tuple[int, str]]:
    """Every (seed, arm), the arms interleaved per seed A B | B A | A B …: each arm runs first
    and last equally often, so a drift in the machine's load over the matrix falls on all arms
    alike (with more than two arms: forward, then reversed)."""
    return [(seed, name) for i, seed in enumerate(seeds) for name in (names if i % 2 == 0 else names[::-1])]


def pair_schedule(names: list[str], seeds: list[int], calibrate: bool, one_at_a_time: bool
                  ) -> list[tuple[list[str], list[tuple[int, str]]]]:
    """Which replica pairs are up together and which runs they serve, in order: the calibration
    on a plain pair first and alone when no arm uses plain replicas (then stopped: no idle pair
    beside the measured ones); then either every pair of the condition at once with the runs
    A B | B A per seed (CPU), or one pair at a time with its own runs (``--gpu``,
    ``--one-pair-at-a-time``; the calibration then rides with the plain pair when it is used)."""
    pairs = list(dict.fromkeys(SETUPS[n][0] for n in names))
    runs = run_order(seeds, names)
    steps: list[tuple[list[str], list[tuple[int, str]]]] = []
    if calibrate and "plain" not in pairs:
        steps.append((["plain"], []))
    if one_at_a_time:
        steps += [([p], [(s, n) for s, n in runs if SETUPS[n][0] == p]) for p in pairs]
    else:
        steps.append((pairs, runs))
    return steps


#: rough CPU costs for the estimate printed before a run (seconds; measured on the 2-core machine)
START_S = {"cpu": 60.0, "gpu": 180.0}           # per replica started (imports, mostly)
RUN_OVERHEAD_S = 8.0                            # flush, front start/stop, quiet probe per run
#: measured JCT / simulated JCT on CPU (docs/sglang.md: the simulator has no HTTP, tokenizer or
#: gateway cost): the estimate scales the simulated makespan by it
SIM_TO_WALL = 1.7


def calibration_workload(args: argparse.Namespace, workflows: int | None = None) -> list[dict]:
    """The calibration replay's records (and the warm-up's, with ``workflows``): generated
    coding-assistant workflows (seed 900), scaled like the condition (its coding prompts' extra
    scale included) and capped to the pool."""
    from store.workloads import generate

    recs = [{**r, "input_tokens": r["input_tokens"] * (args.coding_token_scale or 1.0)}
            for r in generate("coding_assistant", workflows or args.calib_workflows, seed=900)]
    return scale_records(recs, args.token_scale, args.pool_tokens // 2, max(1, args.pool_tokens // 4))[0]


def estimate_condition(args: argparse.Namespace, wl: EngineWorkload | None = None,
                       profiles: dict[int, Path] | None = None, step=None, work: Path | None = None) -> dict:
    """Before anything starts: the simulator with ``step`` (default: the machine's reference step
    time, :data:`bench.engine_sim.REFERENCE_STEP`) on seed 0's workload under every arm gives each
    run's makespan and the predicted ratios; the wall-time estimate adds replica starts,
    calibration and per-run overhead."""
    from bench.engine_sim import REFERENCE_LIMITS, REFERENCE_STEP, cluster, scaled_records, simulate_setups

    machine = "gpu" if args.gpu else "cpu"
    own_tmp = None
    if wl is None:
        wl = prepare_workload(args.condition, args.seeds[:1], args)
    if profiles is None:
        own_tmp = tempfile.TemporaryDirectory()
        profiles = fit_profiles(wl, Path(own_tmp.name))
    try:
        step = step or REFERENCE_STEP[machine]
        limits = {**REFERENCE_LIMITS, "kv_capacity_tokens": args.pool_tokens, "max_running_requests": args.max_running}
        seed = args.seeds[0]
        sim = simulate_setups(scaled_records(wl.replay[seed], 1.0, args.time_scale), profiles[seed],
                              cluster(limits, step, args.replicas, shares_device(args)),
                              args.concurrency, args.setups, preemption_threshold=args.preemption_threshold,
                              rate=args.rate, seed=seed)
    finally:
        if own_tmp is not None:
            own_tmp.cleanup()
    names = args.setups
    pairs = list(dict.fromkeys(SETUPS[n][0] for n in names))
    calib_pair = 0 if args.no_sim or "plain" in pairs else 1
    per_run = {n: sim[n]["makespan_s"] * SIM_TO_WALL + RUN_OVERHEAD_S for n in names}
    runs_s = sum(per_run.values()) * len(args.seeds)
    starts_s = START_S[machine] * args.replicas * (len(pairs) + calib_pair)
    calib_s = 0.0 if args.no_sim else 3 * per_run[names[0]] * args.calib_workflows / max(1, args.workflows)
    # each replica replays the warm-up workflows, two in flight (half the calibration's cost per workflow)
    calib_s += (1.5 * per_run[names[0]] * args.warm_up / max(1, args.workflows)
                * args.replicas * (len(pairs) + calib_pair))
    return {"condition": args.condition, "arms": names, "seeds": len(args.seeds), "replicas": args.replicas,
            "pairs": pairs, "per_run_s": per_run, "runs_s": runs_s, "starts_s": starts_s, "calibration_s": calib_s,
            "total_min": (runs_s + starts_s + calib_s) / 60, "step": step.source,
            "predicted": {n: sim[n]["jct_avg_s"] for n in names},
            "predicted_ratios": {f"{t}/{b}": sim[t]["jct_avg_s"] / sim[b]["jct_avg_s"]
                                 for t, b in ratio_pairs(names)},
            "settings": {k: getattr(args, k) for k in SETTINGS}}


def print_estimate(name: str, est: dict, file=None) -> None:
    file = file or sys.stdout
    st = est["settings"]
    print(f"condition {name}: {est['seeds']} seeds x {len(est['arms'])} arms ({', '.join(est['arms'])}) on "
          f"{est['replicas']} replica(s) per arm; {st['workflows']} workflows, {arrivals_label(st)}, "
          f"{st['max_running']} running slots, pool {st['pool_tokens']}, tokens x{st['token_scale']}"
          + (f" (coding prompts x{st['coding_token_scale']})" if st.get("coding_token_scale", 1) != 1 else ""),
          file=file)
    print(f"  estimated wall time {est['total_min']:.1f} min: runs {est['runs_s'] / 60:.1f} min ("
          + ", ".join(f"{a} {s:.0f}s" for a, s in est["per_run_s"].items()) + " per seed), "
          f"replica starts {est['starts_s'] / 60:.1f} min, calibration {est['calibration_s'] / 60:.1f} min",
          file=file)
    print("  simulator (" + est["step"] + "): " + ", ".join(f"{k} {v:.3f}" for k, v in est["predicted_ratios"].items())
          + "  (" + ", ".join(f"{a} {v:.2f}s" for a, v in est["predicted"].items()) + ")", file=file)


def run_condition(args: argparse.Namespace, model: Path, work: Path, est: dict | None = None) -> dict:
    """Every arm × seed of one condition on fresh replicas, then the simulator: the condition's
    JSON object (:func:`build_output`). Order: the estimate (printed), the calibration replay on a
    plain replica pair (stopped at once when no arm uses it), the simulator's prediction
    (printed), then the runs A B | B A per seed, each after a quiet-machine check, with the CPU
    of the replicas not being measured recorded per run."""
    from store.workloads import write_jsonl
    from serving_hooks.replay_plan import load_plan

    work.mkdir(parents=True, exist_ok=True)
    names = list(args.setups)
    pairs_needed = list(dict.fromkeys(SETUPS[n][0] for n in names))
    runs = run_order(list(args.seeds), names)
    load_start = os.getloadavg()
    t_start = time.monotonic()
    wl = prepare_workload(args.condition, args.seeds, args)
    profiles = fit_profiles(wl, work)
    if est is None:
        est = estimate_condition(args, wl, profiles)
        print_estimate(args.condition, est, file=sys.stderr)
    plans = {}
    for seed, recs in wl.replay.items():
        write_jsonl(recs, work / f"replay{seed}" / "replay.jsonl")
        plans[seed], _ = load_plan([work / f"replay{seed}"])      # lengths already scaled
    calib_plan = warm_plan = None
    if args.warm_up > 0:
        write_jsonl(calibration_workload(args, args.warm_up), work / "warm" / "warm.jsonl")
        warm_plan, _ = load_plan([work / "warm"])
    if not args.no_sim:
        write_jsonl(calibration_workload(args), work / "calib" / "calib.jsonl")
        calib_plan, _ = load_plan([work / "calib"])

    rows: dict[str, dict[int, dict]] = {n: {} for n in names}
    engine: dict[str, list[dict]] = {}      # per pair, per replica, over the whole condition
    state: dict = {"calib": [], "limits_log": "", "k": 0, "sim": None}

    def calibrate_and_predict(plain: list[SGLangServer]) -> None:
        print("  calibration replay (one plain replica, 1 then 2 workflows in flight)", file=sys.stderr)
        state["calib"] = calibration_records(plain, calib_plan, args)
        state["limits_log"] = plain[0].log_text()
        state["sim"] = simulate(args, names, wl.replay, state["calib"], state["limits_log"], profiles)
        pred = state["sim"]["ratios"]
        print("  simulator, calibrated to these replicas, predicts: "
              + ", ".join(f"{k} {v['mean_avg']:.3f}" for k, v in pred.items())
              + "  (" + ", ".join(f"{a} {state['sim']['arms'][a]:.2f}s" for a in names) + ")", file=sys.stderr)

    def do_runs(pair_servers: dict[str, list[SGLangServer]], todo: list[tuple[int, str]]) -> None:
        for seed, name in todo:
            state["k"] += 1
            check = wait_quiet(args.max_load, args.max_busy, args.quiet_wait)
            if not check.quiet and not args.allow_load:
                raise MachineNotQuiet(not_quiet_message(check, args))
            pair = SETUPS[name][0]
            idle = [SessionCPU([s.proc.pid]).start() for p, v in pair_servers.items() if p != pair for s in v if s.proc]
            la0 = list(os.getloadavg())
            rows[name][seed] = s = run_setup(name, pair_servers[pair], profiles[seed], plans[seed], seed, args, work)
            each = [w.stop() for w in idle]
            s["idle_replicas_cpu"] = max(each) if each else None      # the busiest idle replica, share of a core
            s["idle_replicas_cpu_each"] = each
            s["quiet_check"] = check.to_dict()
            s["load_average"] = {"start": la0, "end": list(os.getloadavg())}
            q = s["queue_depth"]
            icpu = s["idle_replicas_cpu"]
            print(f"  [{state['k']}/{len(runs)}] {name} seed {seed}: JCT avg {s['jct_avg_s']:.2f}s "
                  f"p95 {s['jct_p95_s']:.2f}s, errors {s['errors']}, cached {s['cached_fraction'] or 0:.1%}, "
                  f"queue mean {q['mean'] if q['mean'] is None else round(q['mean'], 2)} max {q['max']} "
                  f"non-empty {q['nonempty_share'] if q['nonempty_share'] is None else round(q['nonempty_share'], 2)}"
                  + (f", annotate {s['annotate_outcomes']}" if s["annotate_outcomes"] else "")
                  + (f", calls per replica {'/'.join(map(str, s['replica_prefill_seqs']))}"
                     if len(s.get("replica_prefill_seqs") or []) > 1 else "")
                  + (f", busiest idle replica {icpu:.1%} of a core" + (" (OVER 2%)" if icpu > IDLE_CPU_LIMIT else "")
                     if icpu is not None else "")
                  + f"  ({(time.monotonic() - t_start) / 60:.1f} min elapsed, load {la0[0]:.1f} -> "
                  f"{s['load_average']['end'][0]:.1f}{'' if check.quiet else ', NOT QUIET'})",
                  file=sys.stderr)

    def stop_all(pairs: dict[str, list[SGLangServer]]) -> None:
        plugin_servers = [s for p, v in pairs.items() if PAIRS[p][1] for s in v]
        if plugin_servers:
            final_counters(plugin_servers)
        for pair, servers in pairs.items():
            for srv in servers:
                srv.stop()
                engine.setdefault(pair, []).append(engine_counters(srv.log_text()))
                print(f"  {pair} {srv.url}: {engine[pair][-1]}", file=sys.stderr)

    def with_pairs(wanted: list[str], todo: list[tuple[int, str]]) -> None:
        pairs: dict[str, list[SGLangServer]] = {}
        try:
            with ThreadPoolExecutor(len(wanted)) as ex:       # every pair side by side
                futures = {pair: ex.submit(start_pair, model, work, pair, args) for pair in wanted}
                for pair, fut in futures.items():
                    if fut.exception() is None:
                        pairs[pair] = fut.result()
                failed = [fut.exception() for fut in futures.values() if fut.exception() is not None]
            if failed:
                raise failed[0]
            if warm_plan is not None:
                for pair, servers in pairs.items():
                    print(f"  {pair}: warm-up replay ({args.warm_up} workflows per replica) "
                          f"{warm_up(servers, warm_plan, args):.0f}s", file=sys.stderr)
            if "plain" in pairs and calib_plan is not None and not state["calib"]:
                calibrate_and_predict(pairs["plain"])
            do_runs(pairs, todo)
        finally:
            stop_all(pairs)

    refused = None
    try:
        for wanted, todo in pair_schedule(names, list(args.seeds), calib_plan is not None,
                                          args.gpu or args.one_pair_at_a_time):
            with_pairs(wanted, todo)
        if "plain" not in pairs_needed:         # the calibration's replicas: no arm's counters
            engine.pop("plain", None)
    except MachineNotQuiet as e:
        refused = str(e)
        print(f"  REFUSED: {refused}", file=sys.stderr)
    done_seeds = [s for s in args.seeds if all(s in rows[n] for n in names)]
    out = build_output(args, names, rows, engine, done_seeds)
    out["estimate"] = est
    if refused:
        out["refused"] = refused
    out["workload"] = {"condition": args.condition, "doc": CONDITIONS[args.condition].doc,
                       "calls_per_seed": {s: len(r) for s, r in wl.replay.items()},
                       "workflows_per_seed": {s: len({x["workflow_id"] for x in r}) for s, r in wl.replay.items()},
                       "capped_calls": wl.capped_calls, "profiles": len(set(profiles.values())), "notes": wl.notes}
    out["load_average"] = {"start": list(load_start), "end": list(os.getloadavg()),
                           "cpus": os.cpu_count(), "minutes": (time.monotonic() - t_start) / 60}
    if state["sim"] is not None:
        sim = state["sim"]
        out["simulator"] = sim
        out["prefill_share"] = prefill_share(state["calib"], sim["step"], wl.replay)
        sim_arms = {n: float(np.mean([sim["seeds"][s][n]["jct_avg_s"] for s in done_seeds])) if done_seeds else None
                    for n in names}             # over the seeds measured (all, unless refused part way)
        out["fidelity"] = fidelity(out["ratios"], same_seed_ratios({s: sim["seeds"][s] for s in done_seeds}, names,
                                                                   out["ratios"]),
                                   {n: out["arms"][n]["jct_avg_s"] for n in names}, sim_arms)
    return out


def not_quiet_message(check, args: argparse.Namespace) -> str:
    return (f"the machine is not quiet after {check.waited_s:.0f}s (load average {check.load_average[0]:.2f} on "
            f"{check.cpus} CPUs, limit {args.max_load} x cores; {check.busy_share:.0%} of the cores busy with no arm "
            f"running, limit {args.max_busy:.0%}): this bench must run alone (docs/sglang.md); --allow-load runs "
            "anyway and marks the runs")


class MachineNotQuiet(RuntimeError):
    """The machine stayed loaded for ``--quiet-wait`` seconds before a run (and no ``--allow-load``)."""


def prefill_share(calib: list[dict], step: dict, replay: dict[int, list[dict]]) -> dict:
    """How much of a call's time prefill is on these replicas: ``calibration`` — measured, the
    calibration replay's calls served one workflow at a time (Σ TTFT / Σ latency: no queue in
    the TTFT); ``model`` — the calibrated step time on the condition's replayed calls served
    alone (prefill p0 + a·prompt against decode t0 per output token)."""
    alone = [r for r in calib if r.get("status") == "ok" and r.get("t_first_token") is not None
             and r.get("calib_concurrency") == 1] or \
        [r for r in calib if r.get("status") == "ok" and r.get("t_first_token") is not None]
    lat = sum(float(r["t_finish"]) - float(r["t_arrival"]) for r in alone)
    ttft = sum(float(r["t_first_token"]) - float(r["t_arrival"]) for r in alone)
    recs = [r for rs in replay.values() for r in rs]
    pre = sum(step["prefill_t0"] + step["a"] * r["input_tokens"] for r in recs)
    dec = sum(step["t0"] * r["output_tokens"] for r in recs)
    return {"calibration": ttft / lat if lat > 0 else None, "model": pre / (pre + dec) if pre + dec > 0 else None,
            "calibration_calls": len(alone)}


def build_output(args: argparse.Namespace, names: list[str], rows: dict[str, dict[int, dict]],
                 engine: dict[str, list[dict]], seeds: list[int] | None = None) -> dict:
    """The condition's JSON: settings, per seed and arm, per arm (with the plugin's counters when
    the arm has its replica pair to itself), and the ratios with their intervals (seeds whose
    queue stayed empty withheld; ``seeds``: those every arm finished, default all)."""
    seeds = list(args.seeds) if seeds is None else seeds
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    per_seed = {seed: {n: {k: v for k, v in rows[n][seed].items() if k != "queue_samples"} for n in names}
                for seed in seeds}
    pair_arms: dict[str, list[str]] = {}
    for n in names:
        pair_arms.setdefault(SETUPS[n][0], []).append(n)
    arms = {}
    for n in names:
        pair = SETUPS[n][0]
        own = engine.get(pair) if len(pair_arms[pair]) == 1 else None
        arms[n] = {"replicas": pair, "front": SETUPS[n][1],
                   **arm_summary([rows[n][s] for s in seeds], own)}
        idle = [rows[n][s].get("idle_replicas_cpu") for s in seeds if rows[n][s].get("idle_replicas_cpu") is not None]
        arms[n]["idle_replicas_cpu_max"] = max(idle) if idle else None
        if own is None and pair in engine:      # the plain pair: plugin off, counters shared by its arms
            arms[n]["plugin"] = "/".join(r["plugin"] for r in engine[pair])
            arms[n]["plugin_counters"] = {}
    quiet = [rows[n][s]["quiet_check"]["quiet"] for n in names for s in seeds if "quiet_check" in rows[n][s]]
    return {"settings": settings, "seeds": per_seed, "arms": arms,
            "ratios": ratios(per_seed, names, min_queue_share=getattr(args, "min_queue_share", None)),
            "engine_counters": engine, "all_runs_quiet": all(quiet) if quiet else None}


def simulate(args: argparse.Namespace, names: list[str], raw: dict[int, list[dict]], calib: list[dict],
             limits_log: str, profiles: dict[int, Path]) -> dict:
    """Calibrate on the calibration replay, then simulate every seed's trace (see bench.engine_sim):
    per seed and arm (``seeds.<seed>.<arm>.jct_avg_s``), per arm the mean over seeds, the ratios."""
    from bench.engine_sim import CHATML, calibrate, cluster, scaled_records, server_limits, simulate_setups

    step = calibrate(calib, source=f"calibration replay on SGLang ({len(calib)} calls)")
    limits = server_limits(limits_log)
    cfg = cluster(limits, step, args.replicas, shares_device(args))
    print(f"  simulator: decode step t0={step.t0 * 1e3:.2f} ms + c={step.c:.3g} s per KV token; prefill "
          f"p0={step.prefill_t0 * 1e3:.1f} ms + a={step.a * 1e3:.3f} ms/token + a_ctx={step.a_ctx * 1e3:.4f} ms/token "
          f"(MdAPE prefill {step.prefill_mdape:.2f} on {step.n_prefill} calls, decode {step.decode_mdape:.2f} "
          f"on {step.n_decode}); {limits}", file=sys.stderr)
    seeds = {seed: simulate_setups(scaled_records(raw[seed], 1.0, args.time_scale), profiles[seed], cfg,
                                   args.concurrency, names, preemption_threshold=args.preemption_threshold,
                                   rate=args.rate, seed=seed)
             for seed in args.seeds}
    arms = {n: float(np.mean([seeds[s][n]["jct_avg_s"] for s in args.seeds])) for n in names}
    # the chat template the simulated replica sized prompts with, so engine_resimulate replays alike
    return {"step": step.to_dict(), "limits": limits, "template": dataclasses.asdict(CHATML), "seeds": seeds,
            "arms": arms, "ratios": ratios(seeds, names)}


SHORT = {"round-robin": "RR", "router": "router", "routing-only": "routing", "hints": "hints",
         "no-priority": "no-prio", "no-retention": "no-ret", "no-prefetch": "no-pref", "no-host-tier": "no-host",
         "no-routing": "no-rout"}


def _ci(ci: list) -> str:
    return "-" if ci[0] is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def print_report(name: str, out: dict, names: list[str]) -> None:
    st, la = out["settings"], out["load_average"]
    print(f"\n== condition {name}: {out['workload']['doc']} ==")
    print(f"{len(st['seeds'])} seeds x {st['workflows']} workflows, {arrivals_label(st)}, pool "
          f"{st['pool_tokens']} tokens, {st['max_running']} running slots per replica, time x{st['time_scale']}, "
          f"tokens x{st['token_scale']}, {st['replicas']} replica(s) per arm; load average "
          f"{la['start'][0]:.1f} -> {la['end'][0]:.1f} on "
          f"{la['cpus']} CPUs, {la['minutes']:.1f} min")
    head = f"{'seed':>4} " + " ".join(f"{SHORT[n] + ' avg':>12} {SHORT[n] + ' p95':>12}" for n in names)
    print("measured JCT (s) and prompt share served from cache")
    print(head + "   cached " + "/".join(SHORT[n] for n in names))
    for seed, v in out["seeds"].items():
        print(f"{seed:>4} " + " ".join(f"{v[n]['jct_avg_s']:>12.2f} {v[n]['jct_p95_s']:>12.2f}" for n in names)
              + "   " + "/".join(f"{(v[n]['cached_fraction'] or 0):.0%}" for n in names))
    print(f"\n{'arm':<13} {'errors':>6} {'calls':>6} {'annotated':>9} {'cached':>7} {'queue mean':>10} "
          f"{'p90':>5} {'max':>4} {'running max':>11}  plugin counters")
    for n in names:
        a = out["arms"][n]
        q = a["queue_depth"]
        ann = "-" if a["annotated_share"] is None else f"{a['annotated_share']:.0%}"
        qm = "-" if q["mean"] is None else f"{q['mean']:.2f}"
        print(f"{n:<13} {a['errors']:>6} {a['calls']:>6} {ann:>9} {(a['cached_fraction'] or 0):>7.0%} {qm:>10} "
              f"{q['p90'] if q['p90'] is not None else '-':>5} {q['max'] if q['max'] is not None else '-':>4} "
              f"{q['running_max'] if q['running_max'] is not None else '-':>11}  "
              + ", ".join(f"{k}={v}" for k, v in a.get("plugin_counters", {}).items()))
    for n in names:
        hooks = {k[len("hook_us_"):]: v / 1e6 for k, v in out["arms"][n].get("plugin_counters", {}).items()
                 if k.startswith("hook_us_")}
        wall = sum(v[n].get("wall_s") or 0.0 for v in out["seeds"].values())
        if hooks and wall > 0:
            print(f"plugin hook time, {n}: {sum(hooks.values()):.2f} s in all = {sum(hooks.values()) / wall:.1%} of its "
                  f"{wall:.0f} s of replay (" + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(hooks.items())) + ")")
    sim = out.get("simulator")
    if not out["ratios"]:
        return
    n_seeds = len(st["seeds"])
    print(f"\n{'ratio, mean of ' + str(n_seeds) + ' seeds':<26} {'avg':>6} {'95% interval':>14} {'p95':>6} "
          f"{'95% interval':>14}" + (f" {'sim avg':>8} {'sim err':>8}" if sim else ""))
    for key, r in out["ratios"].items():
        if r["mean_avg"] is None:
            print(f"{key:<26} {r.get('refused') or 'no seed'}")
            continue
        line = (f"{key:<26} {r['mean_avg']:>6.3f} {_ci(r['ci_avg']):>14} {r['mean_p95']:>6.3f} "
                f"{_ci(r['ci_p95']):>14}")
        if sim and key in sim["ratios"]:
            f = out["fidelity"]["ratios"].get(key)
            f = f if f and f["pass"] is not None else None
            line += (f" {sim['ratios'][key]['mean_avg']:>8.3f} {(f['abs_error'] if f else float('nan')):>+8.3f}"
                     + (f" {'pass' if f['pass'] else 'FAIL'}" if f else ""))
        if r.get("withheld"):
            line += f"   ({len(r['withheld'])} seed(s) withheld: {'; '.join(withheld_reasons(r['withheld']))})"
        print(line)
    print("(ratio < 1: the arm's JCT is shorter than the baseline's; interval: Student t over seeds; "
          "sim err: simulated - measured ratio, pass within 0.05)")
    if sim:
        fa = out["fidelity"]["arms"]
        print("simulated vs measured avg JCT per arm (pass within 15 %): "
              + ", ".join(f"{a} {v['simulated']:.2f}/{v['measured']:.2f}s {v['rel_error']:+.0%} "
                          f"{'pass' if v['pass'] else 'FAIL'}" for a, v in fa.items())
              + "; fidelity " + {True: "PASS", False: "FAIL", None: "not judged (a ratio was refused)"}[
                  out["fidelity"]["pass"]])
        ps = out.get("prefill_share") or {}
        if ps.get("calibration") is not None:
            print(f"prefill share of a call's time served alone: measured {ps['calibration']:.0%} (calibration "
                  f"replay), step model on this workload {ps['model']:.0%}")
    if out.get("refused"):
        print(f"REFUSED part way: {out['refused']}")


if __name__ == "__main__":
    main()
