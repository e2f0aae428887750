"""Present a comparison: a rich table per load, a PNG of JCT vs load, Markdown for the README."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

#: (column title, metric key, format) of the terminal and Markdown tables.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("avg JCT s", "avg_jct_s", "{:.1f}"),
    ("P95 JCT s", "p95_jct_s", "{:.1f}"),
    ("P99 JCT s", "p99_jct_s", "{:.1f}"),
    ("out tok/s", "throughput_tok_s", "{:.0f}"),
    ("wf/min", "workflows_per_min", "{:.2f}"),
    ("TTFT s", "avg_ttft_s", "{:.2f}"),
    ("GPU hit", "gpu_hit_ratio", "{:.2f}"),
    ("host hit", "host_hit_ratio", "{:.2f}"),
    ("recomputed tok", "recomputed_prefill_tokens", "{:,}"),
    ("÷ belady†", "recompute_vs_belady", "{:.2f}"),
    ("routing rc", "routing_recompute_share", "{:.1%}"),
    ("moved", "capacity_moved_sessions", "{:,}"),
    ("fallbacks", "capacity_fallbacks", "{:,}"),
    ("preempt", "preemptions", "{:,}"),
    ("GPU idle", "gpu_idle_share", "{:.1%}"),
    ("GPU·s held", "gpu_held_s", "{:,.0f}"),
)


RECOMPUTE_NOTE = ("† baselines: all recomputed prefill ÷ that of belady (session affinity, FCFS); "
                  "ours and its variants: eviction-caused recompute ÷ that of ours-belady (same "
                  "routing and scheduling, Bélády eviction). routing rc: prefill recomputed because "
                  "a call ran on another replica than the one that held its prefix, ÷ all prefill; "
                  "moved / fallbacks: sessions the capacity router sent off their replica / "
                  "decisions with no replica safe (ours only). oracle-srpt is a reference "
                  "(clairvoyant queue order, affinity routing, LRU), not a ceiling.")


def _fmt(row: dict, key: str, fmt: str) -> str:
    v = row.get(key)
    if v is None:
        return "–"
    if isinstance(v, float) and v != v:
        return "–"
    if isinstance(v, float) and v == float("inf"):
        return "∞"
    return fmt.format(v)


def _load_text(result: dict, block: dict) -> str:
    n = result["workload_summary"]["workflows"]
    if result.get("arrivals") == "burst":
        sc = result.get("scenario") or {}
        return (f"a burst of {n} workflows within {sc.get('burst_s', 0):.0f} s = "
                f"{block['load_share']:.2f} × the sessions that fill the GPU KV")
    if result.get("arrivals") == "closed":
        return (f"{block['sessions']} concurrent sessions = {block['load_share']:.2f} × the "
                f"{result['saturating_sessions']:.0f} that fill the GPU KV; {n} workflows")
    return (f"{result.get('arrivals')} arrivals, {block['rate_wf_per_s'] * 60:.2f} workflows/min = "
            f"{block['load_share']:.2f} × the KV-saturated drain rate; {n} workflows")


def speedup(rows: dict[str, dict], name: str, base: str = "sglang-default") -> float | None:
    """``avg JCT(base) / avg JCT(name)`` (how many times lower our JCT is)."""
    if name not in rows or base not in rows:
        return None
    return rows[base]["avg_jct_s"] / max(rows[name]["avg_jct_s"], 1e-9)


def tables(result: dict, console: Any) -> None:
    """One rich table per load on ``console``."""
    from rich.table import Table

    for level, block in result["loads"].items():
        rows = block["policies"]
        t = Table(title=(f"{result['workload']} — load {level} ({_load_text(result, block)})"))
        t.add_column("policy", style="bold", no_wrap=True)
        for title, _, _ in COLUMNS:
            t.add_column(title, justify="right")
        t.add_column("× vs sglang", justify="right")
        for name, row in rows.items():
            sp = speedup(rows, name)
            t.add_row(name, *[_fmt(row, k, f) for _, k, f in COLUMNS],
                      "–" if sp is None else f"{sp:.2f}")
        console.print(t)
        console.print(RECOMPUTE_NOTE)
        seeds = (result.get("seeds") or {}).get("loads", {}).get(level)
        if seeds:
            base = result["seeds"]["base"]
            console.print(f"over arrival seeds {result['seeds']['seeds']}: avg JCT mean ± sd, "
                          f"× vs {base} mean [min, max]")
            for name, row in seeds.items():
                ratio = (f"{row['ratio_mean']:.2f}× [{row['ratio_min']:.2f}, {row['ratio_max']:.2f}]"
                         if "ratio_mean" in row else "–")
                console.print(f"  {name:18s} {row['avg_jct_mean']:9.1f} ± {row['avg_jct_std']:6.1f} s  {ratio}")


def markdown(result: dict) -> str:
    """The same tables as Markdown (for the README and bench logs)."""
    lines = []
    for level, block in result["loads"].items():
        rows = block["policies"]
        lines.append(f"**{result['workload']}, load {level}** ({_load_text(result, block)})")
        lines.append("")
        head = ["policy", *[c[0] for c in COLUMNS], "× vs sglang"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for name, row in rows.items():
            sp = speedup(rows, name)
            cells = [name, *[_fmt(row, k, f) for _, k, f in COLUMNS], "–" if sp is None else f"{sp:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines.append(RECOMPUTE_NOTE)
        lines.append("")
    return "\n".join(lines)


def plot_jct_vs_load(results: Sequence[dict], out: str | Path) -> Path:
    """PNG: average JCT (solid) and P95 JCT (dashed; not for ablation variants) vs load share,
    one line per policy, one panel per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4.2), squeeze=False)
    for ax, res in zip(axes[0], results):
        loads = list(res["loads"].items())
        names: list[str] = []
        for _, block in loads:
            names += [p for p in block["policies"] if p not in names]
        for i, name in enumerate(names):
            xs, avg, p95 = [], [], []
            for _, block in loads:
                row = block["policies"].get(name)
                if row is None:
                    continue
                xs.append(block["load_share"])
                avg.append(row["avg_jct_s"])
                p95.append(row["p95_jct_s"])
            color = plt.cm.tab20(i % 20)
            variant = name.startswith("ours-")
            ax.plot(xs, avg, marker="x" if variant else "o", linewidth=1.0 if variant else 2.0,
                    color=color, label=name)
            if not variant:
                ax.plot(xs, p95, linestyle="--", color=color, alpha=0.4, linewidth=1.0)
        ax.set_title(res["workload"])
        ax.set_xlabel("load (share of the KV-saturated drain rate)")
        ax.set_ylabel("JCT s (solid: mean, dashed: P95)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def json_view(result: dict) -> dict:
    """The ``--json`` object: everything, plus top-level ``policies`` of the highest load."""
    out = dict(result)
    if result["loads"]:
        top = max(result["loads"].values(), key=lambda b: b["load_share"])
        out["policies"] = top["policies"]
        out["load"] = next(k for k, b in result["loads"].items() if b is top)
    return out
