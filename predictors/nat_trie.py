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

from profiler.frames import query_frame

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


class PredictionTrie:
    """NAT's prediction trie over (workflow type, agent), fit on flat log records.

    ``fit(records)`` → self; ``find(workflow_type, agent, call_index)`` → the prediction NAT's
    lookup returns (deepest node on the path; its call index, else its any-index prediction,
    else the parent's), or None on an empty trie."""

    def fit(self, records: Iterable[dict]) -> "PredictionTrie":
        by_wf: dict[str, list[dict]] = defaultdict(list)
        for r in records:
            by_wf[str(r["workflow_id"])].append(r)
        # node path -> call index (0 = any) -> quantity -> samples
        acc: dict[tuple, dict[int, dict[str, list[float]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(list)))
        for recs in by_wf.values():
            recs = sorted(recs, key=lambda r: (float(r["t_finish"]), int(r.get("call_index") or 0),
                                               str(r.get("request_id"))))
            starts = np.sort([float(r["t_arrival"]) for r in recs])
            sens = _sensitivities(recs)
            counts: dict[str, int] = defaultdict(int)
            for i, r in enumerate(recs):
                wtype, agent = str(r.get("workflow_type_id", "")), str(r["agent_id"])
                counts[agent] += 1
                end = float(r["t_finish"])
                k = int(np.searchsorted(starts, end, side="right"))
                sample = {"remaining_calls": float(len(recs) - i - 1),
                          "output_tokens": float(r["output_tokens"]),
                          "latency_sensitivity": float(sens[i])}
                if k < len(starts):
                    sample["interarrival_ms"] = (starts[k] - end) * 1000.0
                for key in ((), (wtype,), (wtype, agent)):
                    for idx in (counts[agent], 0):
                        for q, v in sample.items():
                            acc[key][idx][q].append(v)
        self.root_ = TrieNode("root")
        for key, per_idx in acc.items():
            node = self.root_
            for name in key:
                node = node.children.setdefault(name, TrieNode(name))
            for idx, qs in per_idx.items():
                sens = qs["latency_sensitivity"]
                pred = CallPrediction(Metrics.of(qs["remaining_calls"]),
                                      Metrics.of(qs.get("interarrival_ms", [])),
                                      Metrics.of(qs["output_tokens"]),
                                      int(round(float(np.mean(sens)))) if sens else None)
                if idx == 0:
                    node.any_index = pred
                else:
                    node.by_call_index[idx] = pred
        self.n_traces_ = len(by_wf)
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


#: The calls the trie is fit on (every ok call with the fields NAT's profiler records).
_TRIE_SQL = ("SELECT workflow_type_id, workflow_id, agent_id, request_id, call_index, t_arrival, t_finish, "
             "output_tokens, parent_request_ids FROM calls WHERE status = 'ok' "
             "ORDER BY workflow_type_id, workflow_id, call_index")


def build_nat_trie_section(con: duckdb.DuckDBPyConnection, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``profile.json["nat_trie"]``: the prediction trie fit on every ok call of the store (a
    ``profiler.fitting.SECTION_BUILDERS`` entry; ``options`` unused)."""
    frame = query_frame(con, _TRIE_SQL)
    if frame.empty:
        return {}
    frame["parent_request_ids"] = [list(p) if isinstance(p, (list, tuple, np.ndarray)) and len(p) else None
                                   for p in frame["parent_request_ids"]]
    return trie_to_section(PredictionTrie().fit(frame.to_dict("records")))


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
