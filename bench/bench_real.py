"""Ours vs naive baselines on real traces and the messy generator, on held-out workflows.

    python bench/bench_real.py [--sets agentless,whowhen,swe_agent,mini_swe,messy] [--cv K] [--time]
                               [--messy-seeds 0,1,2] [--messy-workflows 200] [--no-task-groups] [--json]
    python bench/bench_real.py --sets coding-assistant,deep-research   # generated sets + Bayes bound
    python bench/bench_real.py --time            # also: per type, train on the 70 % that started first

For every real set (the full files in ``../shared/datasets/`` when that folder exists, else the
small copies in ``datasets/real/``; ``--data`` picks another folder) and for the messy workload
(several seeds): split 70/30 by workflow (``profiler split``, seed 0), fit on train (``profiler
fit``), score on test (``profiler eval``), and print one "ours vs baselines" table (a column per
set). With ``--cv K`` every set is scored by K-fold cross-validation by workflow instead, the
folds grouped by task where a set repeats one (:data:`TASK_GROUPS`; ``--no-task-groups`` deals
workflows). ``--time`` adds a time-ordered split (per type, fit on the 70 % of workflows that
started first) and, on it, the band and keep-alive TTL replayed online (``profiler eval
--online``) beside the static ones, with the global band on the same calls, the served minus
global coverage and width ± their jackknife standard errors and the global arm's share of the
served bands (:mod:`predictors.online_calibration`). For the generated Pythia workloads the bench also prints the
**Bayes bound** of next-agent top-1 (the generator's own structure simulated to get
P(next | whole history)). After each table, the remaining-tokens C-index of ours beside every
baseline, with ours minus the best baseline ± its jackknife standard error; and the keep-alive
TTL beside every keep-alive baseline (coverage and KV-seconds per covered gap, ours minus each ±
its delete-one-workflow jackknife error, "DOMINATED" where the baseline is ahead beyond one error):
on the main 70/30 split both the fitted TTL (``profiler eval``) and the TTL served online (``profiler
eval --online``: the serving Predictor's, the one the headline scores; ``--cv`` has only the fitted
one), on the time split the TTL served online. Last, every headline
figure (bands served vs the global band on the time split, next-agent top-1 and log-loss, remaining
calls MAE, remaining-tokens C-index, keep-alive) as ours minus every baseline ± its jackknife error
with a "DOMINATED" flag (:func:`headline_rows`; ``headline`` in ``--json``).

The command line, the data source of every set and the wall time are printed with the table;
``--json`` prints all of it, every eval result included, as one object. What each table holds and
the measured figures: docs/evaluation.md, "bench/bench_real.py".
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from collections import Counter, defaultdict
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scoring.baseline_table import baseline_rows, baseline_table  # noqa: E402
from profiler.commands.common import print_json  # noqa: E402
from scoring.cross_validation import aggregate, cross_validate, nest  # noqa: E402
from scoring.evaluation import evaluate, keep_alive_dominated  # noqa: E402
from scoring.online_eval import evaluate_online  # noqa: E402
from fitting.profile_fit import fit_profile  # noqa: E402
from store.split import split_logs  # noqa: E402
from store.workloads import _expand, generate, load_spec, write_jsonl  # noqa: E402

#: Short name -> file name of the real sets (in ../shared/datasets or datasets/real).
REAL_SETS = {
    "agentless": "agentless_pr28.jsonl",
    "whowhen": "seq_whowhen_magentic_captain.jsonl",
    "swe_agent": "swe_agent_glm45_bs4.jsonl",
    "mini_swe": "mini_swe_agent_gemini3.jsonl",
}
#: Generated sets (workload name -> workflows) scored beside their Bayes bound.
GENERATED = {"coding-assistant": 400, "deep-research": 400, "drift-team": 400}
#: Sets whose workflows repeat a task: (field, pattern) of the task id, for grouped CV folds.
TASK_GROUPS = {"swe_agent": ("workflow_id", "[^/]+$"), "agentless": ("workflow_id", "[^/]+$")}
SHARED = REPO.parent / "shared" / "datasets"
SMALL = REPO / "datasets" / "real"
#: The full SWE-agent set ships in the repository itself (datasets/swe_agent/): datasets/real/
#: has no copy of it, so `profiler fit datasets/` reads each call once.
BUNDLED = REPO / "datasets" / "swe_agent"


def real_source(name: str, data: Path | None) -> Path:
    """The file of real set ``name``: in ``data`` if given, else the full set, else the copy."""
    for folder in ([data, BUNDLED] if data else [SHARED, SMALL, BUNDLED]):
        path = folder / REAL_SETS[name]
        if path.exists():
            return path
    raise SystemExit(f"error: {REAL_SETS[name]} not found in {data or f'{SHARED} or {SMALL}'}")


def bayes_top1(workload: str, test: Path, n_sim: int = 200_000, seed: int = 12345) -> dict[str, float]:
    """Next-agent top-1 of the Bayes oracle of a generated workload (see the module docstring):
    ``bayes_top1_expected`` = E[max_y P(y | history)] per scored call, ``bayes_top1_heldout`` =
    the oracle's hits on the held-out sequences in ``test`` (a file or folder of records)."""
    spec = load_spec(workload)
    rng = np.random.default_rng(seed)
    table: dict[tuple[str, ...], Counter] = defaultdict(Counter)
    for _ in range(n_sim):
        seq = [a for stage in _expand(spec["structure"], rng) for a in stage]
        for i in range(1, len(seq)):
            table[tuple(seq[:i])][seq[i]] += 1
    hits = sum(max(c.values()) for c in table.values())
    events = sum(sum(c.values()) for c in table.values())
    calls: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for f in ([test] if test.is_file() else sorted(test.rglob("*.jsonl"))):
        for line in f.open():
            r = json.loads(line)
            calls[r["workflow_id"]].append((r["t_arrival"], r["agent_id"]))
    ok = n = 0
    for rows in calls.values():
        seq = [a for _, a in sorted(rows)]
        for i in range(1, len(seq)):
            row = table.get(tuple(seq[:i]))
            n += 1
            ok += bool(row) and min(row, key=lambda y: (-row[y], y)) == seq[i]
    return {"bayes_top1_expected": hits / events, "bayes_top1_heldout": ok / max(n, 1)}


