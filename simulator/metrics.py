"""Figures of one simulation run (what the table, the plot and ``--json`` show).

======================  ===================================================================
key                     meaning
======================  ===================================================================
avg_jct_s, p95_jct_s    job completion time: last call's finish − workflow arrival, over the
                        measured window (warm-up and tail left out); p50_jct_s and p99_jct_s too
by_app                  per application (a mix's ``app:`` tag, else the workflow type): its
                        measured workflows' ``workflows``, ``avg``, ``p50``, ``p95``, ``p99`` JCT s
settling                mean JCT of the window's 2nd half ÷ its 1st half (≈ 1: settled)
throughput_tok_s        output tokens per second over the makespan
workflows_per_min       completed workflows per minute over the makespan
jobs_per_hour_per_gpu   completed workflows (jobs) per hour over the makespan, per GPU
                        (replicas × GPUs per replica): TensorRT-LLM trace replay's job metric
jobs_per_hour_per_user  3600 / avg_jct_s: the jobs one user finishes per hour running them
                        back to back (the per-user side of the same metric)
avg_ttft_s, p95_ttft_s  first token − issue, per call (queueing + host load + prefill); p50_ttft_s
                        and p99_ttft_s too
gpu_hit_ratio           prompt tokens served from the GPU tier / all prompt tokens
host_hit_ratio          prompt tokens loaded back from the host tier / all prompt tokens
reuse_hit_ratio         (GPU + host hits) / prompt tokens a cache could have served at all
prefill_tokens          prompt tokens computed (misses, recomputes, the first-time tokens)
recomputed_prefill_tokens  tokens computed again: evicted, on another replica, or preempted
eviction_/routing_/preemption_recomputed_tokens  recompute by cause: a segment this replica
                        held and evicted / one computed on another replica / a preempted call's
routing_recompute_share  routing-caused recompute ÷ prefill_tokens (the prefill a router's moves
                        cost); ours' rows also carry the router's ``capacity_decisions``,
                        ``capacity_fallbacks`` (no replica safe), ``capacity_affinity``,
                        ``capacity_moved_sessions``, ``capacity_move_recompute_tokens`` (its
                        own estimate of the moves' recompute, ``simulator.ours.ours_stats``) and
                        ``capacity_move_left_behind_tokens`` (the moved sessions' other agents'
                        prefixes left on the old replicas)
recompute_vs_belady     baselines: recomputed ÷ that of ``belady``; ours and its variants:
                        eviction-caused recompute ÷ that of ``ours-belady`` (same routing and
                        scheduling, Bélády eviction); ``recompute_reference`` says which
preemptions             running calls preempted because KV ran out (or by priority)
gpu_idle_s, gpu_idle_share  replica-seconds with nothing to run over the makespan
======================  ===================================================================
"""
from __future__ import annotations

import numpy as np

from simulator.engine import SimResult
from simulator.workload import Workload


def workflow_apps(wl: Workload) -> list[str]:
    """The application of each workflow: the ``app:`` tag a mix of applications puts before its
    ids (:func:`simulator.sources.mixed`, workload name ``mix(...)``), else the workflow type."""
    if wl.name.startswith("mix("):
        return [w.workflow_id.split(":", 1)[0] for w in wl.workflows]
    return [w.workflow_type for w in wl.workflows]


def jct_percentiles(jct: np.ndarray) -> dict[str, float]:
    """``avg``, ``p50``, ``p95``, ``p99`` of job completion times (s)."""
    p50, p95, p99 = np.percentile(jct, [50, 95, 99])
    return {"avg": float(jct.mean()), "p50": float(p50), "p95": float(p95), "p99": float(p99)}


def by_app(jct: np.ndarray, apps: list[str]) -> dict[str, dict]:
    """Per application, ``workflows`` and :func:`jct_percentiles` of its JCTs (``jct`` and
    ``apps`` aligned), applications in name order."""
    labels = np.asarray(apps, dtype=object)
    out: dict[str, dict] = {}
    for app in sorted(set(apps)):
        sel = jct[labels == app]
        out[app] = {"workflows": int(len(sel)), **jct_percentiles(sel)}
    return out


