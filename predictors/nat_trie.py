"""NVIDIA NeMo Agent Toolkit's **prediction trie**: the one implementation of the NAT baseline.

What a team running NAT (on Dynamo) deploys today, rebuilt from these sources (read for this
module; no code copied):

* NAT ``src/nat/profiler/prediction_trie/trie_builder.py`` and ``metrics_accumulator.py``
  (NVIDIA/NeMo-Agent-Toolkit, commit 325afac): the trie is built from profiled traces. Per trace,
  the LLM calls are taken in order of their end; each has a *path* (its parent function's name,
  its function's name), a *call index* (1-based count of LLM calls of that function in the
  trace), the *remaining calls* of the trace after it, the *inter-arrival time* (ms from its end
  to the next LLM start) and its output tokens. Every node on the path (and the root) keeps, per
  call index and over all indices, the sample count, mean, p50, p90 and p95 of each (linear
  interpolation between order statistics).
* NAT ``src/nat/llm/dynamo_llm.py`` (``_create_dynamic_prediction_hook``): at request time the
  lookup takes the deepest trie node on the current function path and the call index counted so
  far, and sends ``total_requests = remaining_calls.mean``, ``osl`` from ``output_tokens.p90``
  and ``iat`` from ``interarrival_ms.mean``; ``nvext.cache_control.ttl`` is computed client-side
  as remaining calls × inter-arrival (NAT pull request #1648). NAT pull request #1634 adds a 1–5
  ``latency_sensitivity`` per call, scored from the call's structural role in the trace
  (critical-path share, fan-out, first/last position, parallel siblings).

Here the path is (workflow type, agent): the workflow is NAT's parent function, the agent its
function. Assumptions where the sources did not settle a detail: the four sensitivity signals are
weighted equally, each min–max normalised within its trace, and mapped to 1–5
(``1 + round(4 × score)``); the node's sensitivity is the rounded mean over its samples; calls
that end at the same moment keep their call order (``call_index`` where the record has one).

Users: the simulator's ``nat-hints`` policy (:mod:`simulator.baselines.nat_hints`) and the
held-out evaluation (``baselines.nat_trie`` in ``profiler eval``: output length, remaining calls,
remaining tokens, keep-alive TTL), which reads the ``nat_trie`` profile section
(:func:`build_nat_trie_section`, one trie node per workflow type, fit on the training calls).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import duckdb
import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator


STATS = ("mean", "p50", "p90", "p95")


@dataclass
class Metrics:
    """NAT's ``PredictionMetrics``: sample count, mean and percentiles of one quantity."""

    sample_count: int = 0
    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p95: float = 0.0

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Metrics":
        if not len(samples):
            return cls()
        x = np.asarray(samples, dtype=float)
        p50, p90, p95 = np.percentile(x, [50, 90, 95])   # linear interpolation, as NAT's
        return cls(len(x), float(x.mean()), float(p50), float(p90), float(p95))


@dataclass
class CallPrediction:
    """NAT's ``LLMCallPrediction``: what the trie predicts for an LLM call at a position."""

    remaining_calls: Metrics
    interarrival_ms: Metrics
    output_tokens: Metrics
    latency_sensitivity: int | None = None


@dataclass
class TrieNode:
    name: str
    children: dict[str, "TrieNode"] = field(default_factory=dict)
    by_call_index: dict[int, CallPrediction] = field(default_factory=dict)
    any_index: CallPrediction | None = None


def _sensitivities(recs: list[dict]) -> list[int]:
    """1–5 latency sensitivity of each call of one trace (in the order given; see the module
    docstring): critical-path share, fan-out, first/last position and (inverted) parallelism,
    each min–max normalised over the trace, averaged with equal weights."""
    n = len(recs)
    if n == 1:
        return [5]
    t0 = np.array([float(r["t_arrival"]) for r in recs])
    t1 = np.maximum(np.array([float(r["t_finish"]) for r in recs]), t0)
    span = max(float(t1.max() - t0.min()), 1e-9)
    critical = (t1 - t0) / span
    # fan-out: calls that depend on this one (its descendants by parent ids; without ids a
    # trace is a chain and every later call depends on it)
    rid = [str(r.get("request_id")) for r in recs]
    kids: dict[str, list[int]] = defaultdict(list)
    has_parents = any(r.get("parent_request_ids") for r in recs)
    for j, r in enumerate(recs):
        for p in r.get("parent_request_ids") or []:
            kids[str(p)].append(j)
    fanout = np.zeros(n)
    for i in range(n):
        if has_parents:
            seen, stack = set(), list(kids.get(rid[i], []))
            while stack:
                j = stack.pop()
                if j not in seen:
                    seen.add(j)
                    stack += kids.get(rid[j], [])
            fanout[i] = len(seen)
        else:
            fanout[i] = float(np.sum(t0 >= t1[i]))
    position = np.zeros(n)
    position[[0, n - 1]] = 1.0
    overlap = np.array([np.sum((t0 < t1[i]) & (t1 > t0[i])) - 1 for i in range(n)], dtype=float)
    parallel = -overlap

    def norm(v: np.ndarray) -> np.ndarray:
        lo, hi = float(v.min()), float(v.max())
        return (v - lo) / (hi - lo) if hi > lo else np.zeros_like(v)

    score = (norm(critical) + norm(fanout) + norm(position) + norm(parallel)) / 4.0
    return [int(1 + round(4 * s)) for s in score]