def split_fit_eval(logs: list[Path], work: Path, order: str = "hash") -> dict[str, Any]:
    """70/30 split by workflow (``order``: ``hash``, seed 0, or ``time``: past → train), fit on
    70, eval on 30 (the profiler's own code paths). The result also holds ``online_band``
    (:func:`online_band`: the same test side replayed through the serving Predictor), on either
    split: the keep-alive headline scores the TTL served online (eval scores what serving serves)."""
    split_logs(logs, work / "split", train=0.7, seed=0, order=order)
    profile, _ = fit_profile([work / "split" / "train"], work / "profile")
    result, _ = evaluate(profile, [work / "split" / "test"])
    result["online_band"] = online_band(evaluate_online(profile, [work / "split" / "test"])[0])
    return result


def online_band(online: dict[str, Any]) -> dict[str, Any]:
    """The band figures of a ``profiler eval --online`` result: ``{nominal, served, online,
    static, by_type: {type: {online, static}}}`` with ``{coverage, mean_width}`` each; ``served``
    names the one the serving Predictor serves (``online``: it calibrates by default).
    ``keep_alive``: the same for the keep-alive TTL (``{nominal, online, static, by_type}`` with
    ``{coverage, mean_ttl_s, kv_s_per_covered_gap}`` each; absent without an idle-gap model).
    ``remaining_tokens``: the result's remaining-work block as it is (:func:`remaining_online_table`)."""
    def pick(s: dict[str, Any]) -> dict[str, Any]:
        return {"coverage": s["coverage"], "mean_width": s["mean_width"]}

    def pick_ka(s: dict[str, Any]) -> dict[str, Any]:
        return {k: s[k] for k in ("coverage", "mean_ttl_s", "kv_s_per_covered_gap")}
    out = {"nominal": online["nominal"], "served": "online",
           "online": pick(online["online"]), "static": pick(online["static"]),
           "global": pick(online["baselines"]["global"]), "online_vs_global": online.get("online_vs_global"),
           "band_arms": online.get("band_arms") or {},
           "by_type": {wt: {"calls": t["calls"], "online": pick(t["online"]), "static": pick(t["static"]),
                            "global": pick(t["global"]) if t.get("global") else None,
                            "online_vs_global": t.get("online_vs_global")}
                       for wt, t in online["by_type"].items()}}
    out["remaining_tokens"] = online.get("remaining_tokens")
    ka = online.get("keep_alive")
    if ka and ka.get("gaps"):
        out["keep_alive"] = {"nominal": ka["nominal"], "gaps": ka["gaps"],
                             "online": pick_ka(ka["online"]), "static": pick_ka(ka["static"]),
                             "baselines": {n: pick_ka(b) for n, b in (ka.get("baselines") or {}).items()},
                             "vs_baselines": ka.get("vs_baselines") or {},
                             "selection": ka.get("selection") or {},
                             "by_type": {wt: {"gaps": t["gaps"], "online": pick_ka(t["online"]),
                                              "static": pick_ka(t["static"])} for wt, t in ka["by_type"].items()}}
    return out


