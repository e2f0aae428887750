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

``--stream`` runs the relay benchmark instead (issue 35): the gateway (logging, annotating, in
its own process) and the fake engine (another process, 64 chunks at 50 tokens/s when streamed,
at once otherwise) under two loads, each direct and through the gateway in one run, in the order
direct, gateway, gateway, direct: a closed loop of 32 non-streaming clients (throughput ratio,
target ≥ 0.4× direct) and 32 concurrent streamed sessions, staggered over one call's length
(added TTFT p99 ≤ 5 ms, added inter-chunk gap p99 ≤ 2 ms, 0 errors). The load comes from
separate generator processes (aiohttp, uvloop when installed); the CPU each process used is
printed beside the figures (cores, and µs per request or relayed chunk), so a saturated
generator or a busy machine shows.

Usage::

    python bench/bench_serving.py               # ~1 minute on 2 cores
    python bench/bench_serving.py --quick       # smaller counts, a smoke run
    python bench/bench_serving.py --json        # one JSON object instead of the table
    python bench/bench_serving.py --stream      # the relay benchmark, ~2 minutes

Servers listen on 127.0.0.1 only; every loop is bounded in count and time.
"""
from __future__ import annotations

import argparse
import asyncio
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


def start(cmd: list[str], ready_url: str, output: Path | None = None) -> subprocess.Popen:
    """Start a server and wait until ``ready_url`` answers. With ``output``, its stdout/stderr go
    to that file (a server under load may log more than a pipe holds, and block on it)."""
    sink = open(output, "w") if output is not None else subprocess.PIPE
    proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if output is not None:
        sink.close()
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
    from policies import PriorityPolicy
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


# --------------------------------------------------------------------------- 4. relay (--stream)
CHAT_MESSAGES = [{"role": "system", "content": "You are the engineer agent. " * 40},
                 {"role": "user", "content": "Fix the failing test in utils.py. " * 20}]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _bodies(seqs: list, tag: str, stream: bool, n: int, concurrent: int) -> list[bytes]:
    """``n`` encoded chat bodies replaying real sessions (``concurrent`` interleaved), each with
    its ``app_metadata`` and its call number in the prompt (so no call repeats an earlier one's
    bytes, which the gateway would take for a retry); the same bytes go to the direct path (the
    fake engine ignores ``app_metadata``)."""
    out = []
    for k, (wf, agent, _) in enumerate(session_calls(seqs, n, concurrent=concurrent)):
        messages = CHAT_MESSAGES + [{"role": "user", "content": f"Call {k}: go on."}]
        body = {"model": "m", "messages": messages, "stream": stream,
                "app_metadata": {"workflow_type_id": "coding_assistant",
                                 "workflow_id": f"{tag}-{wf}", "agent_id": agent}}
        out.append(json.dumps(body).encode())
    return out


async def _closed_loop(url: str, bodies: list[bytes], clients: int, start_at: float,
                       duration_s: float) -> dict:
    """``clients`` closed-loop clients (each sends its next call when the last one answered)."""
    import aiohttp
    latencies: list[float] = []
    errors = [0]
    deadline = start_at + duration_s
    headers = {"content-type": "application/json"}

    async def client(session: aiohttp.ClientSession, part: list[bytes]) -> None:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        for body in part:
            if time.time() >= deadline:
                return
            t0 = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as r:
                    await r.read()
                    ok = r.status == 200
            except aiohttp.ClientError:
                ok = False
            latencies.append(time.perf_counter() - t0)
            errors[0] += not ok

    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=30)) as s:
        await asyncio.gather(*(client(s, bodies[k::clients]) for k in range(clients)))
    return {"latencies": latencies, "errors": errors[0]}


async def _streams(url: str, bodies: list[bytes], sessions: int, start_at: float,
                   duration_s: float, chunks: int, stagger_s: float = 0.0) -> dict:
    """``sessions`` concurrent streamed sessions, one call after another: per call the time to
    its first token (first content chunk) and the gaps between consecutive events; an error is a
    non-200, a broken stream, or a stream without ``[DONE]`` or with the wrong chunk count."""
    import aiohttp
    ttft: list[float] = []
    gaps: list[float] = []
    errors = [0]
    calls = [0]
    deadline = start_at + duration_s
    headers = {"content-type": "application/json", "x-fake-tokens": str(chunks)}

    async def session_loop(session: aiohttp.ClientSession, part: list[bytes], k: int) -> None:
        # staggered over one call's length: sessions in steady state, not a synchronized burst
        # of every session's first call (which would measure queueing of that burst)
        await asyncio.sleep(max(0.0, start_at + k * stagger_s - time.time()))
        for body in part:
            if time.time() >= deadline:
                return
            t0 = time.perf_counter()
            first, last, seen, done = None, None, 0, False
            try:
                async with session.post(url, data=body, headers=headers) as r:
                    if r.status != 200:
                        await r.read()
                        errors[0] += 1
                        continue
                    async for line in r.content:
                        if not line.startswith(b"data:"):
                            continue
                        now = time.perf_counter()
                        if line.startswith(b"data: [DONE]"):
                            done = True
                            continue
                        token = b"tok" in line   # the fake engine's words: tok0 tok1 …
                        if first is None and token:
                            first = now
                        if last is not None:
                            gaps.append(now - last)
                        last = now
                        seen += token
            except aiohttp.ClientError:
                errors[0] += 1
                continue
            calls[0] += 1
            if not done or seen != chunks or first is None:
                errors[0] += 1
            else:
                ttft.append(first - t0)

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as s:
        await asyncio.gather(*(session_loop(s, bodies[k::sessions], k) for k in range(sessions)))
    return {"ttft": ttft, "gaps": gaps, "errors": errors[0], "calls": calls[0]}


def _relay_load_process(mode: str, url: str, seqs: list, tag: str, n_bodies: int, clients: int,
                        start_at: float, duration_s: float, chunks: int, stagger_s: float) -> dict:
    """One load-generator process (its own event loop, uvloop when installed); returns the raw
    samples and the CPU seconds it used, so a saturated generator shows in the report."""
    bodies = _bodies(seqs, tag, mode == "stream", n_bodies, clients * 2)
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    cpu0 = time.process_time()
    if mode == "closed":
        out = runner(_closed_loop(url, bodies, clients, start_at, duration_s))
    else:
        out = runner(_streams(url, bodies, clients, start_at, duration_s, chunks, stagger_s))
    out["cpu_s"] = time.process_time() - cpu0
    return out


def _relay_phase(pool, mode: str, url: str, seqs, tag: str, clients: int, duration_s: float,
                 processes: int, chunks: int, watch: dict[str, int], call_s: float = 0.0) -> dict:
    """One measured phase: ``clients`` spread over ``processes`` generator processes, from one
    wall-clock instant (streams staggered over ``call_s``, one call's length); the CPU the
    watched servers and the generators used over the phase, in cores."""
    per = max(1, clients // processes)
    # enough calls for ~6,000 req/s per generator process (closed) or 1 s per stream
    n_bodies = per * (int(duration_s * 6000) // per + 1) if mode == "closed" else \
        per * (int(duration_s / 1.0) + 2)
    start_at = time.time() + 2.0   # every process has built its bodies by then
    cpu0 = {name: _cpu_seconds(pid) for name, pid in watch.items()}
    parts = list(pool.map(_relay_load_process, [mode] * processes, [url] * processes,
                          [seqs[k:] + seqs[:k] for k in range(processes)],
                          [f"{tag}-p{k}" for k in range(processes)], [n_bodies] * processes,
                          [per] * processes,
                          [start_at + k * call_s / clients for k in range(processes)],
                          [duration_s] * processes, [chunks] * processes,
                          [call_s * processes / clients] * processes))
    cpu = {name: (_cpu_seconds(pid) - cpu0[name]) / duration_s for name, pid in watch.items()}
    cpu["load_generator"] = sum(p["cpu_s"] for p in parts) / duration_s
    out = {"errors": sum(p["errors"] for p in parts), "cpu_cores": cpu}
    if mode == "closed":
        lat = [x for p in parts for x in p["latencies"]]
        out.update(requests=len(lat), throughput_rps=len(lat) / duration_s,
                   p50_ms=pct(lat, 50) * 1e3, p99_ms=pct(lat, 99) * 1e3)
    else:
        ttft = [x for p in parts for x in p["ttft"]]
        gaps = [x for p in parts for x in p["gaps"]]
        out.update(calls=sum(p["calls"] for p in parts), chunks=len(gaps),
                   ttft_p50_ms=pct(ttft, 50) * 1e3 if ttft else None,
                   ttft_p99_ms=pct(ttft, 99) * 1e3 if ttft else None,
                   gap_p50_ms=pct(gaps, 50) * 1e3 if gaps else None,
                   gap_p99_ms=pct(gaps, 99) * 1e3 if gaps else None)
    # CPU per unit of work: robust to what else the machine runs (µs per request, per chunk)
    units = out["requests"] if mode == "closed" else out["chunks"]
    out["cpu_us_per_unit"] = {k: v * duration_s / max(units, 1) * 1e6 for k, v in cpu.items()}
    return out


def _merge(a: dict, b: dict, mode: str) -> dict:
    """Two phases of one path (ABBA order) as one: summed counts, the worse p99."""
    out = {"errors": a["errors"] + b["errors"],
           **{key: {k: (a[key][k] + b[key][k]) / 2 for k in a[key]}
              for key in ("cpu_cores", "cpu_us_per_unit")}}
    keys = ("throughput_rps", "p50_ms", "p99_ms") if mode == "closed" else \
        ("ttft_p50_ms", "ttft_p99_ms", "gap_p50_ms", "gap_p99_ms")
    for k in keys:
        vals = [x[k] for x in (a, b) if x.get(k) is not None]
        out[k] = (sum(vals) / len(vals) if k == "throughput_rps" else max(vals)) if vals else None
    for k in ("requests", "calls", "chunks"):
        if k in a:
            out[k] = a[k] + b[k]
    return out


def bench_relay(profile: Path, seqs, work: Path, *, clients: int, sessions: int, chunks: int,
                chunk_delay_s: float, duration_s: float, processes: int,
                gateway_args: list[str]) -> dict:
    """The gateway as a relay under load, side by side with the direct path in one run: a
    closed loop of ``clients`` non-streaming clients against a fake engine that answers at
    once, then ``sessions`` concurrent streams of ``chunks`` chunks at one per
    ``chunk_delay_s``. Each load runs direct, gateway, gateway, direct (ABBA), so drift in the
    machine's load falls on both paths alike."""
    from concurrent.futures import ProcessPoolExecutor
    up_port, gw_port = free_port(), free_port()
    up_url, gw_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{gw_port}"
    upstream = start([PY, "-m", "serving_hooks.fake_openai", "--port", str(up_port),
                      "--chunk-delay", str(chunk_delay_s)], up_url + "/v1/models",
                     output=work / "upstream.out")
    gateway = start(CLI + ["gateway", "--upstream", up_url, "--profile", str(profile), "--port",
                           str(gw_port), "--log-dir", str(work / "relay-logs"), "--sglang-fields",
                           "--log-level", "warning", *gateway_args], gw_url + "/healthz",
                    output=work / "gateway.out")
    watch = {"engine": upstream.pid, "gateway": gateway.pid}
    paths = {"direct": up_url + "/v1/chat/completions", "gateway": gw_url + "/v1/chat/completions"}
    res: dict = {"closed": {}, "stream": {}}
    try:
        with ProcessPoolExecutor(processes) as pool:
            _relay_phase(pool, "closed", paths["gateway"], seqs, "warm", clients, 1.0, processes,
                         chunks, watch)   # warm-up: connections, lazy structures, the log file
            _relay_phase(pool, "closed", paths["direct"], seqs, "warm", clients, 1.0, processes,
                         chunks, watch)
            for mode, n, dur in (("closed", clients, duration_s), ("stream", sessions, duration_s)):
                runs: dict[str, list] = {"direct": [], "gateway": []}
                for i, which in enumerate(("direct", "gateway", "gateway", "direct")):
                    runs[which].append(_relay_phase(
                        pool, mode, paths[which], seqs, f"{mode}{i}", n, dur, processes, chunks,
                        watch, call_s=chunks * chunk_delay_s if mode == "stream" else 0.0))
                res[mode] = {k: _merge(*v, mode) for k, v in runs.items()}
        res["gateway_log_lines"] = sum(sum(1 for _ in open(f)) for f in
                                       (work / "relay-logs").glob("*.jsonl*"))
    finally:
        stop(gateway)
        stop(upstream)
    c, s = res["closed"], res["stream"]
    res["throughput_ratio"] = c["gateway"]["throughput_rps"] / c["direct"]["throughput_rps"]
    res["added_ttft_p99_ms"] = s["gateway"]["ttft_p99_ms"] - s["direct"]["ttft_p99_ms"]
    res["added_gap_p99_ms"] = s["gateway"]["gap_p99_ms"] - s["direct"]["gap_p99_ms"]
    res["errors"] = sum(x["errors"] for m in (c, s) for x in m.values())
    return res


def print_targets(title: str, rows: list[tuple[str, str, str, str]], width: int | None = None) -> None:
    """One table of (measure, measured, target, met) rows, as both benchmarks print them."""
    from rich.console import Console
    from rich.table import Table
    table = Table(title=title)
    for col in ("measure", "measured", "target", "met"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console(width=width).print(table)


def print_relay(res: dict, args) -> None:
    ok = lambda good: "yes" if good else "NO"
    c, s, m = res["relay"]["closed"], res["relay"]["stream"], res["machine"]
    r = res["relay"]
    cpu = lambda x: ", ".join(f"{k} {v:.2f}" for k, v in x["cpu_cores"].items())
    rows = [
        (f"closed loop ({args.concurrency} clients): direct", f"{c['direct']['throughput_rps']:.0f} req/s, "
         f"p99 {c['direct']['p99_ms']:.1f} ms", "", ""),
        ("  through the gateway", f"{c['gateway']['throughput_rps']:.0f} req/s, "
         f"p99 {c['gateway']['p99_ms']:.1f} ms", "", ""),
        ("  throughput ratio gateway / direct", f"{r['throughput_ratio']:.2f}×", ">= 0.4×",
         ok(r["throughput_ratio"] >= 0.4)),
        ("  CPU cores used, direct", cpu(c["direct"]), "", ""),
        ("  CPU cores used, gateway", cpu(c["gateway"]), "", ""),
        ("  CPU µs per request: gateway / engine", f"{c['gateway']['cpu_us_per_unit']['gateway']:.0f}"
         f" / {c['direct']['cpu_us_per_unit']['engine']:.0f}", "", ""),
        (f"streams ({args.sessions} sessions, {args.chunks} chunks at {1 / args.chunk_delay:.0f}/s): "
         "TTFT p99 direct / gateway", f"{s['direct']['ttft_p99_ms']:.1f} / "
         f"{s['gateway']['ttft_p99_ms']:.1f} ms", "", ""),
        ("  added TTFT p99", f"{r['added_ttft_p99_ms']:.2f} ms", "<= 5 ms", ok(r["added_ttft_p99_ms"] <= 5)),
        ("  inter-chunk gap p99 direct / gateway", f"{s['direct']['gap_p99_ms']:.1f} / "
         f"{s['gateway']['gap_p99_ms']:.1f} ms", "", ""),
        ("  added inter-chunk gap p99", f"{r['added_gap_p99_ms']:.2f} ms", "<= 2 ms",
         ok(r["added_gap_p99_ms"] <= 2)),
        ("  CPU cores used, direct", cpu(s["direct"]), "", ""),
        ("  CPU cores used, gateway", cpu(s["gateway"]), "", ""),
        ("  CPU µs per relayed chunk: gateway / engine", f"{s['gateway']['cpu_us_per_unit']['gateway']:.0f}"
         f" / {s['direct']['cpu_us_per_unit']['engine']:.0f}", "", ""),
        ("errors (all phases)", str(r["errors"]), "0", ok(r["errors"] == 0)),
        ("gateway log lines written", str(r["gateway_log_lines"]), "", ""),
    ]
    print_targets(f"gateway relay benchmark ({m['cpus']} cores, load average "
                  f"{m['loadavg_1m_at_start']:.1f} → {m['loadavg_1m_at_end']:.1f}; "
                  f"{args.duration:g} s per phase, direct/gateway/gateway/direct)", rows, width=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workflows", type=int, default=300, help="generated sessions to fit the profile on")
    ap.add_argument("--annotations", type=int, default=50_000, help="in-process annotate calls")
    ap.add_argument("--concurrency", type=int, default=32, help="concurrent sidecar clients (--stream: closed-loop clients)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of sidecar load (--stream: of each phase)")
    ap.add_argument("--client-processes", type=int, default=2, help="load-generator processes "
                    "(the concurrent clients are threads spread over them)")
    ap.add_argument("--gateway-requests", type=int, default=2000, help="requests per path (direct, gateway)")
    ap.add_argument("--stream", action="store_true", help="the relay benchmark instead: a "
                    "closed loop of --concurrency non-streaming clients, then --sessions "
                    "concurrent streams, each direct and through the gateway in one run "
                    "(direct, gateway, gateway, direct; --duration seconds each); prints the "
                    "throughput ratio, the added TTFT and inter-chunk gap p99 and the errors")
    ap.add_argument("--sessions", type=int, default=32, help="--stream: concurrent streamed sessions")
    ap.add_argument("--chunks", type=int, default=64, help="--stream: content chunks per streamed call")
    ap.add_argument("--chunk-delay", type=float, default=0.02, help="--stream: seconds between "
                    "the fake engine's chunks (0.02: 50 tokens/s)")
    ap.add_argument("--gateway-arg", action="append", default=[], metavar="ARG", help="--stream: "
                    "one more `profiler gateway` argument, e.g. --gateway-arg=--workers=2 (repeat)")
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
        if args.stream:
            res = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                               "loadavg_1m_at_start": load_before},
                   "relay": bench_relay(profile, seqs, work, clients=args.concurrency,
                                        sessions=args.sessions, chunks=args.chunks,
                                        chunk_delay_s=args.chunk_delay, duration_s=args.duration,
                                        processes=args.client_processes,
                                        gateway_args=args.gateway_arg)}
            res["machine"]["loadavg_1m_at_end"] = os.getloadavg()[0]
            print(json.dumps(res, indent=2)) if args.json else print_relay(res, args)
            return
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
    m = res["machine"]
    print_targets(f"serving benchmark ({m['cpus']} cores, load average "
                  f"{m['loadavg_1m_at_start']:.1f} → {m['loadavg_1m_at_end']:.1f}; profile of "
                  f"{args.workflows} sessions fit in {fit_s:.1f}s)", rows)


if __name__ == "__main__":
    main()
