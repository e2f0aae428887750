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
* **An empty queue refuses a ratio** — with no waiting queue the policies have nothing to
  reorder and a ratio measures the machine's noise. A run's ``queue_depth.nonempty_share`` is
  the share of its batch samples with ``#queue-req`` > 0; a seed whose baseline or treatment run
  has it below ``min_queue_share`` (:data:`MIN_QUEUE_SHARE`, "empty most of the time") is
  withheld from that ratio (``withheld``: seed and reason), and a ratio with no seed left says
  so (``refused``) instead of a mean.
* **An unannotated arm refuses a ratio** — a run whose gateway annotated fewer than
  :data:`MIN_ANNOTATED_SHARE` of its calls (an annotation that failed open: a budget overrun, or
  a gateway that imported a half-changed working tree) ran without its hints; its seed is
  withheld whatever ``min_queue_share`` says.
* **Fidelity** — per ratio the simulator's mean against the measured one (``abs_error``, judged
  within :data:`RATIO_TOLERANCE` = 0.05) and per arm its mean avg JCT against the measured one
  (``rel_error`` = simulated / measured − 1, judged within :data:`ARM_TOLERANCE` = 15 %); each
  with ``pass`` and the condition's ``pass`` over all (:func:`fidelity`).
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from scipy import stats

