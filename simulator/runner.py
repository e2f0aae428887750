"""One comparison: prepare a workload once, then replay it under every policy and load.

Load
----
``--load`` is the number of workflows (sessions) in the system, as a share of the
*KV-saturating concurrency* of the cluster::

    C_kv = replicas × kv_capacity_tokens / K_session
    K_session = mean over workflows of  Σ_calls latency·(input + output) / span

``K_session`` is the time-averaged KV a session holds while it runs uncontended (its calls'
contexts weighted by how long each call is in flight, over the workflow's recorded span: tool
time holds no running context). At ``C_kv`` sessions the running contexts alone fill every GPU
KV pool; beyond it calls wait for admission and cached prefixes are evicted. ``low`` = 0.5,
``medium`` = 1.0, ``peak`` = 1.5 (a number is accepted too).

Arrivals (``--arrivals``), with ``C = load × C_kv``:

* ``poisson`` (default): open arrivals at ``λ = C / T_sat`` — Little's law with ``T_sat``, the
  mean JCT of a workflow whose every decode iteration reads a full GPU KV pool (its critical path
  of calls at the calibrated step time ``t0 + c·kv_capacity`` plus its gaps,
  :func:`critical_path_jct`). ``λ_sat = C_kv / T_sat`` is the rate a KV-saturated cluster drains
  at the calibrated speed: ``medium`` offers exactly that (critical: little queueing), ``low``
  half of it, ``peak`` 1.5× — a burst the cluster cannot drain, so calls queue for admission,
  cached prefixes are evicted, and scheduling and caching decide how long the queue gets (JCT
  at ``peak`` grows with the run length; every policy gets the same arrivals);
* ``trace``: the recorded order and spacing of workflow starts, scaled to the same mean rate;
* ``closed``: a closed population of ``C`` sessions (the first ``C`` start at random times over
  one ``T_sat``; each completed workflow lets the next one in). In a closed system the mean JCT
  is ``C / throughput`` (Little), so it compares throughput, not queueing order.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from predictors.tool_latency import ToolLatencyModel
from store.profile_artifact import CURRENT_FILE, load_profile
from simulator.autoscale import MODES as AUTOSCALE_MODES
from simulator.autoscale import AutoscaleOptions, Autoscaler, ProjectedCalls, QueueDepth
from simulator.baselines import BASELINES, TRAINED_BASELINES
from simulator.baselines.sessions import StickyRouter, ThunderAgentControl
from simulator.config import ClusterConfig, hardware_config
from simulator.engine import SimResult, Simulator
from simulator.metrics import (add_recompute_ratios, interactive_figures, interactive_types,
                               summarize)
from simulator.ours import OURS_VARIANTS, OursOptions, PredictionFeed, build_ours, ours_stats
from simulator.policy import Policy
from simulator.pools import Pools, build_pools
from simulator.scenarios import ROOT as SCENARIO_ROOT
from simulator.scenarios import get_scenario
from simulator.sources import (BUILTIN, Source, fit_train_profile, generated, load_logs,
                               make_predictor, mixed)
from simulator.workload import Call, Workload, replicate_records, workload_from_records

LOAD_LEVELS: dict[str, float] = {"low": 0.5, "medium": 1.0, "peak": 1.5}
#: Policies of the main table, in display order.
MAIN_POLICIES = ("sglang-default", "sglang-rr", "least-load", "autellix-plas", "continuum-ttl",
                 "mori-idleness", "saga", "astraea", "belady", "oracle-srpt", "ours",
                 "ours-belady")
#: Baselines fit on the train split (not in the default table: run them by name).
TRAINED_POLICIES = tuple(TRAINED_BASELINES)
ABLATION_POLICIES = tuple(n for n in OURS_VARIANTS if n not in MAIN_POLICIES)
ALL_POLICIES = MAIN_POLICIES + TRAINED_POLICIES + ABLATION_POLICIES


def parse_load(value: str) -> float:
    if value in LOAD_LEVELS:
        return LOAD_LEVELS[value]
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"--load {value!r}: use low, medium, peak or a share of capacity "
                         "such as 0.75") from None
    if not 0 < x < 10:
        raise ValueError(f"--load {value}: a share of capacity must be in (0, 10)")
    return x


def split_policy(name: str) -> tuple[str, str]:
    """``"ours+predictive"`` → ``("ours", "predictive")``; a name without ``+`` runs on fixed
    pools (``"off"``)."""
    base, _, mode = name.partition("+")
    return base, (mode or "off")


def parse_policies(value: str | None, ablation: bool = False,
                   autoscale: str | None = None) -> list[str]:
    """Policy names to run. A name may carry an autoscaler, ``NAME+reactive`` or
    ``NAME+predictive`` (:mod:`simulator.autoscale`); ``autoscale`` (``--autoscale``, a comma
    list of ``off``, ``reactive``, ``predictive``) runs every name without one in each mode."""
    names = list(MAIN_POLICIES) if not value else [v.strip() for v in value.split(",") if v.strip()]
    if ablation:
        names += [n for n in ABLATION_POLICIES if n not in names]
        if "ours" not in names:
            names.append("ours")
    if autoscale:
        modes = [m.strip() for m in autoscale.split(",") if m.strip()]
        bad_mode = [m for m in modes if m not in AUTOSCALE_MODES]
        if bad_mode:
            raise ValueError(f"--autoscale {bad_mode[0]!r}: use {', '.join(AUTOSCALE_MODES)} "
                             "(or a comma list of them)")
        names = [n if "+" in n or m == "off" else f"{n}+{m}" for n in names for m in modes]
    bad = [n for n in names if split_policy(n)[0] not in BASELINES
           and split_policy(n)[0] not in TRAINED_BASELINES and split_policy(n)[0] not in OURS_VARIANTS]
    if bad:
        raise ValueError(f"unknown policy {bad[0]!r}; known: {', '.join(ALL_POLICIES)} "
                         f"(each may end in +reactive or +predictive)")
    bad = [n for n in names if split_policy(n)[1] not in AUTOSCALE_MODES]
    if bad:
        raise ValueError(f"policy {bad[0]!r}: the autoscaler after '+' is reactive or predictive")
    return list(dict.fromkeys(names))


@dataclass
class Prepared:
    """A workload ready to replay: test-split calls, and the profile fit on the train split."""

    name: str
    source: Source
    workload: Workload
    profile: Any
    seed: int
    notes: list[str] = field(default_factory=list)
    #: Model pools of a multi-model scenario (None: one pool of every replica).
    pools: Any = None
    scenario: Any = None


def prepare(workload: str, n_workflows: int | None = None, seed: int = 0,
            profile_dir: str | Path | None = None, train_share: float = 0.7,
            n_train: int = 400, progress: bool = False, cfg: ClusterConfig | None = None,
            max_load: float = 1.0) -> Prepared:
    """Load or generate the workload, split it, fit (or load) the profile on the train side.

    Without ``n_workflows``, the replay gets ``max(100, 3 × max_load × C_kv)`` workflows (sized
    on the train side): three times the highest load's population (warm-up, measured window,
    tail);
    a log test split is resampled to that many sessions (each copy its own session).
    """
    cfg = cfg or ClusterConfig()
    if workload in BUILTIN:
        src = generated(workload, n_train=n_train, n_test=0, seed=seed)
    else:
        if not Path(workload).exists():
            raise ValueError(f"--workload {workload!r}: not a built-in workload "
                             f"(coding-assistant, deep-research) and no such log file or folder")
        src = load_logs([workload], train=train_share, seed=seed, progress=progress)
    if n_workflows is None:
        c_kv, _ = saturating_concurrency(src.train or src.test, cfg)
        n_workflows = max(100, int(math.ceil(3 * max_load * c_kv)))
    if src.generated:
        src.test = generated(workload, n_train=0, n_test=n_workflows, seed=seed).test
        test = src.test
    else:
        test = replicate_records(src.test, n_workflows, seed=seed)
    notes = list(src.notes)
    if profile_dir is not None and (Path(profile_dir) / CURRENT_FILE).exists():
        profile = load_profile(profile_dir)
        notes.append(f"profile loaded from {profile_dir} (version {profile.version}); make sure it "
                     "was not fit on the replayed workflows")
    else:
        profile, reused = fit_train_profile(src.train, profile_dir, progress=progress)
        if reused:
            notes.append(f"profile reused from {profile.path} (version {profile.version}): fit "
                         "on this run's train split")
    wl = workload_from_records(test, name=src.name, system_tokens=src.system_tokens,
                               conversation_lineage=not src.generated)
    return Prepared(src.name, src, wl, profile, seed, notes)


def session_profile(records: Sequence[dict]) -> dict[str, float]:
    """``K_session`` (tokens) and ``T_wf`` (s) of the module docstring, from recorded calls."""
    by_wf: dict[str, list[dict]] = {}
    for r in records:
        by_wf.setdefault(str(r["workflow_id"]), []).append(r)
    kv, span = [], []
    for recs in by_wf.values():
        t0 = min(float(r["t_arrival"]) for r in recs)
        t1 = max(float(r["t_finish"]) for r in recs)
        width = max(t1 - t0, 1e-6)
        held = sum((float(r["t_finish"]) - float(r["t_arrival"])) * (int(r["input_tokens"]) + int(r["output_tokens"]))
                   for r in recs)
        kv.append(held / width)
        span.append(width)
    if not kv:
        raise ValueError("no workflows to size the load on")
    return {"session_kv_tokens": float(np.mean(kv)), "workflow_span_s": float(np.mean(span))}


def critical_path_jct(wl: Workload, cfg: ClusterConfig, kv_read: float | None = None) -> np.ndarray:
    """Per workflow: the longest path through its calls, each taking its uncached prefill
    (``a·(input − reusable) + a_ctx·input``) plus ``output`` decode iterations of ``t0 + c·K``,
    after its parents finish and its gap passes. ``K`` is ``kv_read`` (``T_sat``: a full KV pool)
    or, when None, the call's own context (the workflow served alone)."""
    st = cfg.step
    finish = np.zeros(wl.n_calls)
    for c in wl.calls:   # calls are stored in arrival order within each workflow: parents first
        start = max((finish[p] for p in c.parents), default=0.0) + (c.gap_s if c.parents else 0.0)
        new = c.input_tokens - wl.path_tokens(c)
        k = c.input_tokens + c.output_tokens / 2 if kv_read is None else kv_read
        dur = (st.prefill_t0 + st.a * new + st.a_ctx * c.input_tokens
               + st.a_attn * new * (c.input_tokens - new / 2) + c.output_tokens * st.decode_step(k))
        finish[c.idx] = start + dur
    out = np.zeros(len(wl.workflows))
    for wf in wl.workflows:
        out[wf.idx] = max(finish[i] for i in wf.calls)
    return out


