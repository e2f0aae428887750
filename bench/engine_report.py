"""What ``bench/bench_engine.py`` reports, as functions of what it measured (no engine needed).

* **Intervals** — a ratio (treatment JCT / baseline JCT) is taken per seed, since the arms of one
  seed replay the same workflows; its mean over seeds gets a two-sided Student-t interval,
  ``mean ± t_{0.975, n-1} · sd / √n`` (:func:`t_interval`). The seeds are the replicates: with 5
  seeds t = 2.78, so an interval is about ±1.2 sd wide — run-to-run noise of ±0.2 per seed
  leaves an interval of about ±0.25.
* **Queue depth** — SGLang logs ``#running-req`` and ``#queue-req`` (its waiting queue) with every
  prefill batch and every ``--decode-log-interval`` decode steps (40 by default). The bench
  notes each replica's log size before and after a run, and :func:`queue_samples` reads that
  run's lines: the queue an arm's calls met when the scheduler formed a batch (sampled per
  batch, not per second).
* **Engine counters** — the plugin's own counter names from its last ``agent-workflow plugin
  counters:`` line (cumulative since start; ``requeued_preempted``/``requeued_retracted`` are
  re-prefills, ``prefetch_*`` the host staging), and SGLang's ``#retracted_reqs`` lines.
* **Fidelity** — the simulator's mean ratio against the measured one per ratio: relative error
  ``simulated / measured − 1`` (:func:`fidelity`); the issue's target is within 10 %.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from scipy import stats

#: the baselines every other arm is divided by (the router also by round robin)
BASELINES = ("round-robin", "router")
_BATCH = re.compile(r"(?:Prefill|Decode) batch.*?#running-req: (\d+).*?#queue-req: (\d+)")


def t_interval(values: Sequence[float], level: float = 0.95) -> dict:
    """Mean of ``values`` with its two-sided Student-t interval at ``level`` (``lo``/``hi`` None
    for fewer than two values; equal to the mean when every value is the same)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), not {level}")
    if x.size == 0:
        return {"mean": None, "lo": None, "hi": None, "n": 0, "sd": None, "level": level}
    mean = float(x.mean())
    if x.size < 2:
        return {"mean": mean, "lo": None, "hi": None, "n": 1, "sd": None, "level": level}
    sd = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1)) * sd / math.sqrt(x.size)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": int(x.size), "sd": sd, "level": level}


def ratio_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """``(treatment, baseline)`` for every arm against each baseline run (never an arm against
    itself; the router against round robin, not the reverse)."""
    bases = [b for b in BASELINES if b in names]
    return [(t, b) for b in bases for t in names
            if t != b and not (t == "round-robin" and b == "router")]


def ratios(per_seed: Mapping[int, Mapping[str, Mapping]], names: Sequence[str], level: float = 0.95) -> dict:
    """Per ``treatment/baseline``: the per-seed ratios of avg and P95 workflow JCT, their means
    and t-intervals (``ci_avg``, ``ci_p95``: ``[lo, hi]``)."""
    out: dict[str, dict] = {}
    for treat, base in ratio_pairs(names):
        avg = [v[treat]["jct_avg_s"] / v[base]["jct_avg_s"] for v in per_seed.values()]
        p95 = [v[treat]["jct_p95_s"] / v[base]["jct_p95_s"] for v in per_seed.values()]
        ia, ip = t_interval(avg, level), t_interval(p95, level)
        out[f"{treat}/{base}"] = {"avg": avg, "p95": p95, "mean_avg": ia["mean"], "ci_avg": [ia["lo"], ia["hi"]],
                                  "mean_p95": ip["mean"], "ci_p95": [ip["lo"], ip["hi"]], "n": ia["n"],
                                  "level": level}
    return out


def queue_samples(log_text: str) -> tuple[list[int], list[int]]:
    """``(#queue-req, #running-req)`` of every batch line SGLang logged in ``log_text``."""
    pairs = [(int(q), int(r)) for r, q in _BATCH.findall(log_text)]
    return [q for q, _ in pairs], [r for _, r in pairs]


