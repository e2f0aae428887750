"""The replayable workload: workflows of dependent LLM calls and the prefix structure of prompts.

A :class:`Workload` is built from flat log records (``log-format.md`` §1) by
:func:`workload_from_records`. Each call keeps only what the replay needs:

* **dependencies** — the calls that must finish before it is issued (``parent_request_ids``, or
  the previous call of the workflow when absent) and the *gap* after the last of them (the tool or
  think time: recorded arrival minus the parents' recorded finish). Calls that share parents are a
  fan-out and are issued together. A workflow's first calls are issued at the workflow's arrival.
* **prompt prefix structure** — what a radix cache could hold of its prompt. A prompt is a path
  of *segments* from the root, and the KV of a segment is reusable only when every segment before
  it is reusable too (prefix property)::

      [system prompt of the agent] → [task of the workflow, for that agent] → … → own tokens

  1. *conversation lineage*: when the prompt of a call is at least the prompt plus output of the
     previous call of the same agent in the workflow (a growing conversation, as in SWE-agent),
     its path is that call's path plus that call's own segment (``input + output`` tokens);
  2. otherwise the path is ``[system(agent), task(workflow, agent)]`` followed by a segment for the
     *parent context* shared by calls of the same agent with the same parents and prompt length
     (the identical prompts of a fan-out);
  3. the call's own segment holds the rest of its prompt and its output.

  ``system_tokens`` per agent and the task length come from the workload spec for generated
  workloads; for plain logs the system prompt is unknown (0 unless given) and the task segment
  is the shortest root prompt of the workflow, used only by the agents that start workflows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Sequence

import numpy as np


@dataclass
class Call:
    """One LLM call of the replay (indices are positions in :attr:`Workload.calls`)."""

    idx: int
    wf: int
    request_id: str
    agent: str
    input_tokens: int
    output_tokens: int
    parents: tuple[int, ...]
    gap_s: float
    tool: str | None
    #: Every tool run after this call (the gap before its children), in order.
    tools: tuple[str, ...] = ()
    #: Segments of the reusable prompt prefix, root first (see the module docstring).
    path: tuple[int, ...] = ()
    #: Segment holding this call's own prompt tokens and its output (its KV after it finished).
    own_seg: int = -1
    #: Prompt tokens that belong to ``own_seg`` (``input_tokens`` minus the path's length).
    own_prompt_tokens: int = 0
    children: list[int] = field(default_factory=list)
    #: The record's ``stage`` (the framework step the call ran in; None when not recorded):
    #: the replay sends it as ``app_metadata.stage``, as a client of the gateway would.
    stage: str | None = None


@dataclass
class Workflow:
    idx: int
    workflow_id: str
    workflow_type: str
    calls: list[int]
    roots: list[int]
    #: Offset of the first call from the workflow start, per root (recorded).
    root_offsets: list[float]
    arrival_s: float = 0.0


@dataclass
class Workload:
    """Calls, workflows and the segment table of a replay."""

    name: str
    calls: list[Call]
    workflows: list[Workflow]
    seg_tokens: list[int]
    #: Segment kind: 0 system prompt, 1 task, 2 parent context, 3 own (call) segment.
    seg_kind: list[int]
    #: Calls whose path contains the segment, in workflow order (Bélády's future accesses).
    seg_consumers: list[list[int]]
    #: The segment before it on every path (-1 at the root): the radix tree's parent edge.
    seg_parent: list[int]
    #: Workflow (session) whose KV the segment is (-1 for system prompts shared by sessions).
    seg_wf: list[int]
    #: Segments known before any call uses them, by key: ``("sys", workflow_type, agent)`` (an
    #: agent's system prompt) and ``("task", workflow, agent)`` (the workflow's task for it).
    seg_index: dict = field(default_factory=dict)
    #: Built with conversation lineage (a call's prompt extends its agent's previous call), for
    #: at least one workflow type (a mix may use it for its logged applications only)?
    lineage: bool = False

    @property
    def n_calls(self) -> int:
        return len(self.calls)

    def summary(self) -> dict:
        inp = np.array([c.input_tokens for c in self.calls])
        out = np.array([c.output_tokens for c in self.calls])
        reusable = sum(self.path_tokens(c) for c in self.calls)
        return {
            "workflows": len(self.workflows), "calls": len(self.calls),
            "mean_input_tokens": float(inp.mean()) if len(inp) else 0.0,
            "mean_output_tokens": float(out.mean()) if len(out) else 0.0,
            "reusable_prompt_share": float(reusable / max(inp.sum(), 1)),
        }

    def path_tokens(self, call: Call) -> int:
        return sum(self.seg_tokens[s] for s in call.path)


class _SegmentTable:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.kind: list[int] = []
        self.by_key: dict[tuple, int] = {}

    def get(self, key: tuple, tokens: int, kind: int) -> int:
        seg = self.by_key.get(key)
        if seg is None:
            seg = self.new(tokens, kind)
            self.by_key[key] = seg
        return seg

    def new(self, tokens: int, kind: int) -> int:
        self.tokens.append(int(tokens))
        self.kind.append(kind)
        return len(self.tokens) - 1


def _tool_names(rec: dict) -> tuple[str, ...]:
    names = [t.get("name") for t in rec.get("tool_calls") or [] if isinstance(t, dict)]
    if not names:
        names = list(rec.get("tool_names") or [])
    return tuple(str(n) for n in names if n)


def workload_from_records(
    records: Iterable[dict],
    name: str = "workload",
    system_tokens: dict[str, int] | None = None,
    task_from_roots: bool = True,
    conversation_lineage: bool | Collection[str] = True,
) -> Workload:
    """Build a :class:`Workload` from flat records (see the module docstring for the rules).

    ``system_tokens`` maps an agent (or ``"<workflow_type>/<agent>"``) to the length of its
    system prompt shared across workflows; calls with ``status == "error"`` are replayed too
    (they cost the engine the same). ``conversation_lineage=False`` turns rule 1 off (for generated
    workloads, whose prompts are rebuilt from the parents each call); a collection of workflow
    types turns it on for those types only (a mix of logged and generated applications). Records must carry ``workflow_id``, ``agent_id``,
    ``t_arrival``, ``t_finish``, ``input_tokens`` and ``output_tokens``.
    """
    system_tokens = system_tokens or {}
    if isinstance(conversation_lineage, bool):
        def lineage_of(wtype: str) -> bool:
            return bool(conversation_lineage)
    else:
        lineage_types = frozenset(conversation_lineage)

        def lineage_of(wtype: str) -> bool:
            return wtype in lineage_types
    any_lineage = False
    by_wf: dict[str, list[dict]] = {}
    for i, rec in enumerate(records):
        for key in ("workflow_id", "agent_id", "t_arrival", "t_finish", "input_tokens", "output_tokens"):
            if rec.get(key) is None:
                raise ValueError(f"record {i + 1} ({rec.get('request_id', '?')}): missing field {key!r}")
        by_wf.setdefault(str(rec["workflow_id"]), []).append(rec)

    segs = _SegmentTable()
    calls: list[Call] = []
    workflows: list[Workflow] = []
    for wf_id in sorted(by_wf, key=lambda w: min(float(r["t_arrival"]) for r in by_wf[w])):
        recs = sorted(by_wf[wf_id], key=lambda r: (float(r["t_arrival"]), str(r.get("request_id"))))
        wf_idx = len(workflows)
        wtype = str(recs[0].get("workflow_type_id", ""))
        lineage = lineage_of(wtype)
        any_lineage = any_lineage or lineage
        base = len(calls)
        rid_to_idx = {str(r.get("request_id", f"{wf_id}#{k}")): base + k for k, r in enumerate(recs)}
        t0 = float(recs[0]["t_arrival"])

        def sys_len(agent: str) -> int:
            return int(system_tokens.get(f"{wtype}/{agent}", system_tokens.get(agent, 0)))

        root_inputs = [int(r["input_tokens"]) - sys_len(str(r["agent_id"]))
                       for r in recs if not r.get("parent_request_ids")][:1]
        task_len = max(min(root_inputs), 0) if (root_inputs and task_from_roots) else 0
        root_agents = {str(recs[0]["agent_id"])}
        wf = Workflow(wf_idx, wf_id, wtype, [], [], [])
        last_of_agent: dict[str, int] = {}
        for k, rec in enumerate(recs):
            idx = base + k
            agent = str(rec["agent_id"])
            t_arr = float(rec["t_arrival"])
            parent_ids = rec.get("parent_request_ids")
            if parent_ids:
                parents = tuple(sorted({rid_to_idx[p] for p in parent_ids if p in rid_to_idx}))
            elif k > 0:
                # "absent = the previous call of the workflow"; when that call was still running
                # at this arrival (overlap), the latest call that had finished is the parent.
                done = [j for j in range(k) if float(recs[j]["t_finish"]) <= t_arr + 1e-6]
                prev = k - 1 if (k - 1) in done else (max(done, key=lambda j: float(recs[j]["t_finish"])) if done else None)
                parents = (base + prev,) if prev is not None else ()
            else:
                parents = ()
            if parents:
                fin = max(float(recs[p - base]["t_finish"]) for p in parents)
                gap = max(t_arr - fin, 0.0)
            else:
                gap = 0.0
                wf.roots.append(idx)
                wf.root_offsets.append(t_arr - t0)
            inp, out = int(rec["input_tokens"]), int(rec["output_tokens"])
            tools = _tool_names(rec)
            call = Call(idx, wf_idx, str(rec.get("request_id", f"{wf_id}#{k}")), agent, inp, out,
                        parents, gap, tools[0] if tools else None, tools,
                        stage=(rec.get("stage") or None) if isinstance(rec.get("stage"), str) else None)
            # --- prompt prefix structure -------------------------------------------------------
            prev = last_of_agent.get(agent)
            pc = calls[prev] if prev is not None else None
            if lineage and pc is not None and inp >= pc.input_tokens + pc.output_tokens:
                call.path = pc.path + (pc.own_seg,)
                used = pc.input_tokens + pc.output_tokens
            else:
                path: list[int] = []
                used = 0
                s_len = min(sys_len(agent), inp)
                if s_len > 0:
                    path.append(segs.get(("sys", wtype, agent), s_len, 0))
                    used += s_len
                t_len = task_len if (agent in root_agents or sys_len(agent) > 0) else 0
                if t_len > 0 and used + t_len <= inp:
                    path.append(segs.get(("task", wf_idx, agent), t_len, 1))
                    used += t_len
                if parents and inp - used > 0:
                    path.append(segs.get(("ctx", wf_idx, agent, parents, inp), inp - used, 2))
                    used = inp
                call.path = tuple(path)
            call.own_prompt_tokens = inp - used
            call.own_seg = segs.new(call.own_prompt_tokens + out, 3)
            last_of_agent[agent] = idx
            calls.append(call)
            wf.calls.append(idx)
        for idx in wf.calls:
            for p in calls[idx].parents:
                calls[p].children.append(idx)
        workflows.append(wf)

    consumers: list[list[int]] = [[] for _ in segs.tokens]
    parent = [-1] * len(segs.tokens)
    owner = [-1] * len(segs.tokens)
    for c in calls:
        prev = -1
        for s in c.path:
            consumers[s].append(c.idx)
            parent[s] = prev
            if segs.kind[s] != 0:
                owner[s] = c.wf
            prev = s
        parent[c.own_seg] = prev
        owner[c.own_seg] = c.wf
    known = {k: v for k, v in segs.by_key.items() if k[0] in ("sys", "task")}
    return Workload(name, calls, workflows, segs.tokens, segs.kind, consumers, parent, owner,
                    seg_index=known, lineage=any_lineage)


def split_workflows(records: Sequence[dict], test_fraction: float = 0.3, seed: int = 0
                    ) -> tuple[list[dict], list[dict]]:
    """Split records by workflow (never a workflow across both sides): ``(train, test)``."""
    wf_ids = sorted({str(r["workflow_id"]) for r in records})
    rng = np.random.default_rng(seed)
    n_test = max(1, int(round(len(wf_ids) * test_fraction))) if len(wf_ids) > 1 else 0
    test_ids = set(rng.choice(wf_ids, size=n_test, replace=False).tolist()) if n_test else set()
    train = [r for r in records if str(r["workflow_id"]) not in test_ids]
    test = [r for r in records if str(r["workflow_id"]) in test_ids]
    return train, test


def renamed(record: dict, rename: Callable[[str], str]) -> dict:
    """A copy of ``record`` whose workflow id, request id and parent request ids went through
    ``rename`` (a copy of a session that must not share ids with the original)."""
    rec = dict(record)
    rec["workflow_id"] = rename(record["workflow_id"])
    rec["request_id"] = rename(record["request_id"])
    if record.get("parent_request_ids"):
        rec["parent_request_ids"] = [rename(p) for p in record["parent_request_ids"]]
    return rec


def replicate_records(records: Sequence[dict], n_workflows: int, seed: int = 0) -> list[dict]:
    """Records of ``n_workflows`` workflows drawn (with replacement when needed) from ``records``.

    Copies get new workflow and request ids (``…~k``) so each is its own session: a small test
    split replays as many concurrent sessions as the load needs.
    """
    by_wf: dict[str, list[dict]] = {}
    for r in records:
        by_wf.setdefault(str(r["workflow_id"]), []).append(r)
    ids = sorted(by_wf)
    if not ids:
        return []
    rng = np.random.default_rng([seed, 11])
    if n_workflows <= len(ids):
        picks = list(rng.choice(ids, size=n_workflows, replace=False))
    else:
        picks = ids + list(rng.choice(ids, size=n_workflows - len(ids), replace=True))
    out: list[dict] = []
    for k, wf_id in enumerate(picks):
        suffix = f"~{k}"
        out.extend(renamed(r, lambda x: f"{x}{suffix}") for r in by_wf[wf_id])
    return out
