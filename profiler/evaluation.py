"""Score a profile on logs it never saw (``profiler eval``).

The held-out logs are ingested into a throw-away in-memory store (same validation, same derived
columns), then:

* **output length**: ``coverage`` = share of calls whose true output length fell inside the
  predicted band (nominal = the profile's target); ``mean_width`` = mean of hi − lo over calls;
  ``global_band_width`` = width of the one band fit to all agents together (the naive baseline).
* **keep-alive** (``keep_alive``): ``idle_gap_coverage`` = share of held-out idle gaps (a call's
  finish → the same session's next arrival) within the TTL served at the call's arrival (the
  idle-gap model replayed session by session, so its per-session correction sees only earlier
  gaps), every TTL bounded as the keep/drop policy serves it; ``baselines``: ``idle_gap_p95`` (one
  plain training quantile per workflow type) and ``tool_p95`` (today's TTL: the most frequent
  tool's p95) and ``nat_trie`` (NAT's ``cache_control`` TTL: remaining calls × inter-arrival);
  ``end_share`` = calls with no next call (a TTL kept there is wasted). **Cost beside coverage**:
  ``kv_s_per_covered_gap`` = Σ min(TTL, gap) / #covered gaps for ours, each baseline and
  ``oracle`` — the KV-seconds held across the scored gaps (a covered gap holds its KV for the gap,
  a missed one for the whole TTL, then loses it) per gap the TTL covered. The oracle knows each
  gap: it holds exactly the gap when the gap fits under the policy's cap, else nothing (TTL 0), so
  its cost is the least any TTL covering those gaps can pay; ``oracle_coverage`` is its
  coverage (the share of gaps under the cap). ``kv_s_per_covered_gap_with_ends`` adds the whole
  TTL each session's last call holds for nothing (the oracle holds none there). ``ttl_at_cap_share`` = share of scored gaps whose
  served TTL is the policy's cap (``KeepDropPolicy.max_ttl_s``, 120 s).
* **tool latency**: ``p95_coverage`` = share of timed tool executions that finished within the
  served p95 (nominal 0.95); ``ks_max`` = the largest Kolmogorov–Smirnov distance between a tool's
  held-out latencies and its fitted lognormal (tools with ≥ ``MIN_TOOL_SAMPLES`` executions).

**NAT prediction trie** (``baselines.nat_trie``; :mod:`predictors.nat_trie`, the profile's
``nat_trie`` section, fit on the training calls): what NVIDIA NeMo Agent Toolkit's hints say at
each held-out call's (workflow type, agent, agent call index), scored beside ours in
``output_len`` (the band ``[0, p95]``: NAT keeps p50/p90/p95, no interval at our nominal;
``osl_p90_coverage`` = share under the ``osl`` it sends), ``remaining_calls`` (MAE of
``total_requests`` = the mean remaining calls, over every held-out call in call order),
``keep_alive`` (above) and ``remaining_work`` (:mod:`profiler.remaining_eval`). The trie predicts
no next agent, so ``next_agent`` has no NAT row. Absent for a profile without the section.

Other parts add their own keys through :data:`EVAL_EXTENSIONS`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import duckdb
import numpy as np
import pandas as pd
from scipy import stats

from predictors.idle_gap import IdleGapModel
from predictors.keep_alive_compare import compare_held, dominated
from predictors.nat_trie import PredictionTrie, lookup_frame, trie_from_section
from predictors.output_length import OutputLengthIntervals
from predictors.predictor import CompiledProfile
from predictors.tool_latency import MIN_LATENCY_S, ToolLatencyModel
from store import ingest as ingest_mod
from fitting.profile_fit import idle_gap_calls, ok_calls, timed_tool_calls
from store.frames import query_frame
from store.profile_artifact import Profile
from profiler.remaining_eval import remaining_work_scores
from store.duckdb_store import connect
from serving_hooks.policies.keep_drop import KeepDropPolicy
from synth.profile_section import evaluate_workflows

#: Extra evaluations: ``(profile, con) -> dict``, each merged into the result.
EVAL_EXTENSIONS: list[Callable[[Profile, duckdb.DuckDBPyConnection], dict[str, Any]]] = [
    evaluate_workflows, remaining_work_scores,
]
#: Fewest held-out executions of a tool for its KS distance to count in ``ks_max``.
MIN_TOOL_SAMPLES = 5
#: The keep/drop policy at its defaults: a served keep-alive TTL is scored as it holds it.
KEEP_DROP = KeepDropPolicy()


def output_length_scores(profile: Profile, con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    est = OutputLengthIntervals.from_dict(profile.data["output_length"])
    calls = ok_calls(con)
    bands = est.predict(calls)
    y = calls["output_tokens"].to_numpy()
    calls["inside"] = (y >= bands[:, 0]) & (y <= bands[:, 1])
    calls["width"] = bands[:, 1] - bands[:, 0]
    per_agent = {}
    for (wt, agent), g in calls.groupby(["workflow_type_id", "agent_id"], sort=True):
        band, level = est.lookup(wt, agent)
        per_agent[f"{wt}/{agent}"] = {
            "calls": int(len(g)), "coverage": float(g["inside"].mean()),
            "mean_width": float(g["width"].mean()),
            "level": "conditional" if band.get("conditional") else level,
        }
    by_type = {str(wt): {"calls": int(len(g)), "coverage": float(g["inside"].mean()),
                         "mean_width": float(g["width"].mean())}
               for wt, g in calls.groupby("workflow_type_id", sort=True)}
    g = est.global_
    baselines = output_length_baselines(est, calls)
    if (trie := nat_trie(profile)) is not None and len(calls):
        nat = lookup_frame(trie, calls["workflow_type_id"].to_numpy(), calls["agent_id"].to_numpy(),
                           calls["agent_call_index"].to_numpy() + 1)
        p95, p90 = np.nan_to_num(nat["output_p95"]), np.nan_to_num(nat["osl_p90"])   # none found: a miss
        baselines["nat_trie"] = {"coverage": float(np.mean(y <= p95)), "mean_width": float(np.mean(p95)),
                                 "osl_p90_coverage": float(np.mean(y <= p90)),
                                 "band": "[0, p95]", "found_share": float(np.mean(~np.isnan(nat["output_p95"])))}
    return {
        "baselines": baselines,
        "nominal": float(est.coverage),
        "coverage": float(calls["inside"].mean()) if len(calls) else float("nan"),
        "mean_width": float(calls["width"].mean()) if len(calls) else float("nan"),
        "global_band_width": float(g["hi"] - g["lo"]),
        "global_band_coverage": float(np.mean((y >= g["lo"]) & (y <= g["hi"]))) if len(y) else float("nan"),
        "per_agent": per_agent,
        "by_type": by_type,
    }


def output_length_baselines(est: OutputLengthIntervals, calls) -> dict[str, dict[str, float]]:
    """The naive bands a user would compute, fit on the *training* calls (stored in the profile):
    ``global`` = the empirical α/2 and 1 − α/2 quantiles of every training length, and
    ``per_agent_empirical`` = the same per (workflow type, agent), the global band for an agent
    the training logs never saw. ``{"coverage", "mean_width"}`` of each on the held-out calls;
    NaN for a profile written before the empirical bands were stored."""
    y = calls["output_tokens"].to_numpy(dtype=float)
    g_band = est.global_.get("empirical_band")
    if g_band is None or not len(y):
        nan = {"coverage": float("nan"), "mean_width": float("nan")}
        return {"global": dict(nan), "per_agent_empirical": dict(nan)}
    lo = np.full(len(y), float(g_band[0]))
    hi = np.full(len(y), float(g_band[1]))
    out = {"global": {"coverage": float(np.mean((y >= lo) & (y <= hi))), "mean_width": float(np.mean(hi - lo))}}
    keys = calls[["workflow_type_id", "agent_id"]].reset_index(drop=True)
    for (wt, agent), idx in keys.groupby(["workflow_type_id", "agent_id"], sort=False).indices.items():
        band = est.agents_.get(wt, {}).get(agent, {}).get("empirical_band")
        if band is not None:
            lo[idx], hi[idx] = band
    out["per_agent_empirical"] = {"coverage": float(np.mean((y >= lo) & (y <= hi))),
                                  "mean_width": float(np.mean(hi - lo))}
    return out


def nat_trie(profile: Profile) -> PredictionTrie | None:
    """The profile's NAT prediction trie (None for a profile fit before it was stored)."""
    section = profile.data.get("nat_trie")
    return trie_from_section(section) if section else None