#: the baselines every other arm is divided by (the router also by round robin)
BASELINES = ("round-robin", "router")
#: a run whose queue was non-empty in fewer batch samples than this had no contention
MIN_QUEUE_SHARE = 0.5
#: a run whose gateway annotated fewer of its calls than this did not run the arm it names
MIN_ANNOTATED_SHARE = 0.95
#: fidelity thresholds: the simulated ratio within 0.05 of the measured, each arm within 15 %
RATIO_TOLERANCE, ARM_TOLERANCE = 0.05, 0.15
_NEW_SEQ = re.compile(r"Prefill batch.*?#new-seq: (\d+)")
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
    itself; the router against round robin, not the reverse). Without a baseline arm (an
    ablation-only condition such as ``kv-pressure``: hints vs no-retention) the first arm is
    the treatment of every other."""
    bases = [b for b in BASELINES if b in names]
    if not bases and len(names) > 1:
        return [(names[0], b) for b in names[1:]]
    return [(t, b) for b in bases for t in names
            if t != b and not (t == "round-robin" and b == "router")]


def _queue_withheld(run: Mapping, min_queue_share: float) -> str | None:
    share = (run.get("queue_depth") or {}).get("nonempty_share")
    if share is None or share >= min_queue_share:
        return None
    return f"queue empty in {1 - share:.0%} of batch samples"


def _annotation_withheld(run: Mapping) -> str | None:
    outcomes = run.get("annotate_outcomes") or {}
    total = sum(int(n) for n in outcomes.values())
    if not total or outcomes.get("annotated", 0) >= MIN_ANNOTATED_SHARE * total:
        return None
    return f"gateway annotated {outcomes.get('annotated', 0) / total:.0%} of calls {dict(outcomes)}"


def withheld_reasons(withheld: Sequence[Mapping]) -> list[str]:
    """The distinct kinds of reason among a ratio's ``withheld`` seeds, without their figures:
    ``queue empty`` (:func:`_queue_withheld`) and ``gateway annotated N% of calls``
    (:func:`_annotation_withheld`, its outcome counts dropped)."""
    return sorted({w["reason"].split(" in ")[0] if w["reason"].startswith("queue empty")
                   else w["reason"].split(" {")[0] for w in withheld})


def _refusal(withheld: Sequence[Mapping]) -> str:
    if withheld_reasons(withheld) == ["queue empty"]:
        return f"no ratio: the queue was empty most of the time in every seed ({len(withheld)} withheld)"
    return f"no ratio: every seed withheld ({len(withheld)}; first: {withheld[0]['reason']})"


def ratios(per_seed: Mapping[int, Mapping[str, Mapping]], names: Sequence[str], level: float = 0.95,
           min_queue_share: float | None = None) -> dict:
    """Per ``treatment/baseline``: the per-seed ratios of avg and P95 workflow JCT, their means
    and t-intervals (``ci_avg``, ``ci_p95``: ``[lo, hi]``). A seed where either run's gateway
    annotated too few calls is left out (``withheld``), and with ``min_queue_share`` one whose
    treatment or baseline run had a queue empty most of the time; ``refused`` says why when no
    seed is left."""
    out: dict[str, dict] = {}
    for treat, base in ratio_pairs(names):
        withheld, kept = [], []
        for seed, v in per_seed.items():
            why = _annotation_withheld(v[base]) or _annotation_withheld(v[treat]) or (
                None if min_queue_share is None else
                _queue_withheld(v[base], min_queue_share) or _queue_withheld(v[treat], min_queue_share))
            if why:
                withheld.append({"seed": seed, "reason": why})
            else:
                kept.append(v)
        avg = [v[treat]["jct_avg_s"] / v[base]["jct_avg_s"] for v in kept]
        p95 = [v[treat]["jct_p95_s"] / v[base]["jct_p95_s"] for v in kept]
        ia, ip = t_interval(avg, level), t_interval(p95, level)
        out[f"{treat}/{base}"] = {"avg": avg, "p95": p95, "mean_avg": ia["mean"], "ci_avg": [ia["lo"], ia["hi"]],
                                  "mean_p95": ip["mean"], "ci_p95": [ip["lo"], ip["hi"]], "n": ia["n"],
                                  "level": level, "withheld": withheld,
                                  "refused": _refusal(withheld) if withheld and not kept else None}
    return out


def same_seed_ratios(per_seed: Mapping[int, Mapping[str, Mapping]], names: Sequence[str],
                     measured: Mapping[str, Mapping], level: float = 0.95) -> dict:
    """:func:`ratios` of the simulated ``per_seed`` runs over the seeds each *measured* ratio kept
    (its ``withheld`` seeds left out), so that fidelity sets a ratio beside the one measured on
    the same draws, not a mean over seeds the measurement withheld."""
    out = ratios(per_seed, names, level)
    for key in out:
        gone = {str(w["seed"]) for w in (measured.get(key) or {}).get("withheld", [])}
        if gone:
            kept = {s: v for s, v in per_seed.items() if str(s) not in gone}
            out[key] = ratios(kept, names, level)[key] if kept else out[key]
            out[key]["withheld"] = sorted(gone)
    return out


def prefill_sequences(log_text: str) -> int:
    """Sequences one replica's ``Prefill batch`` lines admitted (``#new-seq``) in ``log_text``:
    the calls it served, so the replicas' counts of one run are how the front split the calls
    (a prompt split by chunked prefill counts once per chunk)."""
    return sum(int(n) for n in _NEW_SEQ.findall(log_text))


def queue_samples(log_text: str) -> tuple[list[int], list[int]]:
    """``(#queue-req, #running-req)`` of every batch line SGLang logged in ``log_text``."""
    pairs = [(int(q), int(r)) for r, q in _BATCH.findall(log_text)]
    return [q for q, _ in pairs], [r for _, r in pairs]


def queue_summary(queues: Sequence[int], running: Sequence[int]) -> dict:
    """Mean, median, P90 and max of the waiting queue over the batch samples, and of the running
    batch (``running_mean``/``running_max``)."""
    if not queues:
        return {"samples": 0, "nonempty_share": None, "mean": None, "median": None, "p90": None, "max": None,
                "running_mean": None, "running_max": None}
    q, r = np.asarray(queues, dtype=float), np.asarray(running, dtype=float)
    return {"samples": int(q.size), "nonempty_share": float((q > 0).mean()), "mean": float(q.mean()),
            "median": float(np.median(q)),
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


def fidelity(measured: Mapping[str, Mapping], simulated: Mapping[str, Mapping],
             measured_arms: Mapping[str, float | None] | None = None,
             simulated_arms: Mapping[str, float | None] | None = None,
             ratio_tolerance: float = RATIO_TOLERANCE, arm_tolerance: float = ARM_TOLERANCE) -> dict:
    """The simulator judged against the engine. ``ratios``: per ratio both sides have, the
    measured and simulated mean avg-JCT ratio, ``abs_error`` (simulated − measured),
    ``rel_error`` and ``pass`` (``|abs_error|`` ≤ ``ratio_tolerance``); ``arms``: per arm the
    mean avg JCT over seeds measured and simulated, ``rel_error`` and ``pass``
    (``|rel_error|`` ≤ ``arm_tolerance``); ``pass``: every judged entry passed (None: nothing
    to judge, or a measured ratio was refused — its entry says why)."""
    out: dict = {"ratios": {}, "arms": {}, "thresholds": {"ratio_abs": ratio_tolerance, "arm_rel": arm_tolerance}}
    for key, m in measured.items():
        s = simulated.get(key)
        if s is None or s.get("mean_avg") is None:
            continue
        if not m.get("mean_avg"):              # the measured ratio was refused: nothing to judge it by
            out["ratios"][key] = {"measured": None, "simulated": s["mean_avg"], "abs_error": None,
                                  "rel_error": None, "pass": None, "why": m.get("refused")}
            continue
        diff = s["mean_avg"] - m["mean_avg"]
        out["ratios"][key] = {"measured": m["mean_avg"], "measured_ci": m.get("ci_avg"), "simulated": s["mean_avg"],
                              "abs_error": diff, "rel_error": s["mean_avg"] / m["mean_avg"] - 1,
                              "pass": abs(diff) <= ratio_tolerance}
    for arm, mv in (measured_arms or {}).items():
        sv = (simulated_arms or {}).get(arm)
        if not mv or sv is None:
            continue
        err = sv / mv - 1
        out["arms"][arm] = {"measured": mv, "simulated": sv, "rel_error": err, "pass": abs(err) <= arm_tolerance}
    judged = [v["pass"] for part in ("ratios", "arms") for v in out[part].values()]
    out["pass"] = None if not judged or None in judged else all(judged)
    return out