class PredictionTrie(BaseEstimator):
    """NAT's prediction trie over (workflow type, agent), fit on flat log records.

    ``fit(records)`` → self; ``find(workflow_type, agent, call_index)`` → the prediction NAT's
    lookup returns (deepest node on the path; its call index, else its any-index prediction,
    else the parent's), or None on an empty trie."""

    def fit(self, records: Iterable[dict] | pd.DataFrame, sensitivity: bool = True) -> "PredictionTrie":
        """Build the trie from flat call records (dicts or a DataFrame with ``workflow_type_id,
        workflow_id, agent_id, t_arrival, t_finish, output_tokens`` and optionally
        ``call_index, request_id, parent_request_ids``). ``sensitivity=False`` skips NAT's
        latency sensitivity (a per-trace pass the held-out evaluation does not read).

        Vectorised (pandas): per trace the calls in order of their end, each call's remaining
        calls, its agent's call index, the inter-arrival to the first start after its end
        (``merge_asof``), then every node × call index aggregated in one ``groupby``."""
        df = records if isinstance(records, pd.DataFrame) else pd.DataFrame(list(records))
        self.root_ = TrieNode("root")
        self.n_traces_ = 0
        if df.empty:
            return self
        # strings become integer codes once: every sort and group below runs on integers
        wf, _ = pd.factorize(df["workflow_id"].astype(str))
        wt, wt_names = pd.factorize((df["workflow_type_id"] if "workflow_type_id" in df
                                     else pd.Series("", index=df.index)).fillna("").astype(str))
        agent, agent_names = pd.factorize(df["agent_id"].astype(str))
        t0, t1 = df["t_arrival"].to_numpy(dtype=float), df["t_finish"].to_numpy(dtype=float)
        ci = df["call_index"].fillna(0).to_numpy(dtype=np.int64) if "call_index" in df else np.zeros(len(df), np.int64)
        rid = (pd.factorize(df["request_id"].astype(str), sort=True)[0] if "request_id" in df and "call_index" not in df
               else np.zeros(len(df), np.int64))
        order = np.lexsort((rid, ci, t1, wf))          # per trace, the calls in order of their end
        wf, wt, agent, t0, t1 = wf[order], wt[order], agent[order], t0[order], t1[order]
        calls = pd.DataFrame({"wf": wf, "agent": agent})
        by_wf = calls.groupby("wf", sort=False)
        remaining = (by_wf["wf"].transform("size").to_numpy() - by_wf.cumcount().to_numpy() - 1).astype(float)
        index = calls.groupby(["wf", "agent"], sort=False).cumcount().to_numpy() + 1
        ends = pd.DataFrame({"wf": wf, "t1": t1, "row": np.arange(len(wf))}).sort_values("t1", kind="stable")
        starts = pd.DataFrame({"wf": wf, "t0": t0}).sort_values("t0", kind="stable")
        nxt = pd.merge_asof(ends, starts, left_on="t1", right_on="t0", by="wf", direction="forward",
                            allow_exact_matches=False).sort_values("row")
        sens = np.full(len(wf), np.nan)
        if sensitivity:
            rids = df["request_id"].astype(str).to_numpy()[order] if "request_id" in df else np.full(len(wf), "")
            parents = (df["parent_request_ids"].to_numpy()[order] if "parent_request_ids" in df
                       else np.full(len(wf), None))
            for rows in by_wf.indices.values():
                recs = [{"t_arrival": a, "t_finish": b, "request_id": r,
                         "parent_request_ids": list(p) if isinstance(p, (list, tuple, np.ndarray)) and len(p) else None}
                        for a, b, r, p in zip(t0[rows], t1[rows], rids[rows], parents[rows])]
                sens[rows] = _sensitivities(recs)
        values = {"remaining_calls": remaining, "interarrival_ms": (nxt["t0"] - nxt["t1"]).to_numpy() * 1000.0,
                  "output_tokens": df["output_tokens"].to_numpy(dtype=float)[order], "latency_sensitivity": sens}
        # every call counts at 6 places: root, (type,), (type, agent) nodes × its call index and
        # index 0 (any); one integer key per (depth, type, agent, index) so one groupby does all
        n_idx, n_agent = int(index.max()) + 1, len(agent_names) + 1
        node = np.concatenate([np.zeros(len(wf), np.int64), wt.astype(np.int64) + 1,
                               (wt.astype(np.int64) + 1) * n_agent + agent + 1])
        node_depth = np.repeat([0, 1, 2], len(wf))
        key = np.concatenate([(node * 3 + node_depth) * n_idx + np.tile(index, 3),
                              (node * 3 + node_depth) * n_idx])
        long = pd.DataFrame({"key": key, **{q: np.tile(v, 6) for q, v in values.items()}})
        qcols = ["remaining_calls", "interarrival_ms", "output_tokens"]
        grouped = long.groupby("key", sort=True)
        counts = grouped[[*qcols, "latency_sensitivity"]].count()
        means = grouped[[*qcols, "latency_sensitivity"]].mean()
        quants = {p: grouped[qcols].quantile(p) for p in (0.5, 0.9, 0.95)}     # linear, as NAT's
        for k in counts.index:
            rest, idx = divmod(int(k), n_idx)
            code, depth = divmod(rest, 3)
            type_code, agent_code = divmod(code, n_agent) if depth == 2 else (code, 0)
            path = ((), (wt_names[type_code - 1],), (wt_names[type_code - 1], agent_names[agent_code - 1]))[depth]
            node_ = self.root_
            for name in path:
                node_ = node_.children.setdefault(str(name), TrieNode(str(name)))

            def metrics(q: str) -> Metrics:
                n = int(counts.at[k, q])
                if not n:
                    return Metrics()
                return Metrics(n, float(means.at[k, q]), *(float(quants[p].at[k, q]) for p in (0.5, 0.9, 0.95)))

            n_sens = int(counts.at[k, "latency_sensitivity"])
            pred = CallPrediction(metrics("remaining_calls"), metrics("interarrival_ms"), metrics("output_tokens"),
                                  int(round(float(means.at[k, "latency_sensitivity"]))) if n_sens else None)
            if idx == 0:
                node_.any_index = pred
            else:
                node_.by_call_index[idx] = pred
        self.n_traces_ = int(by_wf.ngroups)
        return self

    def find(self, workflow_type: str, agent: str, call_index: int) -> CallPrediction | None:
        nodes = [self.root_]
        for name in (workflow_type, agent):
            nxt = nodes[-1].children.get(name)
            if nxt is None:
                break
            nodes.append(nxt)
        for node in reversed(nodes):
            pred = node.by_call_index.get(call_index) or node.any_index
            if pred is not None:
                return pred
        return None