def nat_remaining_calls(profile: Profile, con: duckdb.DuckDBPyConnection) -> dict[str, Any] | None:
    """``remaining_calls.baselines.nat_trie``: MAE of NAT's ``total_requests`` (mean remaining
    calls at the call's type, agent and agent call index) against the calls that really followed,
    over every held-out call in call order (``mae``; ``found_share`` = calls the trie had a node
    for; a call it has none for counts 0 remaining)."""
    trie = nat_trie(profile)
    if trie is None:
        return None
    calls = query_frame(con, """
        SELECT workflow_type_id, agent_id, agent_call_index + 1 AS nat_index,
          count(*) OVER (PARTITION BY workflow_type_id, workflow_id)
            - row_number() OVER (PARTITION BY workflow_type_id, workflow_id ORDER BY call_index) AS remaining
        FROM calls ORDER BY workflow_type_id, workflow_id, call_index""")
    if calls.empty:
        return None
    nat = lookup_frame(trie, calls["workflow_type_id"].to_numpy(), calls["agent_id"].to_numpy(),
                       calls["nat_index"].to_numpy())["remaining_calls"]
    truth = calls["remaining"].to_numpy(dtype=float)
    return {"mae": float(np.mean(np.abs(np.nan_to_num(nat) - truth))),
            "found_share": float(np.mean(~np.isnan(nat))), "n": int(len(truth))}