def online_band_table(timed: dict[str, dict[str, Any]]) -> Table:
    """Per set and workflow type: the static (fitted) band vs the online-calibrated (served) band
    on the time split (coverage, mean width), the global band beside them with the served minus
    global differences ± their jackknife standard errors and the global arm's share of the served
    bands (switches), and the same for the keep-alive TTL (coverage of the idle gaps, KV-seconds
    held per covered gap; n/a without real times)."""
    table = Table(title="output-length band and keep-alive TTL on the time split: static (fitted) vs online "
                        "(served: the Predictor calibrates both online by default)")
    for col in ("set", "type", "nominal", "static coverage", "static width", "online coverage (served)",
                "online width (served)", "global coverage", "global width", "served − global coverage ± se",
                "served − global width ± se", "global arm served (switches)", "keep-alive nominal",
                "keep-alive static coverage",
                "static KV-s / covered gap", "keep-alive online coverage (served)", "online KV-s / covered gap"):
        table.add_column(col, justify="left" if col in ("set", "type") else "right")

    def fmt(x: Any, spec: str) -> str:
        return "n/a" if x is None or x != x else format(x, spec)
    for label, s in timed.items():
        r = s.get("result") or {}
        band = r.get("mean", r).get("online_band") if "folds" in r else r.get("online_band")
        if not band:
            continue
        ka = band.get("keep_alive") or {}
        ka_types = ka.get("by_type") or {}
        arms = band.get("band_arms") or {}
        rows = [("all", band, ka)] + [(wt, b, ka_types.get(wt) or {})
                                      for wt, b in sorted((band.get("by_type") or {}).items())]

        def diff(v: dict | None, key: str, spec: str) -> str:
            if not v or v.get(key) is None:
                return "n/a"
            se = v.get(f"{key}_se")
            mark = " (dominated)" if key == "coverage_diff" and v.get("dominated") else ""
            return f"{v[key]:+{spec}}" + (f" ± {se:{spec}}" if se is not None else "") + mark
        for wt, b, k in rows:
            a = ({"served": sum(x["served"] for x in arms.values()),
                  "served_global": sum(x["served_global"] for x in arms.values()),
                  "switches": sum(x["switches"] for x in arms.values())} if wt == "all" else arms.get(wt))
            g = b.get("global") or {}
            table.add_row(label, wt, fmt(band.get("nominal"), ".2f"),
                          fmt(b["static"].get("coverage"), ".3f"), fmt(b["static"].get("mean_width"), ",.0f"),
                          fmt(b["online"].get("coverage"), ".3f"), fmt(b["online"].get("mean_width"), ",.0f"),
                          fmt(g.get("coverage"), ".3f"), fmt(g.get("mean_width"), ",.0f"),
                          diff(b.get("online_vs_global"), "coverage_diff", ".3f"),
                          diff(b.get("online_vs_global"), "width_diff", ",.0f"),
                          f"{a['served_global']:,.0f}/{a['served']:,.0f} ({a['switches']:,.0f})" if a else "n/a",
                          fmt(ka.get("nominal"), ".2f"),
                          fmt((k.get("static") or {}).get("coverage"), ".3f"),
                          fmt((k.get("static") or {}).get("kv_s_per_covered_gap"), ".2f"),
                          fmt((k.get("online") or {}).get("coverage"), ".3f"),
                          fmt((k.get("online") or {}).get("kv_s_per_covered_gap"), ".2f"))
    return table


def remaining_online_table(timed: dict[str, dict[str, Any]]) -> Table:
    """Per set (and per messy seed): the remaining-tokens C-index on the time split replayed
    online (``profiler eval --online`` → ``remaining_tokens``): the static (fitted) figure, the
    served one with the online selection on (:mod:`predictors.online_selection`), the position
    median and ``mrl`` on the same calls, the differences ± their jackknife standard errors, and what the
    selection serves each type at the end of the replay. ``[i]``: the i-th of ``--messy-seeds``."""
    table = Table(title="remaining-tokens C-index on the time split, replayed online: static (the fit's figure) vs "
                        "online selection (served by default) vs position median and mrl (same calls)")
    for col in ("set", "static", "online", "position median", "mrl", "static − pm ± se", "online − pm ± se",
                "online − mrl ± se", "online − static ± se", "log1p MAE static / online / pm",
                "served at end (switches)"):
        table.add_column(col, justify="left" if col in ("set", "served at end (switches)") else "right")

    def pm(d: dict[str, Any] | None) -> str:
        return "n/a" if not d else f"{d['c_index_diff']:+.3f} ± {d['c_index_diff_se']:.3f}"

    def c(x: dict[str, Any]) -> str:
        return "n/a" if x.get("c_index") is None else f"{x['c_index']:.3f}"

    def mae(x: dict[str, Any]) -> str:
        return "n/a" if x.get("log1p_mae") is None else f"{x['log1p_mae']:.3f}"
    for label, s in timed.items():
        r = s.get("result") or {}
        parts = ([(f"{label} [{i}]", f) for i, f in enumerate(r["folds"])] if "folds" in r
                 else [(label, r)])
        for name, part in parts:
            rw = (part.get("online_band") or {}).get("remaining_tokens")
            if not rw:
                continue
            base = rw["baselines"]["position_median"]
            sel = ", ".join(f"{wt}: {v['served']} ({v['switches']})" for wt, v in sorted(rw["selection"].items()))
            table.add_row(name, c(rw["static"]), c(rw["online"]), c(base), c(rw["baselines"]["mrl"]),
                          pm(rw["vs_position_median"]["static"]), pm(rw["vs_position_median"]["online"]),
                          pm(rw.get("vs_mrl", {}).get("online")), pm(rw["online_minus_static"]),
                          f"{mae(rw['static'])} / {mae(rw['online'])} / {mae(base)}", sel or "n/a")
    return table