# ------------------------------------------------------------------ profile section (JSON)
def _metrics_list(m: Metrics) -> list[float]:
    return [m.sample_count, m.mean, m.p50, m.p90, m.p95]


def _metrics_of(v: Sequence[float]) -> Metrics:
    return Metrics(int(v[0]), float(v[1]), float(v[2]), float(v[3]), float(v[4]))


def _pred_dict(p: CallPrediction) -> dict[str, Any]:
    return {"remaining_calls": _metrics_list(p.remaining_calls), "interarrival_ms": _metrics_list(p.interarrival_ms),
            "output_tokens": _metrics_list(p.output_tokens), "latency_sensitivity": p.latency_sensitivity}


def _pred_of(d: dict[str, Any]) -> CallPrediction:
    return CallPrediction(_metrics_of(d["remaining_calls"]), _metrics_of(d["interarrival_ms"]),
                          _metrics_of(d["output_tokens"]), d.get("latency_sensitivity"))


def _node_dict(node: TrieNode) -> dict[str, Any]:
    return {"any": _pred_dict(node.any_index) if node.any_index else None,
            "by_call_index": {str(i): _pred_dict(p) for i, p in sorted(node.by_call_index.items())},
            "children": {name: _node_dict(c) for name, c in sorted(node.children.items())}}


def _node_of(name: str, d: dict[str, Any]) -> TrieNode:
    return TrieNode(name, {n: _node_of(n, c) for n, c in d.get("children", {}).items()},
                    {int(i): _pred_of(p) for i, p in d.get("by_call_index", {}).items()},
                    _pred_of(d["any"]) if d.get("any") else None)


