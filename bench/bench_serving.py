"""Serving benchmark: predictor, sidecar and gateway latency, in one run.

Prints, side by side with their targets:

1. in-process ``Predictor.annotate`` p50/p99 (target p99 < 1 ms), replaying real sessions of a
   generated coding-assistant workload through a profile fit on it (path fields included);
2. the sidecar (``profiler serve``, its own process) under 32 concurrent clients: throughput and
   p99 of ``POST /v1/annotate``;
3. the gateway's added latency (``profiler gateway --profile``, its own process, in front of the
   fake OpenAI upstream in another process): the same chat request sent alternately straight to
   the upstream and through the gateway; added = gateway percentile − direct percentile
   (target p99 < 2 ms). The gateway's own pre-forwarding time from its /metrics histogram is
   printed as well.

Usage::

    python bench/bench_serving.py               # ~1 minute on 2 cores
    python bench/bench_serving.py --quick       # smaller counts, a smoke run
    python bench/bench_serving.py --json        # one JSON object instead of the table

Servers listen on 127.0.0.1 only; every loop is bounded in count and time.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CLI = [PY, "-c", "from profiler.cli import main; main()"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s")


def start(cmd: list[str], ready_url: str) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wait_ready(ready_url, proc)
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def pct(values, q) -> float:
    return float(np.percentile(np.asarray(values), q))


# --------------------------------------------------------------------------- 0. the profile
def build_profile(work: Path, n_workflows: int) -> tuple[Path, list[list[str]]]:
    from fitting import profile_fit as fitting
    from store.duckdb_store import connect
    from store.workloads import generate, write_jsonl

    write_jsonl(generate("coding_assistant", n_workflows, seed=42), work / "logs" / "ca.jsonl")
    fitting.fit_profile([work / "logs"], work / "profile")
    con = connect(work / "profile" / "store.duckdb", read_only=True)
    seqs = [s for (s,) in con.execute(
        "SELECT list(struct_pack(agent := agent_id, out := output_tokens) ORDER BY call_index) "
        "FROM calls GROUP BY workflow_id ORDER BY workflow_id").fetchall()]
    con.close()
    return work / "profile", seqs


def session_calls(seqs: list[list[dict]], n: int, concurrent: int = 64):
    """``n`` (workflow_id, agent, output_tokens) calls: ``concurrent`` sessions interleaved, each
    replaying a real session of the data; a finished session is replaced by a new one."""
    out, live, k = [], [], 0
    while len(out) < n:
        while len(live) < concurrent:
            live.append([f"wf-{k}", list(seqs[k % len(seqs)])])
            k += 1
        i = len(out) % len(live)
        wf, rest = live[i]
        call = rest.pop(0)
        out.append((wf, call["agent"], call["out"]))
        if not rest:
            live.pop(i)
    return out


# --------------------------------------------------------------------------- 1. in process
def bench_in_process(profile: Path, seqs, n: int) -> dict:
    from predictors import Predictor
    from serving_hooks.policies import PriorityPolicy
    from serving_hooks.shadow import ShadowGate

    p = Predictor(profile, gate=ShadowGate())
    priority = PriorityPolicy()   # what PredictionService adds to a known call
    calls = session_calls(seqs, n)
    times = np.empty(n)
    known = 0
    for i, (wf, agent, out) in enumerate(calls):
        meta = {"workflow_type_id": "coding_assistant", "workflow_id": wf, "agent_id": agent}
        t0 = time.perf_counter()
        call = p.annotate_call(meta, request_id=f"r{i}", input_tokens=2000)
        if call.known:
            call = replace(call, priority=priority.call_priority(call))
        ann = call.to_dict()
        times[i] = time.perf_counter() - t0
        known += ann["known"]
        p.observe({"app_metadata": meta, "request_id": f"r{i}", "output_tokens": out})
    return {"calls": n, "p50_us": pct(times, 50) * 1e6, "p99_us": pct(times, 99) * 1e6,
            "max_us": float(times.max() * 1e6), "known_share": known / n}


# --------------------------------------------------------------------------- 2. sidecar
def _client_process(url: str, seqs: list, worker: int, threads: int, start_at: float,
                    duration_s: float) -> tuple[list[float], int]:
    """One load-generator process: ``threads`` clients, each replaying its own sessions one
    call after another over its own keep-alive connection, from ``start_at`` (a wall-clock time
    shared by all processes, so set-up is not timed) for ``duration_s`` seconds."""
    import threading as th
    latencies: list[float] = []
    errors = [0]
    calls = session_calls(seqs[worker:] + seqs[:worker], 60_000, concurrent=threads * 4)
    calls = [(f"p{worker}-{wf}", agent, out) for wf, agent, out in calls]
    deadline = start_at + duration_s

    def client(part: list) -> None:
        with httpx.Client(base_url=url, timeout=10.0) as c:
            time.sleep(max(0.0, start_at - time.time()))
            for wf, agent, _ in part:
                if time.time() >= deadline:
                    return
                t0 = time.perf_counter()
                r = c.post("/v1/annotate", json={"app_metadata": {
                    "workflow_type_id": "coding_assistant", "workflow_id": wf, "agent_id": agent}})
                latencies.append(time.perf_counter() - t0)
                errors[0] += r.status_code != 200

    workers = [th.Thread(target=client, args=(calls[k::threads],)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return latencies, errors[0]


def _load(url: str, seqs, concurrency: int, duration_s: float, processes: int) -> dict:
    from concurrent.futures import ProcessPoolExecutor
    per = max(1, concurrency // processes)
    with ProcessPoolExecutor(processes) as pool:
        start_at = time.time() + 2.0  # every process has built its calls and connected by then
        parts = list(pool.map(_client_process, [url] * processes, [seqs] * processes,
                              range(processes), [per] * processes, [start_at] * processes,
                              [duration_s] * processes))
    latencies = [x for lat, _ in parts for x in lat]
    return {"concurrency": per * processes, "client_processes": processes,
            "requests": len(latencies), "errors": sum(e for _, e in parts), "seconds": duration_s,
            "throughput_rps": len(latencies) / duration_s,
            "p50_ms": pct(latencies, 50) * 1e3, "p99_ms": pct(latencies, 99) * 1e3}


def bench_sidecar(profile: Path, seqs, concurrency: int, duration_s: float, processes: int) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(CLI + ["serve", "--profile", str(profile), "--port", str(port),
                        "--log-level", "warning"], url + "/healthz")
    try:
        _load(url, seqs, concurrency, 1.0, processes)  # warm-up
        before = _scrape(url, "profiler_sidecar_request_seconds", "/v1/annotate")
        result = _load(url, seqs, concurrency, duration_s, processes)
        after = _scrape(url, "profiler_sidecar_request_seconds", "/v1/annotate")
        result["server_side_mean_ms"], result["server_side_p99_ms"] = _hist_stats(after, before)
    finally:
        stop(proc)
    return result


def _scrape(url: str, name: str, route: str | None = None) -> tuple[float, float, dict[float, float]]:
    """(sum, count, {le: cumulative count}) of a Prometheus histogram on a server's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families
    total = count = 0.0
    buckets: dict[float, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sm in fam.samples:
            if route is not None and sm.labels.get("route") != route:
                continue
            if sm.name == name + "_sum":
                total = sm.value
            elif sm.name == name + "_count":
                count = sm.value
            elif sm.name == name + "_bucket":
                buckets[float(sm.labels["le"])] = sm.value
    return total, count, buckets


def _hist_stats(after, before=(0.0, 0.0, {})) -> tuple[float | None, float | None]:
    """(mean, p99) in ms of what a histogram recorded between two scrapes; the p99 interpolates
    linearly inside its bucket, as PromQL's ``histogram_quantile`` does."""
    total, count = after[0] - before[0], after[1] - before[1]
    if count <= 0:
        return None, None
    rank, lo_edge, lo_cum, p99 = 0.99 * count, 0.0, 0.0, None
    for edge in sorted(after[2]):
        cum = after[2][edge] - before[2].get(edge, 0.0)
        if cum >= rank:
            p99 = edge if edge == float("inf") else \
                lo_edge + (edge - lo_edge) * (rank - lo_cum) / max(cum - lo_cum, 1e-12)
            break
        lo_edge, lo_cum = edge, cum
    return total / count * 1e3, (p99 * 1e3 if p99 is not None else None)


# --------------------------------------------------------------------------- 3. gateway
def bench_gateway(profile: Path, seqs, n: int, log_dir: Path) -> dict:
    up_port, gw_port = free_port(), free_port()
    up_url, gw_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{gw_port}"
    upstream = start([PY, "-m", "serving_hooks.fake_openai", "--port", str(up_port)], up_url + "/v1/models")
    gateway = start(CLI + ["gateway", "--upstream", up_url, "--profile", str(profile), "--port",
                           str(gw_port), "--log-dir", str(log_dir), "--sglang-fields",
                           "--log-level", "warning"], gw_url + "/healthz")
    calls = session_calls(seqs, n)
    messages = [{"role": "system", "content": "You are the engineer agent. " * 40},
                {"role": "user", "content": "Fix the failing test in utils.py. " * 20}]
    direct, via = [], []
    annotated = 0
    try:
        with httpx.Client(timeout=10.0) as client:
            for i, (wf, agent, _) in enumerate(calls[: min(200, n)]):  # warm-up both paths
                client.post(up_url + "/v1/chat/completions", json={"model": "m", "messages": messages})
                client.post(gw_url + "/v1/chat/completions", json={"model": "m", "messages": messages,
                            "app_metadata": {"workflow_type_id": "coding_assistant",
                                             "workflow_id": "warm" + wf, "agent_id": agent}})
            for i, (wf, agent, _) in enumerate(calls):
                body = {"model": "m", "messages": messages}
                gw_body = {**body, "app_metadata": {"workflow_type_id": "coding_assistant",
                                                    "workflow_id": wf, "agent_id": agent}}
                order = [(up_url, body, direct), (gw_url, gw_body, via)]
                if i % 2:
                    order.reverse()  # no systematic first/second advantage
                for url, b, sink in order:
                    t0 = time.perf_counter()
                    r = client.post(url + "/v1/chat/completions", json=b)
                    sink.append(time.perf_counter() - t0)
                    assert r.status_code == 200, r.text
        overhead_ms, overhead_p99_ms = _hist_stats(_scrape(gw_url, "profiler_gateway_overhead_seconds"))
        from prometheus_client.parser import text_string_to_metric_families
        for fam in text_string_to_metric_families(httpx.get(gw_url + "/metrics").text):
            for sm in fam.samples:
                if sm.name == "profiler_gateway_annotate_total" and sm.labels.get("outcome") == "annotated":
                    annotated = int(sm.value)
    finally:
        stop(gateway)
        stop(upstream)
    d, v = np.asarray(direct), np.asarray(via)
    return {"requests": n, "direct_p50_ms": pct(d, 50) * 1e3, "direct_p99_ms": pct(d, 99) * 1e3,
            "gateway_p50_ms": pct(v, 50) * 1e3, "gateway_p99_ms": pct(v, 99) * 1e3,
            "added_p50_ms": (pct(v, 50) - pct(d, 50)) * 1e3, "added_p99_ms": (pct(v, 99) - pct(d, 99)) * 1e3,
            "gateway_pre_forward_mean_ms": overhead_ms, "gateway_pre_forward_p99_ms": overhead_p99_ms,
            "annotated": annotated,
            "logged_files": len(list(log_dir.glob("*.jsonl*")))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workflows", type=int, default=300, help="generated sessions to fit the profile on")
    ap.add_argument("--annotations", type=int, default=50_000, help="in-process annotate calls")
    ap.add_argument("--concurrency", type=int, default=32, help="concurrent sidecar clients")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of sidecar load")
    ap.add_argument("--client-processes", type=int, default=2, help="load-generator processes "
                    "(the concurrent clients are threads spread over them)")
    ap.add_argument("--gateway-requests", type=int, default=2000, help="requests per path (direct, gateway)")
    ap.add_argument("--quick", action="store_true", help="small counts (smoke run)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if args.quick:
        args.workflows, args.annotations, args.duration, args.gateway_requests = 80, 5000, 2.0, 300
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        profile, seqs = build_profile(work, args.workflows)
        fit_s = time.perf_counter() - t0
        load_before = os.getloadavg()[0]
        res = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                           "loadavg_1m_at_start": load_before},
               "profile": {"workflows": args.workflows, "fit_seconds": fit_s},
               "in_process": bench_in_process(profile, seqs, args.annotations),
               "sidecar": bench_sidecar(profile, seqs, args.concurrency, args.duration, args.client_processes),
               "gateway": bench_gateway(profile, seqs, args.gateway_requests, work / "gw-logs")}
        res["machine"]["loadavg_1m_at_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(res, indent=2))
        return
    ip, sc, gw = res["in_process"], res["sidecar"], res["gateway"]
    ok = lambda good: "yes" if good else "NO"
    rows = [
        ("in-process annotate p50", f"{ip['p50_us']:.1f} µs", "", ""),
        ("in-process annotate p99", f"{ip['p99_us']:.1f} µs", "< 1000 µs", ok(ip["p99_us"] < 1000)),
        ("  (share known: true)", f"{ip['known_share']:.3f}", "", ""),
        (f"sidecar throughput ({sc['concurrency']} clients)", f"{sc['throughput_rps']:.0f} req/s", "", ""),
        ("sidecar p50 / p99 (client side)", f"{sc['p50_ms']:.2f} / {sc['p99_ms']:.2f} ms", "", ""),
        ("  sidecar server time mean / p99", f"{sc['server_side_mean_ms']:.2f} / {sc['server_side_p99_ms']:.2f} ms", "", ""),
        ("  sidecar errors", str(sc["errors"]), "0", ok(sc["errors"] == 0)),
        ("direct upstream p50 / p99", f"{gw['direct_p50_ms']:.2f} / {gw['direct_p99_ms']:.2f} ms", "", ""),
        ("through gateway p50 / p99", f"{gw['gateway_p50_ms']:.2f} / {gw['gateway_p99_ms']:.2f} ms", "", ""),
        ("gateway added p50", f"{gw['added_p50_ms']:.2f} ms", "", ""),
        ("gateway added p99", f"{gw['added_p99_ms']:.2f} ms", "< 2 ms", ok(gw["added_p99_ms"] < 2.0)),
        ("  gateway pre-forward time mean / p99", f"{gw['gateway_pre_forward_mean_ms']:.3f} / "
                                                   f"{gw['gateway_pre_forward_p99_ms']:.3f} ms", "", ""),
        ("  annotated requests", f"{gw['annotated']}", f">= {gw['requests']}", ok(gw["annotated"] >= gw["requests"])),
    ]
    from rich.console import Console
    from rich.table import Table
    m = res["machine"]
    table = Table(title=f"serving benchmark ({m['cpus']} cores, load average "
                        f"{m['loadavg_1m_at_start']:.1f} → {m['loadavg_1m_at_end']:.1f}; profile of "
                        f"{args.workflows} sessions fit in {fit_s:.1f}s)")
    for col in ("measure", "measured", "target", "met"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    main()