#: Baselines of the keep-alive TTL (``keep_alive.vs_baselines``).
KA_BASELINES = ("idle_gap_p95", "tool_p95", "nat_trie")


def keep_alive_parts(result: dict[str, Any], served: bool) -> list[tuple[dict[str, Any], float]]:
    """The keep-alive blocks of one set's result with their weights (scored gaps): one for a
    single split, one per fold or messy seed otherwise. ``served``: the split's online
    replay (``online_band.keep_alive``: the TTL the serving Predictor serves, calibrated online),
    else ``profiler eval``'s static scores (``keep_alive``)."""
    if "folds" in result:
        return [p for f in result["folds"] for p in keep_alive_parts(f.get("result", f), served)]
    if served:
        ka = (result.get("online_band") or {}).get("keep_alive") or {}
        return [(ka, float(ka.get("gaps") or 0))] if ka.get("vs_baselines") else []
    ka = result.get("keep_alive") or {}
    return [(ka, float(ka.get("gaps") or 0))] if ka.get("vs_baselines") else []


def keep_alive_vs(result: dict[str, Any], name: str, served: bool) -> dict[str, Any] | None:
    """Ours minus baseline ``name`` on the keep-alive TTL (coverage, KV-seconds per covered gap,
    each ± its delete-one-workflow jackknife error; ``dominated``), pooled over folds or messy seeds
    weighted by scored gaps, the parts' errors added as independent (disjoint held-out workflows)."""
    parts = [(ka["vs_baselines"].get(name), w) for ka, w in keep_alive_parts(result, served)]
    parts = [(v, w) for v, w in parts if v and v.get("coverage_diff") is not None and w > 0]
    if not parts:
        return None
    total = sum(w for _, w in parts)

    def pool(key: str) -> tuple[float | None, float | None]:
        got = [(v[key], v.get(f"{key}_se") or 0.0, w) for v, w in parts if v.get(key) is not None]
        if not got:
            return None, None
        tw = sum(w for *_, w in got)
        return (sum(w * d for d, _, w in got) / tw, float(np.sqrt(sum((w * se) ** 2 for _, se, w in got))) / tw)
    dc, dc_se = pool("coverage_diff")
    dk, dk_se = pool("kv_s_diff")
    return {"coverage_diff": dc, "coverage_diff_se": dc_se, "kv_s_diff": dk, "kv_s_diff_se": dk_se, "gaps": total,
            "dominated": dk is not None and keep_alive_dominated(dc, dc_se, dk, dk_se)}


def keep_alive_table(results: dict[str, dict[str, Any]], title: str, served: bool) -> Table:
    """Per set: the keep-alive TTL's coverage of the held-out idle gaps and KV-seconds per covered
    gap, ours (``served``: the online replay, the TTL the serving Predictor serves) beside every baseline, then ours
    minus each ± its jackknife error, "dominated" where the baseline is ahead beyond one error
    (:func:`scoring.evaluation.keep_alive_dominated`)."""
    table = Table(title=title)
    for col in ("set", "gaps", "ours coverage / KV-s", *(f"{n} coverage / KV-s" for n in KA_BASELINES),
                *(f"ours − {n}: coverage ± se, KV-s ± se" for n in KA_BASELINES)):
        table.add_column(col, justify="left" if col == "set" else "right")

    def figure(r: dict[str, Any], which: str) -> str:
        parts = keep_alive_parts(r, served)
        vals = []
        for ka, w in parts:
            if served:
                s = ka.get("online") if which == "ours" else (ka.get("baselines") or {}).get(which)
                c, k = (s or {}).get("coverage"), (s or {}).get("kv_s_per_covered_gap")
            else:
                c = ka.get("idle_gap_coverage") if which == "ours" else (ka.get("baselines") or {}).get(which)
                k = (ka.get("kv_s_per_covered_gap") or {}).get(which)
            if c is not None and k is not None:
                vals.append((c, k, w))
        tw = sum(w for *_, w in vals)
        if not vals or tw <= 0:
            return "n/a"
        return f"{sum(c * w for c, _, w in vals) / tw:.3f} / {sum(k * w for _, k, w in vals) / tw:.2f}"
    for label, r in results.items():
        parts = keep_alive_parts(r, served)
        if not parts:
            continue
        cells = []
        for n in KA_BASELINES:
            v = keep_alive_vs(r, n, served)
            if v is None:
                cells.append("n/a")
                continue
            kv = "n/a" if v["kv_s_diff"] is None else f"{v['kv_s_diff']:+.2f} ± {(v['kv_s_diff_se'] or 0):.2f}"
            cells.append(f"{v['coverage_diff']:+.3f} ± {(v['coverage_diff_se'] or 0):.3f}, {kv}"
                         + (" DOMINATED" if v["dominated"] else ""))
        table.add_row(label, f"{sum(w for _, w in parts):,.0f}", figure(r, "ours"),
                      *(figure(r, n) for n in KA_BASELINES), *cells)
    return table


