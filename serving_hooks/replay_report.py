"""Summaries of a replay: per-workflow JCT, per-call TTFT and latency, tokens, throughput, errors.

JCT (job completion time) of a workflow = its last call's finish - the moment it was released
(with ``--concurrency``, when it got its slot; with ``--rate``, its arrival time, or its slot when
a concurrency cap also applies). Percentiles are numpy's linear-interpolation percentiles.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from serving_hooks.replay import ReplayResult


def _dist(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"avg": None, "p50": None, "p95": None, "max": None}
    a = np.asarray(values, dtype=float)
    return {"avg": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p95": float(np.percentile(a, 95)), "max": float(a.max())}


def summarize(result: ReplayResult) -> dict[str, Any]:
    """Everything `profiler replay` prints, as one JSON-ready dict."""
    ok = [c for c in result.calls if c.status == "ok"]
    wall = max(result.wall_s, 1e-9)
    prompt = [c.prompt_tokens for c in ok if c.prompt_tokens is not None]
    completion = [c.completion_tokens for c in ok if c.completion_tokens is not None]
    cached = [c.cached_tokens for c in ok if c.cached_tokens is not None]
    cached_prompt = sum(c.prompt_tokens or 0 for c in ok if c.cached_tokens is not None)
    errors = Counter(c.error for c in result.calls if c.status != "ok")
    wfs = result.workflows
    return {
        "target": result.target,
        "model": result.model,
        "wall_s": result.wall_s,
        "options": {"concurrency": result.options.concurrency, "rate": result.options.rate,
                    "cv": result.options.cv, "time_scale": result.options.time_scale,
                    "seed": result.options.seed, "ignore_eos": result.options.ignore_eos,
                    "identity": result.options.identity, "run_tag": result.options.run_tag},
        "workflows": {
            "count": len(wfs),
            "with_errors": sum(w.errors > 0 for w in wfs),
            "jct_s": _dist([w.jct_s for w in wfs]),
            "recorded_jct_s": _dist([w.recorded_jct_s for w in wfs]),
            "per_s": len(wfs) / wall,
        },
        "calls": {
            "count": len(result.calls),
            "errors": len(result.calls) - len(ok),
            "ttft_s": _dist([c.t_first_token - c.t_send for c in ok if c.t_first_token]),
            "latency_s": _dist([c.t_finish - c.t_send for c in ok if c.t_finish]),
            "per_s": len(ok) / wall,
        },
        "tokens": {
            "recorded_input": int(sum(c.recorded_input_tokens for c in result.calls)),
            "recorded_output": int(sum(c.recorded_output_tokens for c in result.calls)),
            "prompt": int(sum(prompt)) if prompt else None,
            "completion": int(sum(completion)) if completion else None,
            "cached": int(sum(cached)) if cached else None,
            "cached_fraction": (sum(cached) / cached_prompt) if cached and cached_prompt else None,
            "output_per_s": (sum(completion) / wall) if completion else None,
        },
        "errors": [{"error": e, "count": n} for e, n in errors.most_common(5)],
    }


def call_records(result: ReplayResult) -> list[dict[str, Any]]:
    """One flat log record (log-format section 1) per replayed call: `profiler fit` reads them."""
    out = []
    for c in result.calls:
        rec = {"request_id": c.request_id, "workflow_type_id": c.workflow_type_id,
               "workflow_id": c.workflow_id, "agent_id": c.agent_id, "model": result.model,
               "t_arrival": c.t_send, "t_finish": c.t_finish if c.t_finish is not None else c.t_send,
               "input_tokens": c.prompt_tokens if c.prompt_tokens is not None else c.recorded_input_tokens,
               "output_tokens": c.completion_tokens if c.completion_tokens is not None else 0,
               "status": c.status,
               "recorded_input_tokens": c.recorded_input_tokens,
               "recorded_output_tokens": c.recorded_output_tokens}
        if c.t_first_token is not None:
            rec["t_first_token"] = c.t_first_token
        if c.cached_tokens is not None:
            rec["cached_tokens"] = c.cached_tokens
        if c.error:
            rec["error"] = c.error
        out.append(rec)
    return out


def render_table(summary: dict[str, Any]):
    """A rich table of :func:`summarize`'s figures."""
    from rich.table import Table

    def s(v: float | None, unit: str = "s") -> str:
        return "—" if v is None else f"{v:.3f}{unit}" if unit == "s" else f"{v:,.1f}{unit}"

    t = Table(title=f"replay → {summary['target']} ({summary['model']}), wall {summary['wall_s']:.1f}s")
    t.add_column("metric")
    t.add_column("avg", justify="right")
    t.add_column("p50", justify="right")
    t.add_column("p95", justify="right")
    t.add_column("max", justify="right")
    w, c, tok = summary["workflows"], summary["calls"], summary["tokens"]
    for name, d in (("workflow JCT", w["jct_s"]), ("recorded JCT", w["recorded_jct_s"]),
                    ("call TTFT", c["ttft_s"]), ("call latency", c["latency_s"])):
        t.add_row(name, s(d["avg"]), s(d["p50"]), s(d["p95"]), s(d["max"]))
    t.add_section()
    t.add_row("workflows", f"{w['count']} ({w['with_errors']} with errors)", "", "", "")
    t.add_row("calls", f"{c['count']} ({c['errors']} errors)", "", "", "")
    t.add_row("throughput", f"{c['per_s']:.2f} calls/s",
              "—" if tok["output_per_s"] is None else f"{tok['output_per_s']:,.0f} out tok/s", "", "")
    t.add_row("prompt tokens", "—" if tok["prompt"] is None else f"{tok['prompt']:,}",
              f"recorded {tok['recorded_input']:,}", "", "")
    t.add_row("output tokens", "—" if tok["completion"] is None else f"{tok['completion']:,}",
              f"recorded {tok['recorded_output']:,}", "", "")
    frac = tok["cached_fraction"]
    t.add_row("cached tokens", "not reported" if tok["cached"] is None else f"{tok['cached']:,}",
              "" if frac is None else f"{100 * frac:.1f}% of prompt", "", "")
    return t