def summarize(res: SimResult, measured: np.ndarray | None = None) -> dict:
    """Figures of a run. With ``measured`` (a mask over workflows: the measured window), the JCT
    and TTFT figures cover those workflows only; ``settling`` is the mean JCT of the window's
    second half over its first half, by arrival (≈ 1 when the load settled; > 1.2 means a
    backlog still grows and the figures depend on the run length). Tail percentiles (P50 / P95 /
    P99) are reported beside every mean, overall and per application (``by_app``), so a policy
    that wins the mean by starving one application shows it."""
    wl = res.workload
    reqs = res.requests
    all_jct = res.wf_finish - res.wf_arrival
    mask = np.ones(len(all_jct), bool) if measured is None else np.asarray(measured, bool)
    jct = all_jct[mask]
    in_window = mask[[r.wf for r in reqs]]
    ttft = np.array([r.t_first - r.t_issue for r, m in zip(reqs, in_window) if m])
    order = np.argsort(res.wf_arrival[mask], kind="stable")
    half = len(order) // 2
    settling = (float(jct[order[half:]].mean() / max(jct[order[:half]].mean(), 1e-9))
                if half >= 2 else float("nan"))
    inp = sum(r.call.input_tokens for r in reqs)
    out = sum(r.call.output_tokens for r in reqs)
    reusable = sum(wl.path_tokens(r.call) for r in reqs)
    gpu_hit = sum(r.gpu_hit for r in reqs)
    host_hit = sum(r.host_hit for r in reqs)
    span = max(res.makespan_s, 1e-9)
    idle = sum(max(span - b, 0.0) for b in res.replica_busy_s)
    prefill = int(sum(r.computed for r in reqs))
    routing_rc = int(sum(r.recomputed - r.recomputed_evict - r.recomputed_preempt for r in reqs))
    jp = jct_percentiles(jct)
    apps = [a for a, m in zip(workflow_apps(wl), mask) if m]
    ttft_p50, ttft_p95, ttft_p99 = np.percentile(ttft, [50, 95, 99])
    return {
        "avg_jct_s": float(jct.mean()),
        "p50_jct_s": jp["p50"],
        "p95_jct_s": jp["p95"],
        "p99_jct_s": jp["p99"],
        "by_app": by_app(jct, apps),
        "throughput_tok_s": float(out / span),
        "workflows_per_min": float(len(jct) / span * 60.0),
        "jobs_per_hour_per_gpu": float(len(all_jct) / span * 3600.0
                                       / (res.config.replicas * res.config.gpus_per_replica)),
        "jobs_per_hour_per_user": float(3600.0 / max(float(jct.mean()), 1e-9)),
        "avg_ttft_s": float(ttft.mean()),
        "p50_ttft_s": float(ttft_p50),
        "p95_ttft_s": float(ttft_p95),
        "p99_ttft_s": float(ttft_p99),
        "gpu_hit_ratio": float(gpu_hit / max(inp, 1)),
        "host_hit_ratio": float(host_hit / max(inp, 1)),
        "reuse_hit_ratio": float((gpu_hit + host_hit) / max(reusable, 1)),
        "prefill_tokens": prefill,
        "recomputed_prefill_tokens": int(sum(r.recomputed for r in reqs)),
        "eviction_recomputed_tokens": int(sum(r.recomputed_evict for r in reqs)),
        "preemption_recomputed_tokens": int(sum(r.recomputed_preempt for r in reqs)),
        "routing_recomputed_tokens": routing_rc,
        "routing_recompute_share": float(routing_rc / max(prefill, 1)),
        "preemptions": int(res.preemptions),
        "gpu_idle_s": float(idle),
        "gpu_idle_share": float(idle / (span * len(res.replica_busy_s))),
        "makespan_s": float(res.makespan_s),
        "workflows": int(len(all_jct)),
        "measured_workflows": int(len(jct)),
        "settling": settling,
        "calls": int(len(reqs)),
        "host_loaded_tokens": int(res.host_loaded_tokens),
        "events": int(res.events),
    }