def _parts(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The single eval results of one set's result (its folds or messy seeds, else itself)."""
    if "folds" in result:
        return [q for f in result["folds"] for q in _parts(f.get("result", f))]
    return [result]


def _pool(got: list[tuple[float, float | None, float]]) -> tuple[float, float] | None:
    """Parts' ``(diff, se, weight)`` as one: the weighted mean, ``se = √(Σ (w·se)²) / Σ w``
    (disjoint held-out workflows: independent errors)."""
    got = [(d, se or 0.0, w) for d, se, w in got if d is not None and w > 0]
    if not got:
        return None
    total = sum(w for *_, w in got)
    return (sum(w * d for d, _, w in got) / total, float(np.sqrt(sum((w * se) ** 2 for _, se, w in got))) / total)


def keep_alive_served(result: dict[str, Any]) -> bool:
    """Whether ``result`` holds the keep-alive TTL served online (a single split's, or every seed's;
    not ``--cv``, whose folds are scored by ``profiler eval`` alone): the keep-alive headline scores
    it where it does, the fitted TTL otherwise."""
    parts = _parts(result)
    return bool(parts) and all(((q.get("online_band") or {}).get("keep_alive") or {}).get("vs_baselines")
                               for q in parts)


def headline_rows(result: dict[str, Any], served: bool,
                  ka_served: bool | None = None) -> list[tuple[str, str, str, bool]]:
    """Every headline figure of one set beside every baseline: ``(figure, baseline, "ours − it ±
    se", dominated)``. Bands: the served (online) band minus the global band on the time split
    (``online_vs_global``: coverage and width); next agent: top-1 and log-loss minus markov1,
    markov_vo, markov_wb; remaining calls: MAE minus the position median; remaining tokens:
    C-index minus each :data:`RW_BASELINES` (``served``: of the order replayed online, as the
    Predictor serves it, pooled over parts weighted by their scored calls); keep-alive: coverage and KV-seconds per covered gap
    minus each :data:`KA_BASELINES`, served online wherever the result holds the online replay
    (``ka_served``, default :func:`keep_alive_served`), else as fitted. Errors: delete-one-workflow
    (or session) jackknife, pooled over folds or seeds; dominated: the baseline ahead beyond one."""
    parts = _parts(result)
    rows: list[tuple[str, str, str, bool]] = []
    if served:
        got = [((q.get("online_band") or {}).get("online_vs_global") or {}, float(q.get("calls") or 0)) for q in parts]
        c = _pool([(v.get("coverage_diff"), v.get("coverage_diff_se"), w) for v, w in got if v])
        wd = _pool([(v.get("width_diff"), v.get("width_diff_se"), w) for v, w in got if v])
        if c and wd:
            rows.append(("output band, served (coverage; width)", "global",
                         f"{c[0]:+.3f} ± {c[1]:.3f}; {wd[0]:+,.0f} ± {wd[1]:,.0f}",
                         bool((c[0] < -c[1] and wd[0] >= 0) or (c[0] <= 0 and wd[0] > wd[1]))))
    for name in ("markov1", "markov_vo", "markov_wb"):
        for metric, label, worse in (("top1", "next agent top-1", -1), ("log_loss", "next agent log-loss", 1)):
            got = [(((q.get("next_agent") or {}).get("vs_baselines") or {}).get(name) or {}) for q in parts]
            pooled = _pool([(v.get(f"{metric}_diff"), v.get(f"{metric}_diff_se"), float(v.get(f"{metric}_n") or 0))
                            for v in got])
            if pooled:
                rows.append((label, name, f"{pooled[0]:+.3f} ± {pooled[1]:.3f}", worse * pooled[0] > pooled[1]))
    got = [(((q.get("remaining_calls") or {}).get("vs_baselines") or {}).get("position_median") or {}) for q in parts]
    pooled = _pool([(v.get("mae_diff"), v.get("mae_diff_se"), float(v.get("mae_n") or 0)) for v in got])
    if pooled:
        rows.append(("remaining calls MAE", "position_median", f"{pooled[0]:+.2f} ± {pooled[1]:.2f}",
                     pooled[0] > pooled[1]))
    for name in RW_BASELINES:
        jk = c_index_diff(result, name)
        if served:     # the order the Predictor serves: replayed online (the selection is on by default)
            rws = [(q.get("online_band") or {}).get("remaining_tokens") or {} for q in parts]
            got = [((rw.get("online_vs_baselines") or {}).get(name) or {}, float(rw.get("calls") or 0)) for rw in rws]
            jk = _pool([(v.get("c_index_diff"), v.get("c_index_diff_se"), w) for v, w in got]) if all(v for v, _ in got) else None
        if jk is not None:
            rows.append(("remaining tokens C-index" + (", served" if served else ""), name,
                         f"{jk[0]:+.3f} ± {jk[1]:.3f}", jk[0] < -jk[1]))
    ka_served = keep_alive_served(result) if ka_served is None else ka_served
    for name in KA_BASELINES:
        v = keep_alive_vs(result, name, ka_served)
        if v is not None:
            kv = "n/a" if v["kv_s_diff"] is None else f"{v['kv_s_diff']:+.2f} ± {(v['kv_s_diff_se'] or 0):.2f}"
            rows.append(("keep-alive (coverage; KV-s per covered gap)" + (", served" if ka_served else ""), name,
                         f"{v['coverage_diff']:+.3f} ± {(v['coverage_diff_se'] or 0):.3f}; {kv}", v["dominated"]))
    return rows


def headline_table(results: dict[str, dict[str, Any]], title: str, served: bool) -> Table:
    """Per set, :func:`headline_rows`: ours minus every baseline on every headline figure ± its
    jackknife error, and "DOMINATED" where the baseline is ahead beyond one error."""
    table = Table(title=title)
    for col in ("set", "figure", "baseline", "ours − baseline ± se", "dominated?"):
        table.add_column(col, justify="right" if col == "ours − baseline ± se" else "left")
    for label, r in results.items():
        for i, (figure, name, cell, dom) in enumerate(headline_rows(r, served)):
            table.add_row(label if i == 0 else "", figure, name, cell, "DOMINATED" if dom else "no")
    return table


#: Baselines of the remaining-tokens C-index (``remaining_work.baselines``).
RW_BASELINES = ("position_median", "mrl", "nat_trie", "age")


def c_index_diff(result: dict[str, Any], name: str) -> tuple[float, float] | None:
    """``(C_ours − C_name, standard error)`` of one set's result: a single split's eval gives its
    delete-one-session jackknife figure (``c_index_diff_se``); a CV result (or the messy seeds)
    pools its parts, weighted by held-out calls as the table's means are, the parts' errors
    added as independent (disjoint held-out sessions): ``se = √(Σ wᵢ² seᵢ²) / Σ wᵢ``."""
    if "folds" in result:       # CV folds ({..., "result": eval}) or the messy seeds' results
        parts = [f.get("result", f) for f in result["folds"]]
        parts = [(c_index_diff(r, name), float(r.get("calls") or (r.get("mean") or {}).get("calls") or 1.0))
                 for r in parts]
        parts = [(p, w) for p, w in parts if p is not None]
        if not parts:
            return None
        total = sum(w for _, w in parts)
        return (sum(w * d for (d, _), w in parts) / total,
                float(np.sqrt(sum((w * se) ** 2 for (_, se), w in parts))) / total)
    b = ((result.get("remaining_work") or {}).get("baselines") or {}).get(name) or {}
    if b.get("c_index_diff_se") is None:
        return None
    return float(b["c_index_diff"]), float(b["c_index_diff_se"])


def c_index_table(results: dict[str, dict[str, Any]], title: str) -> Table:
    """Per set: ours and every baseline's remaining-tokens C-index, then ours − the best baseline
    ± its standard error and whether that difference is beyond noise (|diff| > 2 se)."""
    table = Table(title=title)
    for col in ("set", "ours", *RW_BASELINES, "best baseline", "ours − best ± se", "beyond noise?"):
        table.add_column(col, justify="left" if col in ("set", "best baseline", "beyond noise?") else "right")
    for label, r in results.items():
        rw = (r.get("mean", r).get("remaining_work") or {})
        base = rw.get("baselines") or {}
        cs = {n: (base.get(n) or {}).get("c_index") for n in RW_BASELINES}
        known = {n: c for n, c in cs.items() if c is not None}
        if rw.get("c_index") is None or not known:
            continue
        best = max(known, key=known.get)
        jk = c_index_diff(r, best)
        verdict = "n/a"
        if jk is not None:
            d, se = jk
            verdict = ("no (within 2 se)" if abs(d) <= 2 * se else
                       "yes: ours ahead" if d > 0 else "yes: baseline ahead")
        table.add_row(label, f"{rw['c_index']:.3f}", *(f"{c:.3f}" if c is not None else "n/a" for c in cs.values()),
                      best, f"{jk[0]:+.3f} ± {jk[1]:.3f}" if jk else "n/a", verdict)
    return table


def score(logs: list[Path], work: Path, cv: int | None, group: tuple[str, str] | None = None,
          order: str = "hash") -> dict[str, Any] | Exception:
    """The eval (CV with ``cv``, grouped by ``group`` = (field, pattern) when given) result, or
    the exception that stopped the fit or eval (the bench goes on with the other sets and
    reports it)."""
    try:
        if cv:
            field, pattern = group or (None, None)
            return cross_validate(logs, cv, seed=0, progress=False, group_by=field, group_pattern=pattern)
        return split_fit_eval(logs, work, order)
    except Exception as exc:  # noqa: BLE001 - reported per set, never hidden
        return exc


def over_seeds(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several seeds' results as one CV-shaped result (mean ± std over seeds), for the table.

    A CV result per seed contributes its fold-weighted mean."""
    flat = [{**r["mean"], "calls": r["calls"], "workflows": r["workflows"]} if "folds" in r else r
            for r in results]
    summary = aggregate(flat)
    return {"folds": results, "summary": summary,
            "mean": nest({k: s["weighted_mean"] for k, s in summary.items()})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="agentless,whowhen,swe_agent,mini_swe,messy",
                    help="comma-separated: " + ", ".join([*REAL_SETS, "messy", *GENERATED]))
    ap.add_argument("--cv", type=int, default=None, metavar="K", help="K-fold CV by workflow instead of one 70/30 split")
    ap.add_argument("--messy-seeds", default="0,1,2", help="seeds of the messy workload")
    ap.add_argument("--messy-workflows", type=int, default=200, help="workflows per messy seed")
    ap.add_argument("--data", type=Path, default=None, help="folder with the real sets (default: ../shared/datasets, else datasets/real)")
    ap.add_argument("--time", action="store_true", help="also score every set on a time-ordered 70/30 split")
    ap.add_argument("--no-task-groups", action="store_true", help="CV folds by workflow even where a set repeats tasks")
    ap.add_argument("--json", action="store_true", help="one JSON object: command, sources, times, every result")
    args = ap.parse_args()
    names = [s.strip() for s in args.sets.split(",") if s.strip()]
    unknown = [n for n in names if n not in REAL_SETS and n != "messy" and n not in GENERATED]
    if unknown:
        ap.error(f"unknown set(s) {', '.join(unknown)}: choose from {', '.join([*REAL_SETS, 'messy', *GENERATED])}")
    command = "python " + " ".join(shlex.quote(a) for a in [str(Path(sys.argv[0])), *sys.argv[1:]])
    err = Console(stderr=True)
    out: dict[str, Any] = {"command": command, "mode": f"{args.cv}-fold CV by workflow" if args.cv
                           else "70/30 split by workflow (seed 0)", "sets": {}}
    if args.cv and not args.no_task_groups and set(names) & set(TASK_GROUPS):
        out["mode"] += "; folds grouped by task on " + ", ".join(n for n in names if n in TASK_GROUPS)
    protocols = [("main", args.cv, "hash")] + ([("time", None, "time")] if args.time else [])
    if args.time:
        out["time_mode"] = "70/30 split by start time (each type's first 70 % of workflows train)"
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        work = Path(tmp)
        for name in names:
            for proto, cv, order in protocols:
                t0 = time.perf_counter()
                base = work / proto
                group = None if args.no_task_groups or not cv else TASK_GROUPS.get(name)
                if name == "messy":
                    seeds = [int(s) for s in args.messy_seeds.split(",")]
                    per_seed = []
                    for seed in seeds:
                        with err.status(f"messy seed {seed} ({proto})"):
                            path = work / f"messy{seed}" / "messy.jsonl"
                            if not path.exists():
                                write_jsonl(generate("messy", args.messy_workflows, seed=seed), path)
                            per_seed.append(score([path], base / f"messy{seed}", cv, order=order))
                    failed = [r for r in per_seed if isinstance(r, Exception)]
                    result = failed[0] if failed else over_seeds(per_seed)
                    source = f"profiler generate --messy --workflows {args.messy_workflows} --seed {{{args.messy_seeds}}}"
                    label = f"messy ×{len(seeds)} seeds"
                elif name in GENERATED:
                    path = work / name / f"{name}.jsonl"
                    with err.status(f"{name} ({proto})"):
                        if not path.exists():
                            write_jsonl(generate(name, GENERATED[name], seed=0), path)
                        result = score([path], base / name, cv, order=order)
                        if not isinstance(result, Exception) and "structure" in load_spec(name):
                            held_out = path if cv else base / name / "split" / "test"
                            result["bayes"] = bayes_top1(name, held_out)
                    source = f"profiler generate --workload {name} --workflows {GENERATED[name]} --seed 0"
                    label = name
                else:
                    path = real_source(name, args.data)
                    with err.status(f"{name} ({proto}): {path}"):
                        result = score([path], base / name, cv, group, order)
                    source, label = str(path), name
                elapsed = time.perf_counter() - t0
                entry: dict[str, Any] = {"source": source, "seconds": round(elapsed, 1)}
                if group:
                    entry["cv_group_by"] = {"field": group[0], "pattern": group[1]}
                if isinstance(result, Exception):  # the fit or eval itself crashed: report, go on
                    entry["error"] = f"{type(result).__name__}: {result}"
                else:
                    entry.update(result=result, table=baseline_rows(result),
                                 c_index_vs={n: c_index_diff(result, n) for n in RW_BASELINES},
                                 keep_alive_vs={n: keep_alive_vs(result, n, served=keep_alive_served(result))
                                                for n in KA_BASELINES},
                                 keep_alive_vs_fitted={n: keep_alive_vs(result, n, served=False)
                                                       for n in KA_BASELINES},
                                 headline=[dict(zip(("figure", "baseline", "ours_minus_baseline", "dominated"), row))
                                           for row in headline_rows(result, served=proto == "time")])
                if proto == "main":
                    out["sets"][label] = entry
                else:
                    out["sets"].setdefault(label, {})["time_split"] = entry
                err.print(f"{label} ({proto}): {elapsed:.1f} s"
                          + (f" — FAILED: {entry['error']}" if "error" in entry else ""))
    if args.json:
        print_json(out)
        return
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(f"[bold]{command}[/]", highlight=False)
    console.print(f"mode: {out['mode']}")
    for label, s in out["sets"].items():
        if "error" in s:
            console.print(f"  {label}: {s['source']} — [red]fit/eval failed[/]: {s['error']}", highlight=False)
            continue
        r = s["result"]
        size = (f"{r['calls']:,} held-out calls, {r['workflows']:,} workflows" if "calls" in r
                else f"{r['mean'].get('calls', 0):,.0f} held-out calls per seed on average")
        console.print(f"  {label}: {s['source']} ({size}; {s['seconds']} s)", highlight=False)
        if "bayes" in r:
            b, na = r["bayes"], (r.get("mean", r).get("next_agent") or {})
            console.print(f"    next-agent top-1 Bayes bound: {b['bayes_top1_expected']:.3f} expected, "
                          f"{b['bayes_top1_heldout']:.3f} on these held-out calls"
                          + (" (all workflows)" if "folds" in r else "")
                          + f"; ours {na.get('top1_accuracy', float('nan')):.3f}", highlight=False)
    spread = "; mean ± std over folds" if args.cv else ""
    spread += "; messy: mean ± std over seeds" if "messy" in names else ""
    console.print(baseline_table({label: s["result"] for label, s in out["sets"].items() if "result" in s},
                                 title=f"ours vs baselines on held-out workflows ({out['mode']}{spread})"))
    console.print(c_index_table({label: s["result"] for label, s in out["sets"].items() if "result" in s},
                                title=f"remaining-tokens C-index, ours vs the best baseline ({out['mode']})"))
    main_results = {label: s["result"] for label, s in out["sets"].items() if "result" in s}
    console.print(keep_alive_table(main_results, f"keep-alive TTL (fitted: profiler eval), ours vs every baseline "
                                                 f"({out['mode']})", served=False))
    console.print(keep_alive_table({k: r for k, r in main_results.items() if keep_alive_served(r)},
                                   f"keep-alive TTL served (online: the serving Predictor, what the headline "
                                   f"scores), ours vs every baseline ({out['mode']})", served=True))
    console.print(headline_table({label: s["result"] for label, s in out["sets"].items() if "result" in s},
                                 f"every headline figure, ours − every baseline ± jackknife se ({out['mode']})",
                                 served=False))
    if args.time:
        timed = {label: s["time_split"] for label, s in out["sets"].items() if "time_split" in s}
        for label, s in timed.items():
            if "error" in s:
                console.print(f"  {label} (time split): [red]fit/eval failed[/]: {s['error']}", highlight=False)
        console.print(baseline_table({label: s["result"] for label, s in timed.items() if "result" in s},
                                     title=f"ours vs baselines, {out['time_mode']}"
                                           + ("; messy: mean ± std over seeds" if "messy" in names else "")))
        console.print(c_index_table({label: s["result"] for label, s in timed.items() if "result" in s},
                                    title=f"remaining-tokens C-index, ours vs the best baseline, {out['time_mode']}"))
        console.print(online_band_table(timed))
        console.print(keep_alive_table({label: s["result"] for label, s in timed.items() if "result" in s},
                                       f"keep-alive TTL served (online), ours vs every baseline, {out['time_mode']}",
                                       served=True))
        console.print(headline_table({label: s["result"] for label, s in timed.items() if "result" in s},
                                     f"every headline figure as served, ours − every baseline ± jackknife se, "
                                     f"{out['time_mode']}", served=True))
        console.print(remaining_online_table(timed))


if __name__ == "__main__":
    main()