def tool_latency_scores(profile: Profile, con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    model = ToolLatencyModel.from_dict(profile.data["tool_latency"])
    df = timed_tool_calls(con)
    per_tool: dict[str, Any] = {}
    inside = total = 0
    for (wt, tool), g in df.groupby(["workflow_type_id", "tool_name"], sort=True):
        entry = model.lookup(wt, tool)
        x = g["latency_s"].to_numpy()
        if entry is None:
            per_tool[f"{wt}/{tool}"] = {"n": int(len(x)), "known": False}
            continue
        covered = int(np.sum(x <= entry["p95_s"]))
        inside += covered
        total += len(x)
        ks = float(stats.kstest(np.maximum(x, MIN_LATENCY_S), "lognorm",
                                args=(entry["sigma"], 0, np.exp(entry["mu"]))).statistic)
        per_tool[f"{wt}/{tool}"] = {"n": int(len(x)), "known": True, "p95_coverage": covered / len(x),
                                    "ks": ks, "poor_fit": entry["poor_fit"], "p95_s": entry["p95_s"]}
    ks_values = [v["ks"] for v in per_tool.values() if v.get("known") and v["n"] >= MIN_TOOL_SAMPLES]
    return {
        "nominal": 0.95,
        "p95_coverage": inside / total if total else float("nan"),
        "ks_max": max(ks_values) if ks_values else float("nan"),
        "per_tool": per_tool,
    }


class KeepAliveCost(NamedTuple):
    """What a keep-alive TTL per idle gap held and bought (:func:`keep_alive_cost`)."""

    held: np.ndarray                     # the TTL held per gap (bounded as the policy holds it)
    covered: np.ndarray                  # per gap: it ended within the TTL held (bool)
    kv_s_per_covered_gap: float | None   # Σ min(held, gap) [+ held after session ends] / #covered


def keep_alive_cost(gap: np.ndarray, ttl: np.ndarray, *, bounded: bool = True,
                    end_ttl: np.ndarray | None = None) -> KeepAliveCost:
    """The one keep-alive scoring formula (``profiler eval`` and ``eval --online``).

    ``ttl`` (served TTL per gap) is held as the keep/drop policy holds it (:meth:`KeepDropPolicy.ttl_s`
    itself: bounded to ``[min_ttl_s, max_ttl_s]``, a NaN — no TTL served — held for
    ``default_ttl_s``) unless ``bounded`` is False (the oracle). A gap is covered when it ends within
    the TTL held; the KV-seconds held are ``min(TTL, gap)`` per gap (a covered gap holds its KV for
    the gap, a missed one for the whole TTL, then loses it), plus, with ``end_ttl``, the whole TTL
    held after each session's last call (no next call: held for nothing). The cost is those
    KV-seconds per covered gap (None: none covered)."""
    policy_ttl = np.vectorize(lambda t: KEEP_DROP.ttl_s(None if np.isnan(t) else float(t)), otypes=[float])

    def hold(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        return policy_ttl(t) if bounded and len(t) else t

    held, gap = hold(ttl), np.asarray(gap, dtype=float)
    covered = gap <= held
    n = int(covered.sum())
    kv = float(np.sum(np.minimum(held, gap)))
    if end_ttl is not None and len(end_ttl):
        kv += float(np.sum(hold(end_ttl)))
    return KeepAliveCost(held, covered, kv / n if n else None)


def keep_alive_baseline_ttls(profile: Profile, con: duckdb.DuckDBPyConnection,
                             df: pd.DataFrame) -> dict[str, np.ndarray]:
    """The TTL each keep-alive baseline serves at each row of ``df`` (columns
    ``workflow_type_id, workflow_id, agent_id, call_index``; held-out calls of ``con``):
    ``idle_gap_p95`` (one plain training quantile per workflow type), ``tool_p95`` (the agent's
    most frequent tool's p95, NaN where none: held at the policy's default) and, with the
    profile's trie, ``nat_trie`` (NAT's ``cache_control`` TTL, remaining calls × inter-arrival;
    0 where the trie has no node). One definition for ``profiler eval`` and ``eval --online``."""
    model = IdleGapModel.from_dict(profile.data["idle_gap"])
    wt = df["workflow_type_id"].astype(str)
    out = {"idle_gap_p95": wt.map({k: v.get("baseline_quantile_s") for k, v in
                                   model.workflow_types_.items()}).to_numpy(dtype=float)}
    compiled = CompiledProfile(profile.data, profile.version)
    out["tool_p95"] = np.array([np.nan if (e := compiled.agents.get(k)) is None or e.retain_s is None
                                else e.retain_s for k in zip(wt, df["agent_id"].astype(str))], dtype=float)
    trie = nat_trie(profile)
    if trie is not None:
        nat = np.zeros(len(df))
        if len(df):
            index = query_frame(con, "SELECT workflow_type_id, workflow_id, call_index, "
                                     "agent_call_index + 1 AS nat_index FROM calls")
            keys = ["workflow_type_id", "workflow_id", "call_index"]
            nat_index = df[keys].astype({"workflow_type_id": str, "workflow_id": str}).merge(
                index.astype({"workflow_type_id": str, "workflow_id": str}), how="left", on=keys)["nat_index"]
            nat = np.nan_to_num(lookup_frame(trie, wt.to_numpy(), df["agent_id"].astype(str).to_numpy(),
                                             nat_index.fillna(1).to_numpy(dtype=int))["ttl_s"])
        out["nat_trie"] = nat
    return out


def keep_alive_vs(gap: np.ndarray, ours: np.ndarray, other: np.ndarray, groups: np.ndarray) -> dict[str, Any]:
    """Ours minus another keep-alive TTL on the same idle gaps, both held as the keep/drop policy
    holds them (:func:`keep_alive_cost`): coverage and KV-seconds per covered gap ± their
    delete-one-workflow jackknife errors, and ``dominated`` (the other ahead beyond one error;
    :func:`predictors.keep_alive_compare.compare_held`). Session ends are not counted: this eval
    would charge our TTL there although the keep/drop policy drops a session it predicts ends."""
    return compare_held(gap, keep_alive_cost(gap, ours).held, keep_alive_cost(gap, other).held, groups)


#: Whether a baseline dominates ours, from ours minus it (:func:`predictors.keep_alive_compare.dominated`).
keep_alive_dominated = dominated


def keep_alive_scores(profile: Profile, con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Coverage of held-out idle gaps by the served keep-alive TTL, beside the baselines, and
    ours minus each baseline ± its jackknife error (``vs_baselines``, :func:`keep_alive_vs`)."""
    section = profile.data.get("idle_gap")
    if not section:
        return {"idle_gap_coverage": None, "nominal": None, "reason": "profile has no idle_gap section"}
    model = IdleGapModel.from_dict(section)
    df = idle_gap_calls(con)
    ours = model.predict_sessions(df)
    base_ttls = keep_alive_baseline_ttls(profile, con, df)
    base, tool = base_ttls["idle_gap_p95"], base_ttls["tool_p95"]
    trie = True if "nat_trie" in base_ttls else None
    nat = base_ttls.get("nat_trie", np.zeros(len(df)))

    gap = df["gap_after_s"].to_numpy(dtype=float)
    groups = (df["workflow_type_id"].astype(str) + "\x1f" + df["workflow_id"].astype(str)).to_numpy()
    has = ~np.isnan(gap)
    scored = has & ~np.isnan(ours)
    end = ~has & ~np.isnan(ours)

    def cov(ttl: np.ndarray, mask: np.ndarray) -> float | None:
        return float(np.mean(keep_alive_cost(gap[mask], ttl[mask]).covered)) if mask.any() else None

    def mean(ttl: np.ndarray, mask: np.ndarray) -> float | None:
        return float(np.mean(keep_alive_cost(gap[mask], ttl[mask]).held)) if mask.any() else None

    def nat_cov(mask: np.ndarray) -> float | None:
        return cov(nat, mask) if trie is not None else None

    cap = KEEP_DROP.max_ttl_s
    oracle = np.where(gap <= cap, gap, 0.0)   # hindsight: hold exactly the gap, or nothing

    def kv_cost(ttl: np.ndarray, mask: np.ndarray, bounded: bool = True,
                ends: np.ndarray | None = None) -> float | None:
        """KV-seconds held over the gaps of ``mask`` per gap covered (None: none covered); with
        ``ends``, plus the whole TTL held after each of those session-ending calls."""
        return keep_alive_cost(gap[mask], ttl[mask], bounded=bounded,
                               end_ttl=ttl[ends] if ends is not None else None).kv_s_per_covered_gap

    def at_cap(ttl: np.ndarray, mask: np.ndarray) -> float | None:
        return float(np.mean(keep_alive_cost(gap[mask], ttl[mask]).held >= cap)) if mask.any() else None

    def per_policy(score: Callable[[np.ndarray], float | None]) -> dict[str, float | None]:
        """``score`` of ours' and each baseline's TTLs (the NAT trie's None without one)."""
        return {"ours": score(ours), "idle_gap_p95": score(base), "tool_p95": score(tool),
                "nat_trie": score(nat) if trie is not None else None}

    per_type = {}
    for wt in sorted(set(df["workflow_type_id"])):
        m = scored & (df["workflow_type_id"] == wt).to_numpy()
        per_type[wt] = {"gaps": int(m.sum()), "idle_gap_coverage": cov(ours, m), "mean_ttl_s": mean(ours, m),
                        "idle_gap_p95": cov(base, m), "tool_p95": cov(tool, m), "nat_trie": nat_cov(m),
                        "kv_s_per_covered_gap": kv_cost(ours, m), "ttl_at_cap_share": at_cap(ours, m),
                        "level": (model.workflow_types_.get(wt) or {}).get("level"),
                        # the fit's forward check: "chosen" (the CV choice) or "pooled" (the type's quantile)
                        "forward_served": ((model.workflow_types_.get(wt) or {}).get("forward") or {}).get("served")}
    return {
        "idle_gap_coverage": cov(ours, scored),
        "nominal": float(model.quantile),
        "gaps": int(scored.sum()),
        "idle_gap_coverage_unbounded": float(np.mean(gap[scored] <= ours[scored])) if scored.any() else None,
        "mean_ttl_s": mean(ours, scored),
        "scored_share": float(scored.sum() / has.sum()) if has.any() else None,
        "end_share": float(np.mean(~has)) if len(gap) else None,
        "wasted_keep_s_mean": mean(ours, end),
        "baselines": {"idle_gap_p95": cov(base, scored), "tool_p95": cov(tool, scored),
                      "nat_trie": nat_cov(scored)},
        "baseline_mean_ttl_s": {"idle_gap_p95": mean(base, scored), "tool_p95": mean(tool, scored),
                                "nat_trie": mean(nat, scored) if trie is not None else None},
        "kv_s_per_covered_gap": {**per_policy(lambda t: kv_cost(t, scored)),
                                 "oracle": kv_cost(oracle, scored, bounded=False)},
        # the same plus the TTL each session's last call holds for nothing (the oracle holds none)
        "kv_s_per_covered_gap_with_ends": {**per_policy(lambda t: kv_cost(t, scored, ends=end)),
                                           "oracle": kv_cost(oracle, scored, bounded=False)},
        "oracle_coverage": float(np.mean(gap[scored] <= cap)) if scored.any() else None,
        "ttl_at_cap_share": per_policy(lambda t: at_cap(t, scored)),
        "vs_baselines": {name: keep_alive_vs(gap[scored], ours[scored], ttl[scored], groups[scored])
                         for name, ttl in base_ttls.items()},
        "by_workflow_type": per_type,
    }


def evaluate_store(profile: Profile, con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """All scores of ``profile`` on the calls already loaded in ``con``."""
    calls, workflows = con.execute(
        "SELECT count(*), count(DISTINCT (workflow_type_id, workflow_id)) FROM calls").fetchone()
    result: dict[str, Any] = {
        "profile_version": profile.version,
        "calls": int(calls),
        "workflows": int(workflows),
        "output_len": output_length_scores(profile, con),
        "tool_latency": tool_latency_scores(profile, con),
        "keep_alive": keep_alive_scores(profile, con),
    }
    for extension in EVAL_EXTENSIONS:
        result.update(extension(profile, con))
    if isinstance(result.get("remaining_calls"), dict) and (nat := nat_remaining_calls(profile, con)):
        result["remaining_calls"].setdefault("baselines", {})["nat_trie"] = nat
    return result


def evaluate(profile: Profile, paths: Sequence[str | Path], *, strict: bool = False,
             progress: bool = False) -> tuple[dict[str, Any], ingest_mod.IngestReport]:
    """Ingest ``paths`` into a temporary store and score ``profile`` on them."""
    con = connect(None)
    try:
        report = ingest_mod.ingest(con, paths, strict=strict, progress=progress)
        if con.execute("SELECT count(*) FROM calls").fetchone()[0] == 0:
            raise ValueError("no valid calls in the evaluation logs")
        return evaluate_store(profile, con), report
    finally:
        con.close()