def interactive_types(records: list[dict]) -> set[str]:
    """Workflow types of the replayed records in which a person took a turn (a call marked
    ``wait_after = human``): their workflows are the interactive sessions of a run."""
    return {str(r.get("workflow_type_id")) for r in records if r.get("wait_after") == "human"}


def interactive_figures(res: SimResult, types: set[str], slo_s: float,
                        measured: np.ndarray | None = None) -> dict:
    """Time to first token of the calls of interactive sessions (workflow type in ``types``) and
    the job completion of the others (batch), over the measured window: ``ttft_p50_s``,
    ``ttft_p99_s``, ``slo_attainment`` (share of interactive calls whose TTFT ≤ ``slo_s``),
    ``calls``, ``sessions``, ``batch_avg_jct_s``, ``batch_p95_jct_s``, ``concurrent_sessions``
    (mean number of workflows in the system between the first arrival and the last finish)."""
    wl = res.workload
    mask = np.ones(len(wl.workflows), bool) if measured is None else np.asarray(measured, bool)
    inter = np.array([w.workflow_type in types for w in wl.workflows])
    ttft = np.array([r.t_first - r.t_issue for r in res.requests if inter[r.wf] and mask[r.wf]])
    jct = (res.wf_finish - res.wf_arrival)
    batch = jct[mask & ~inter]
    span = float(np.nanmax(res.wf_finish) - np.min(res.wf_arrival)) if len(jct) else 0.0
    out = {"slo_s": float(slo_s), "calls": int(len(ttft)), "sessions": int((inter & mask).sum()),
           "concurrent_sessions": float(jct.sum() / span) if span > 0 else 0.0}
    if len(ttft):
        out.update(ttft_p50_s=float(np.percentile(ttft, 50)), ttft_p99_s=float(np.percentile(ttft, 99)),
                   slo_attainment=float((ttft <= slo_s).mean()))
    if len(batch):
        out.update(batch_avg_jct_s=float(batch.mean()), batch_p95_jct_s=float(np.percentile(batch, 95)))
    return out


def add_belady_ratio(rows: dict[str, dict], reference: str = "belady",
                     key: str = "recompute_vs_belady",
                     tokens: str = "recomputed_prefill_tokens") -> None:
    """Set ``key`` (``tokens`` ÷ those of the ``reference`` row) on every row, in place."""
    ref = rows.get(reference)
    if ref is None:
        return
    base = ref[tokens]
    for row in rows.values():
        r = row[tokens]
        row[key] = float(r / base) if base > 0 else (1.0 if r == 0 else float("inf"))
        row["recompute_reference"] = f"{reference} ({tokens})"


def add_recompute_ratios(rows: dict[str, dict]) -> None:
    """The recompute ratio of each row against the Bélády run that shares its routing and
    scheduling: ours and its variants against ``ours-belady`` on **eviction-caused** recompute
    (what an eviction order can change; a session moved by the router or a preempted call is
    recomputed whatever the eviction), the baselines against ``belady`` (session affinity, FCFS)
    on all recompute. Both ratios are kept under their own keys as well."""
    add_belady_ratio(rows, "belady")
    ours = {n: row for n, row in rows.items() if n.startswith("ours")}
    add_belady_ratio(ours, "ours-belady", "recompute_vs_ours_belady")
    add_belady_ratio(ours, "ours-belady", "eviction_recompute_vs_ours_belady",
                     "eviction_recomputed_tokens")
    if "ours-belady" in rows:
        for row in ours.values():
            row["recompute_vs_belady"] = row["eviction_recompute_vs_ours_belady"]