def trie_to_section(trie: PredictionTrie) -> dict[str, Any]:
    """``{workflow type: node}`` (the JSON form of each type's subtree; the root's all-type
    prediction is not kept: a profile section is keyed by workflow type)."""
    return {wt: _node_dict(node) for wt, node in sorted(trie.root_.children.items())}


def trie_from_section(section: dict[str, Any]) -> PredictionTrie:
    """The trie a ``nat_trie`` section holds (a type missing from it finds nothing)."""
    trie = PredictionTrie()
    trie.root_ = TrieNode("root", {wt: _node_of(wt, d) for wt, d in section.items()})
    trie.n_traces_ = None
    return trie


#: Workflows per type the profile's trie is fit on at most (a seeded sample, like the synthesized
#: automata's ``synth_max_workflows``): far more traces than a NAT user profiles, percentiles per
#: node and call index settled, and the fit bounded (≈ 1 s at 1M calls).
MAX_WORKFLOWS = 5_000

#: The calls the trie is fit on: every ok call of at most ``max_workflows`` workflows per type.
_TRIE_SQL = """
    WITH picked AS (
      SELECT workflow_type_id, workflow_id FROM (
        SELECT workflow_type_id, workflow_id,
          row_number() OVER (PARTITION BY workflow_type_id ORDER BY md5(workflow_id || $salt), workflow_id) AS r
        FROM (SELECT DISTINCT workflow_type_id, workflow_id FROM calls WHERE status = 'ok'))
      WHERE r <= $max_workflows)
    SELECT workflow_type_id, workflow_id, agent_id, request_id, call_index, t_arrival, t_finish, output_tokens
    FROM calls SEMI JOIN picked USING (workflow_type_id, workflow_id) WHERE status = 'ok'
    ORDER BY workflow_type_id, workflow_id, call_index"""


def build_nat_trie_section(con: duckdb.DuckDBPyConnection, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``profile.json["nat_trie"]``: the prediction trie fit on the store's ok calls (a
    ``fitting.profile_fit.SECTION_BUILDERS`` entry; ``options["seed"]`` seeds the sample of at most
    :data:`MAX_WORKFLOWS` workflows per type)."""
    seed = int((options or {}).get("seed") or 0)
    frame = con.execute(_TRIE_SQL, {"salt": f"#{seed}", "max_workflows": MAX_WORKFLOWS}).df()
    if frame.empty:
        return {}
    return trie_to_section(PredictionTrie().fit(frame, sensitivity=False))


def agent_call_index(workflow_type: Sequence[str], workflow: Sequence[str], agent: Sequence[str]) -> np.ndarray:
    """NAT's call index of each call of a call-ordered table: the 1-based count of the calls of
    its agent in its workflow so far (this one included)."""
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    out = np.empty(len(agent), dtype=int)
    for k, key in enumerate(zip(workflow_type, workflow, agent)):
        counts[key] += 1
        out[k] = counts[key]
    return out


def lookup_frame(trie: PredictionTrie, workflow_type: Sequence[str], agent: Sequence[str],
                 index: Sequence[int]) -> dict[str, np.ndarray]:
    """What NAT serves for each call, given its type, agent and NAT call index (1-based, see
    :func:`agent_call_index`; NaN where the trie finds nothing):
    ``remaining_calls`` (the mean: ``total_requests``), ``osl_p90`` (``osl``), ``output_p50``,
    ``output_p95``, ``iat_s`` (the mean inter-arrival) and ``ttl_s`` = remaining calls × iat (the
    ``cache_control`` TTL)."""
    cols = ("remaining_calls", "osl_p90", "output_p50", "output_p95", "iat_s")
    out = {c: np.full(len(agent), np.nan) for c in cols}
    memo: dict[tuple[str, str, int], CallPrediction | None] = {}
    for k, (wt, a, i) in enumerate(zip(workflow_type, agent, index)):
        key = (str(wt), str(a), int(i))
        if key not in memo:
            memo[key] = trie.find(*key)
        p = memo[key]
        if p is None:
            continue
        out["remaining_calls"][k] = p.remaining_calls.mean
        out["osl_p90"][k] = p.output_tokens.p90
        out["output_p50"][k] = p.output_tokens.p50
        out["output_p95"][k] = p.output_tokens.p95
        out["iat_s"][k] = p.interarrival_ms.mean / 1000.0 if p.interarrival_ms.sample_count else np.nan
    out["ttl_s"] = out["remaining_calls"] * out["iat_s"]
    return out


__all__ = ["Metrics", "CallPrediction", "TrieNode", "PredictionTrie", "trie_to_section", "trie_from_section",
           "build_nat_trie_section", "agent_call_index", "lookup_frame"]