def saturating_concurrency(records: Sequence[dict], cfg: ClusterConfig) -> tuple[float, dict]:
    """``C_kv`` of the module docstring (sessions), with the figures it came from."""
    prof = session_profile(records)
    c_kv = cfg.replicas * cfg.kv_capacity_tokens / max(prof["session_kv_tokens"], 1.0)
    return c_kv, prof


def gamma_gaps(n: int, rate: float, cv: float, seed: int) -> np.ndarray:
    """``n`` inter-arrival gaps of mean ``1/rate`` and coefficient of variation ``cv``: gamma with
    shape ``1/cv²`` and scale ``cv²/rate``. ``cv = 0`` is a fixed spacing, ``1`` Poisson, ``4``
    bursts (most gaps near 0, a few very long: the same mean rate arrives in clumps)."""
    if cv < 0:
        raise ValueError(f"--arrival-cv {cv}: a coefficient of variation is ≥ 0")
    if cv == 0:
        return np.full(n, 1.0 / rate)
    return np.random.default_rng([seed, 41]).gamma(1.0 / cv ** 2, cv ** 2 / rate, size=n)


def measured_mask(arrival: np.ndarray, mode: str, concurrency: int | None, warmup: float,
                  tail: float) -> np.ndarray:
    """Workflows whose figures are reported: by arrival rank, the first ``warmup`` share is the
    warm-up (the system fills) and the last ``tail`` share only keeps the load on (in a closed
    population, at least the last ``concurrency`` too: while they run the population shrinks)."""
    n = len(arrival)
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(arrival, kind="stable")] = np.arange(n)
    lo = int(math.floor(warmup * n))
    hi = n - int(math.ceil(tail * n))
    if mode == "closed" and concurrency:
        lo, hi = max(lo, min(concurrency, n // 3)), min(hi, n - min(concurrency, n // 3))
    if hi - lo < max(3, n // 10):        # too few workflows for a window: measure them all
        return np.ones(n, dtype=bool)
    return (rank >= lo) & (rank < hi)


def arrival_times(wl: Workload, rate: float, seed: int, mode: str = "poisson",
                  recorded_starts: Sequence[float] | None = None, concurrency: int = 0,
                  span_s: float = 0.0, cv: float = 1.0) -> np.ndarray:
    """Workflow arrival times (s): ``closed`` (the first ``concurrency`` spread over ``span_s``;
    the others arrive when earlier ones finish), Poisson at ``rate`` workflows/s, ``gamma``
    inter-arrivals of mean ``1/rate`` and coefficient of variation ``cv`` (:func:`gamma_gaps`),
    or the recorded spacing at that mean rate."""
    n = len(wl.workflows)
    if mode == "closed":
        t = np.sort(np.random.default_rng([seed, 37]).uniform(0.0, max(span_s, 0.0), size=n))
        t[:min(concurrency, n)] = np.sort(t[:min(concurrency, n)]) - t[0]
        return t
    if mode == "poisson":
        gaps = np.random.default_rng([seed, 29]).exponential(1.0 / rate, size=n)
        return np.cumsum(gaps) - gaps[0]
    if mode == "gamma":
        gaps = gamma_gaps(n, rate, cv, seed)
        return np.cumsum(gaps) - gaps[0]
    if mode == "trace":
        starts = np.sort(np.asarray(recorded_starts if recorded_starts is not None else [], float))
        if len(starts) < 2:
            raise ValueError("--arrivals trace needs the recorded start times of ≥ 2 workflows")
        gaps = np.diff(starts)
        gaps = np.resize(gaps, max(n - 1, 0))
        gaps = gaps * ((1.0 / rate) / max(gaps.mean(), 1e-9)) if len(gaps) else gaps
        return np.concatenate([[0.0], np.cumsum(gaps)])
    raise ValueError(f"--arrivals {mode!r}: use closed, poisson, gamma or trace")


def gap_function(wl: Workload, profile: Any, mode: str, seed: int) -> Callable[[Call], float] | None:
    """``recorded`` (None: the engine's default) or ``sampled`` from the profile's tool lognormals:
    the gap before a call is the largest, over its parents, of the sum of fresh samples of the
    tools that parent ran (the recorded gap when a tool has no fit)."""
    if mode == "recorded":
        return None
    if mode != "sampled":
        raise ValueError(f"--gaps {mode!r}: use recorded or sampled")
    tl = ToolLatencyModel.from_dict(profile.data.get("tool_latency") or {})
    cache: dict[int, float] = {}

    def gap(call: Call) -> float:
        if call.idx in cache:
            return cache[call.idx]
        rng = np.random.default_rng([seed, 31, call.idx])
        best = None
        wt = wl.workflows[call.wf].workflow_type
        for p in call.parents:
            total = 0.0
            for tool in wl.calls[p].tools:
                fit = tl.lookup(wt, tool)
                if not fit:
                    total = math.nan
                    break
                total += float(np.exp(fit["mu"] + fit["sigma"] * rng.standard_normal()))
            if not math.isnan(total):
                best = total if best is None else max(best, total)
        value = call.gap_s if best is None else best
        cache[call.idx] = value
        return value

    return gap


def make_policy(name: str, prep: Prepared, ours: OursOptions | None = None,
                autoscale: AutoscaleOptions | None = None) -> Policy:
    """The policy ``name`` (``BASE`` or ``BASE+reactive`` / ``BASE+predictive``). A predictive
    autoscaler reads the live sessions of ours' prediction feed; a baseline gets a feed of its
    own for it (the feed only annotates; the baseline's parts never read it)."""
    base, mode = split_policy(name)
    if base in OURS_VARIANTS:
        policy = build_ours(make_predictor(prep.profile), base, ours)
    elif base in TRAINED_BASELINES:     # fit on the same train split as the profile
        policy = TRAINED_BASELINES[base](prep.source.train)
    else:
        policy = BASELINES[base]()
    if mode == "off":
        return policy
    opt = autoscale or AutoscaleOptions()
    if mode == "reactive":
        rec: QueueDepth | ProjectedCalls = QueueDepth(opt)
    else:
        feed = next((p for p in policy.parts if isinstance(p, PredictionFeed)), None)
        if feed is None:
            feed = PredictionFeed(make_predictor(prep.profile))
            policy.add_part(feed)
        rec = ProjectedCalls(opt, feed.predictor)
    policy.add_part(Autoscaler(rec, opt))
    policy.name = name
    policy.description += f"; autoscaled ({mode}, start-up {opt.startup_delay_s:g} s)"
    return policy


def run_pools(prep: Prepared, cfg: ClusterConfig, name: str) -> Pools | None:
    """The pools of one run: a copy of the scenario's (an autoscaler changes them), or for an
    autoscaled run without pools one pool of every replica."""
    if prep.pools is not None:
        return prep.pools.copy()
    if split_policy(name)[1] != "off":
        return build_pools(prep.workload, {"all": cfg.replicas}, {}, default_pool="all")
    return None


def simulate(prep: Prepared, name: str, cfg: ClusterConfig, arrivals: np.ndarray,
             gap_fn: Callable[[Call], float] | None = None,
             ours: OursOptions | None = None, concurrency: int | None = None,
             window: tuple[float, float] = (0.0, 0.0), mode: str = "poisson",
             autoscale: AutoscaleOptions | None = None,
             interactive: tuple[set[str], float] | None = None) -> tuple[SimResult, dict]:
    """Run one policy; returns the raw result and its metrics (plus our parts' counters), the
    JCT and TTFT figures over the measured window (``window`` = warm-up and tail shares).
    ``gpu_held_s`` is the GPU-seconds the replicas were held until the last workflow finished
    (every replica for the whole run without an autoscaler). ``interactive`` = (the workflow
    types of interactive sessions, the TTFT target s) adds ``interactive``
    (:func:`simulator.metrics.interactive_figures`)."""
    policy = make_policy(name, prep, ours, autoscale)
    t0 = time.perf_counter()
    res = Simulator(prep.workload, policy, cfg, arrivals, gap_fn, concurrency,
                    run_pools(prep, cfg, name)).run()
    mask = measured_mask(res.wf_arrival, mode, concurrency, *window)
    row = summarize(res, mask)
    if interactive is not None and interactive[0]:
        row["interactive"] = interactive_figures(res, interactive[0], interactive[1], mask)
    row["wall_s"] = round(time.perf_counter() - t0, 3)
    row.update(ours_stats(policy))
    end = float(np.nanmax(res.wf_finish)) if len(res.wf_finish) else 0.0
    row["gpu_held_s"] = round(cfg.replicas * end, 3)
    for part in policy.parts:
        if isinstance(part, Autoscaler):
            row.update(part.stats(end))
        elif isinstance(part, (ThunderAgentControl, StickyRouter)):
            row.update(part.stats())
    return res, row


def compare(prep: Prepared, policies: Sequence[str], loads: Sequence[str], cfg: ClusterConfig,
            arrivals_mode: str = "poisson", gaps_mode: str = "recorded",
            on_result: Callable[[str, str, dict], None] | None = None,
            ours: OursOptions | None = None, arrival_seed: int | None = None,
            cv: float = 1.0, warmup: float = 0.2, tail: float = 0.2,
            autoscale: AutoscaleOptions | None = None, ttft_slo: float = 2.0,
            slo_search: bool = False) -> dict:
    """Every policy at every load on the same workload, arrivals and gaps; a JSON-able dict.

    When the replayed workflows hold interactive sessions (a call marked ``wait_after = human``)
    each row gets ``interactive`` (their TTFT against ``ttft_slo`` s, the batch sessions' JCT);
    ``slo_search`` adds ``interactive.max_sessions_in_slo`` (:func:`max_sessions_in_slo`) and
    ``interactive.slo_search``, the rate factors it ran with their attainment and concurrency.

    ``arrival_seed`` (default: the workload's seed) draws another arrival sequence of the same
    workflows at the same rates (a robustness check of a comparison). ``cv``: coefficient of
    variation of ``gamma`` inter-arrivals. JCT figures cover the measured window only
    (:func:`measured_mask`: ``warmup`` and ``tail`` shares of the arrivals left out)."""
    a_seed = prep.seed if arrival_seed is None else int(arrival_seed)
    wl = prep.workload
    recorded = _recorded_starts(prep)
    gap_fn = gap_function(wl, prep.profile, gaps_mode, prep.seed)
    c_kv, sess = saturating_concurrency(prep.source.test, cfg)
    t_sat = float(critical_path_jct(wl, cfg, cfg.kv_capacity_tokens).mean())
    sess["isolated_jct_s"] = float(critical_path_jct(wl, cfg).mean())
    sess["saturated_jct_s"] = t_sat
    out: dict[str, Any] = {
        "workload": prep.name, "workload_summary": wl.summary(), "config": cfg.to_dict(),
        "saturating_sessions": c_kv, "session": sess, "profile_version": prep.profile.version,
        "arrivals": arrivals_mode, "gaps": gaps_mode, "seed": prep.seed, "arrival_seed": a_seed,
        "cv": cv if arrivals_mode == "gamma" else (1.0 if arrivals_mode == "poisson" else None),
        "window": {"warmup": warmup, "tail": tail},
        "autoscale": (asdict(autoscale or AutoscaleOptions())
                      if any(split_policy(n)[1] != "off" for n in policies) else None),
        "notes": prep.notes,
        "loads": {},
    }
    if prep.scenario is not None:
        out["scenario"] = prep.scenario.to_dict()
    types = interactive_types(prep.source.test)
    inter = (types, float(ttft_slo)) if types else None
    if inter is not None:
        out["interactive"] = {"workflow_types": sorted(types), "ttft_slo_s": float(ttft_slo)}
    if arrivals_mode == "burst":
        loads = ["burst"]
        warmup = tail = 0.0            # the burst is the load: every workflow is measured
    for level in loads:
        if arrivals_mode == "burst":
            sc = prep.scenario
            span = sc.burst_s if sc is not None else t_sat
            sessions = len(wl.workflows)
            share = sessions / c_kv
            rate = sessions / max(span, 1e-9)
            arr = np.sort(np.random.default_rng([a_seed, 43]).uniform(0.0, span, size=sessions))
        else:
            share = parse_load(level)
            sessions = max(1, int(round(share * c_kv)))
            rate = share * c_kv / t_sat
            arr = arrival_times(wl, rate, a_seed, arrivals_mode, recorded, sessions, t_sat, cv)
        closed = sessions if arrivals_mode == "closed" else None
        if sessions * 1.5 > len(wl.workflows):
            prep.notes.append(f"load {level}: {sessions} sessions for {len(wl.workflows)} workflows; "
                              "give --workflows ≥ 3× the sessions")
        rows: dict[str, dict] = {}
        for name in policies:
            _, row = simulate(prep, name, cfg, arr, gap_fn, ours, closed, (warmup, tail),
                              arrivals_mode, autoscale, inter)
            if inter is not None and slo_search and closed is None:
                trail: list[dict] = []
                row["interactive"]["max_sessions_in_slo"] = max_sessions_in_slo(
                    prep, name, cfg, arr, gap_fn, ours, (warmup, tail), arrivals_mode, autoscale,
                    inter, trail=trail)
                row["interactive"]["slo_search"] = trail
            rows[name] = row
            if on_result is not None:
                on_result(level, name, row)
        add_recompute_ratios(rows)
        out["loads"][level] = {"load_share": share, "sessions": sessions, "rate_wf_per_s": rate,
                               "policies": rows}
    return out


#: Arrival-rate factors :func:`max_sessions_in_slo` may try (× the run's own rate), from 1 outward.
SLO_RATE_RANGE = (1.0 / 16, 8.0)
#: Share of interactive calls that must be within the TTFT target.
SLO_SHARE = 0.99


def max_sessions_in_slo(prep: Prepared, name: str, cfg: ClusterConfig, arrivals: np.ndarray,
                        gap_fn: Callable[[Call], float] | None, ours: OursOptions | None,
                        window: tuple[float, float], mode: str,
                        autoscale: AutoscaleOptions | None, inter: tuple[set[str], float],
                        refine: int = 2, trail: list[dict] | None = None) -> float:
    """The most concurrent sessions (mean number of workflows in the system) ``name`` holds with
    at least :data:`SLO_SHARE` of interactive calls within the TTFT target: the same workflows
    replayed with arrival times divided by a factor ``f`` (``f`` × the rate), ``f`` doubled from 1
    while the target is met (halved while it is not) within :data:`SLO_RATE_RANGE`, then
    ``refine`` bisections between the last factor that met it and the first that did not. 0 when
    even the smallest factor misses it; at the largest factor, a lower bound. ``trail``, when
    given, receives each run in order (``rate_factor``, ``slo_attainment``,
    ``concurrent_sessions``), so a reader sees which rates met the target, not only the figure."""
    def run(f: float) -> tuple[bool, float]:
        _, row = simulate(prep, name, cfg, arrivals / f, gap_fn, ours, None, window, mode,
                          autoscale, inter)
        it = row["interactive"]
        share = it.get("slo_attainment", 1.0)
        if trail is not None:
            trail.append({"rate_factor": f, "slo_attainment": share,
                          "concurrent_sessions": it["concurrent_sessions"]})
        return share >= SLO_SHARE, it["concurrent_sessions"]

    lo_f, hi_f = SLO_RATE_RANGE
    ok, conc = run(1.0)
    best, lo, hi = (conc, 1.0, None) if ok else (0.0, None, 1.0)
    f = 1.0
    while ok and f * 2 <= hi_f:
        f *= 2
        ok, conc = run(f)
        if ok:
            best, lo = max(best, conc), f
        else:
            hi = f
    while not ok and f / 2 >= lo_f:
        f /= 2
        ok, conc = run(f)
        if ok:
            best, lo = conc, f
        else:
            hi = f
    if lo is None or hi is None:
        return best
    for _ in range(refine):
        mid = math.sqrt(lo * hi)
        ok, conc = run(mid)
        if ok:
            best, lo = max(best, conc), mid
        else:
            hi = mid
    return best


def _recorded_starts(prep: Prepared) -> list[float]:
    first: dict[str, float] = {}
    for r in prep.source.test:
        wf = str(r["workflow_id"])
        t = float(r["t_arrival"])
        if wf not in first or t < first[wf]:
            first[wf] = t
    return sorted(first.values())


def compare_seeds(prep: Prepared, policies: Sequence[str], loads: Sequence[str], cfg: ClusterConfig,
                  seeds: Sequence[int], base: str = "sglang-default", **kw: Any) -> dict:
    """:func:`compare` once per arrival seed; the first seed's result, plus ``seeds``: per load
    and policy the avg/P95 JCT of every seed, their mean and standard deviation, and the ratio
    ``avg JCT(base) / avg JCT(policy)`` per seed (mean, min, max): the spread of a comparison."""
    runs = [compare(prep, policies, loads, cfg, arrival_seed=s, **kw) for s in seeds]
    out = runs[0]
    agg: dict[str, dict] = {}
    for level in out["loads"]:
        per: dict[str, dict] = {}
        for name in out["loads"][level]["policies"]:
            avg = [r["loads"][level]["policies"][name]["avg_jct_s"] for r in runs]
            p95 = [r["loads"][level]["policies"][name]["p95_jct_s"] for r in runs]
            p99 = [r["loads"][level]["policies"][name]["p99_jct_s"] for r in runs]
            settle = [r["loads"][level]["policies"][name]["settling"] for r in runs]
            held = [r["loads"][level]["policies"][name]["gpu_held_s"] for r in runs]
            row = {"avg_jct_s": avg, "p95_jct_s": p95, "settling": settle,
                   "gpu_held_s": held, "gpu_held_s_mean": float(np.mean(held)),
                   "p95_jct_std": float(np.std(p95, ddof=1)) if len(p95) > 1 else 0.0,
                   "avg_jct_mean": float(np.mean(avg)), "avg_jct_std": float(np.std(avg, ddof=1)) if len(avg) > 1 else 0.0,
                   "p95_jct_mean": float(np.mean(p95)),
                   "p99_jct_s": p99, "p99_jct_mean": float(np.mean(p99))}
            for key in ("preprefill_tokens", "preprefill_used_tokens", "preprefill_wasted_tokens",
                        "autoscale_started", "autoscale_drained", "startup_s",
                        "routing_recomputed_tokens", "prefill_tokens", "routing_recompute_share",
                        "capacity_decisions", "capacity_fallbacks", "capacity_moved_sessions",
                        "capacity_move_recompute_tokens", "jobs_per_hour_per_gpu", "jobs_per_hour_per_user"):
                vals = [r["loads"][level]["policies"][name].get(key) for r in runs]
                if all(v is not None for v in vals):
                    row[key] = vals
            if base in out["loads"][level]["policies"]:
                ratio = [r["loads"][level]["policies"][base]["avg_jct_s"] / max(a, 1e-9)
                         for r, a in zip(runs, avg)]
                row.update({f"ratio_vs_{base}": ratio, "ratio_mean": float(np.mean(ratio)),
                            "ratio_min": float(np.min(ratio)), "ratio_max": float(np.max(ratio))})
            per[name] = row
        agg[level] = per
    out["seeds"] = {"seeds": list(seeds), "base": base, "loads": agg}
    return out


def prepare_scenario(name: str, seed: int = 0, n_train: int = 400,
                     profile_dir: str | Path | None = None,
                     replicas: int | None = None) -> tuple[Prepared, ClusterConfig]:
    """The workload, cluster and pools of a named scenario (:mod:`simulator.scenarios`)."""
    sc = get_scenario(name)
    cfg = hardware_config(sc.gpu, sc.model, sc.tp, replicas=sc.replicas,
                          kv_capacity_tokens=sc.kv_capacity_tokens, host_ratio=sc.host_ratio)
    if sc.mix:
        prep = prepare_mix(sc, seed=seed, profile_dir=profile_dir)
    else:
        prep = prepare(sc.workload, sc.burst_workflows, seed=seed, profile_dir=profile_dir,
                       n_train=n_train, cfg=cfg)
    prep.pools = build_pools(prep.workload, sc.pool_replicas, sc.agent_pool,
                             type_pool=sc.type_pool)
    prep.scenario = sc
    return prep, cfg


def prepare_mix(sc: Any, seed: int = 0, profile_dir: str | Path | None = None,
                train_share: float = 0.7) -> Prepared:
    """A scenario's mix of applications (:func:`simulator.sources.mixed`): ``burst_workflows``
    replayed workflows in the mix's shares, the profile fit on every application's train side."""
    parts = [(app, w if w in BUILTIN or Path(w).is_absolute() else str(SCENARIO_ROOT / w), share)
             for app, w, share in sc.mix]
    src = mixed(parts, sc.burst_workflows, seed=seed, train_share=train_share,
                n_train_generated=sc.n_train_generated)
    notes = list(src.notes)
    profile, reused = fit_train_profile(src.train, profile_dir)
    if reused:
        notes.append(f"profile reused from {profile.path} (version {profile.version}): fit "
                     "on this run's train split")
    wl = workload_from_records(src.test, name=src.name, system_tokens=src.system_tokens,
                               conversation_lineage=src.lineage_types or set())
    return Prepared(src.name, src, wl, profile, seed, notes)