def queue_summary(queues: Sequence[int], running: Sequence[int]) -> dict:
    """Mean, median, P90 and max of the waiting queue over the batch samples, and of the running
    batch (``running_mean``/``running_max``)."""
    if not queues:
        return {"samples": 0, "mean": None, "median": None, "p90": None, "max": None,
                "running_mean": None, "running_max": None}
    q, r = np.asarray(queues, dtype=float), np.asarray(running, dtype=float)
    return {"samples": int(q.size), "mean": float(q.mean()), "median": float(np.median(q)),
            "p90": float(np.percentile(q, 90)), "max": int(q.max()),
            "running_mean": float(r.mean()), "running_max": int(r.max())}


def engine_counters(log_text: str) -> dict:
    """What one replica's log says about the run: the plugin's on/off line, its last counters
    line (``plugin_counters``, the plugin's names) and SGLang's own retractions
    (``KV cache pool is full. Retract requests. #retracted_reqs: N``)."""
    out: dict = {"plugin": "on" if "agent-workflow plugin on" in log_text else
                 "off" if "agent-workflow plugin off" in log_text else "unknown"}
    lines = [l for l in log_text.splitlines() if "agent-workflow plugin counters:" in l]
    out["plugin_counters"] = ({k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", lines[-1].split("counters:", 1)[1])}
                              if lines else {})
    out["sglang_retracted_reqs"] = sum(int(n) for n in re.findall(r"#retracted_reqs: (\d+)", log_text))
    return out


def sum_counts(dicts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Key-wise sum of counter dicts (keys sorted)."""
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + int(v)
    return dict(sorted(out.items()))


def arm_summary(runs: Sequence[Mapping], replicas: Sequence[Mapping] | None) -> dict:
    """One arm over its seeds: errors and gateway annotate outcomes summed, cache share and JCT
    averaged, the waiting queue over all its runs' batch samples, and (for its replica pair, when
    no other arm shares it) the plugin's counters summed over the replicas."""
    queues = [q for r in runs for q in r.get("queue_samples", ([], []))[0]]
    running = [x for r in runs for x in r.get("queue_samples", ([], []))[1]]
    cached = [r["cached_fraction"] for r in runs if r.get("cached_fraction") is not None]
    out = {"seeds": len(runs), "errors": sum(int(r["errors"]) for r in runs),
           "calls": sum(int(r["calls"]) for r in runs),
           "annotate_outcomes": sum_counts(r.get("annotate_outcomes") or {} for r in runs),
           "cached_fraction": float(np.mean(cached)) if cached else None,
           "jct_avg_s": float(np.mean([r["jct_avg_s"] for r in runs])) if runs else None,
           "queue_depth": queue_summary(queues, running)}
    ann = out["annotate_outcomes"]
    out["annotated_share"] = (ann.get("annotated", 0) / sum(ann.values())) if ann else None
    if replicas is not None:
        out["plugin"] = "/".join(r["plugin"] for r in replicas)
        out["plugin_counters"] = sum_counts(r["plugin_counters"] for r in replicas)
        out["sglang_retracted_reqs"] = sum(r["sglang_retracted_reqs"] for r in replicas)
    return out


def fidelity(measured: Mapping[str, Mapping], simulated: Mapping[str, Mapping], tolerance: float = 0.10) -> dict:
    """Per ratio both sides have: measured and simulated mean avg-JCT ratio, the relative error
    ``simulated / measured − 1`` and whether it is within ``tolerance``."""
    out = {}
    for key, m in measured.items():
        s = simulated.get(key)
        if s is None or not m.get("mean_avg") or s.get("mean_avg") is None:
            continue
        err = s["mean_avg"] / m["mean_avg"] - 1
        out[key] = {"measured": m["mean_avg"], "measured_ci": m.get("ci_avg"), "simulated": s["mean_avg"],
                    "rel_error": err, "within_tolerance": abs(err) <= tolerance, "tolerance": tolerance}
    return out
