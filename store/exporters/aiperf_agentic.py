"""Our flat records -> AIPerf's agentic trace ("Weka" format; SemiAnalysis cc-traces)
(``--format aiperf-agentic``).

One JSON object per workflow (AIPerf reads a folder of ``*.json``; ``--out x.jsonl`` writes one
object per line instead), with exactly the keys AIPerf's models allow (they forbid others)::

    {"id": workflow_id, "models": [...], "block_size": 64, "hash_id_scope": "global",
     "tool_tokens": 0, "system_tokens": 0, "requests": [item, ...]}
    request  {"t", "type": "n" | "s", "model", "in", "out", "hash_ids", "input_types", "output_types",
              "stop": "tool_use" | "end_turn" | "", "api_time", "think_time", "ttft" (type "s")}
    subagent {"t", "type": "subagent", "agent_id": "agent_001", "subagent_type": <our agent_id>,
              "duration_ms", "total_tokens", "tool_use_count", "status": "completed",
              "requests": [...], "models": [...], "tool_tokens": 0, "system_tokens": 0}

``t`` is seconds from the workflow's first arrival (nested requests too: the SemiAnalysis AgentX
convention), ``api_time`` the call's duration, ``think_time`` the gap from its latest parent's
finish, ``ttft`` first token − arrival. ``stop`` says what ended the call: ``end_turn`` when a
person took the next turn (``wait_after: "human"``) or it was the workflow's last call, else
``tool_use`` when tools ran after it; ``input_types`` is ``tool_result`` for a call a tool's
result started (AIPerf's machine-paced turn), else ``text``. ``hash_ids`` are the prompt's blocks
(:class:`store.exporters._graph.BlockIds`), one namespace per trace (``local``, the scope AIPerf
enforces).

**Agents and parents, as AIPerf replays them** (its Weka tutorial): top-level requests are one
conversation in order; adjacent sub-agent markers are one group of concurrent children, spawned
by the request before them and joined by the request after them (none after: not waited for).
So every call that runs alone is a top-level request, whatever its agent (AIPerf tells agents
apart at the top level by their ``hash_ids`` chains, which :class:`BlockIds` keeps per agent), and
a fan-out — two or more agents' call chains started by one call — is a group of sub-agents
(``subagent_type`` = the agent) that the next call joins. A workflow this cannot express (a join
that skips a stage, two fan-outs with no call between them) is left out with a one-line reason,
never written with other parents.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from store.exporters._graph import BlockIds, Workflow

NAME = "aiperf-agentic"
SUMMARY = "AIPerf agentic / SemiAnalysis cc-traces (Weka) JSON, one trace per workflow"


class Unexpressible(ValueError):
    """A workflow whose call graph the nested layout cannot carry (module docstring)."""


def _request(wf: Workflow, c: dict, hashes: dict[str, list[int]], t0: float, last: bool) -> dict:
    gap = wf.gap_s(c)
    tools = bool(c.get("tool_calls"))
    calls = wf.by_id()
    after_tool = any(calls[p].get("tool_calls") and calls[p].get("wait_after") != "human"
                     for p in wf.parents[c["request_id"]])
    item: dict[str, Any] = {"t": round(c["t_arrival"] - t0, 6), "type": "n", "model": c.get("model") or "unknown",
                            "in": int(c["input_tokens"]), "out": int(c["output_tokens"]),
                            "hash_ids": hashes[c["request_id"]],
                            "input_types": ["tool_result"] if after_tool else ["text"],
                            "output_types": ["text", "tool_use"] if tools else ["text"],
                            "stop": ("end_turn" if c.get("wait_after") == "human" else "tool_use" if tools
                                     else "end_turn" if last else ""),
                            "api_time": round(c["t_finish"] - c["t_arrival"], 6),
                            "think_time": round(gap, 6) if gap is not None else 0.0}
    if c.get("t_first_token") is not None:
        item["type"] = "s"
        item["ttft"] = round(c["t_first_token"] - c["t_arrival"], 6)
    return item


def layout(wf: Workflow) -> list[tuple[str, list[list[dict]]]]:
    """The workflow as top-level items: ``("call", [[c]])`` or ``("group", [chain, ...])``, a group
    being two or more sub-agents spawned by the call before it, each a chain of one agent's calls,
    that the call after it (if any) joins (raises :class:`Unexpressible`)."""
    children: dict[str, list[str]] = {}
    for rid, ps in wf.parents.items():
        for p in ps:
            children.setdefault(p, []).append(rid)
    calls = wf.by_id()
    placed: set[str] = set()
    items: list[tuple[str, list[list[dict]]]] = []
    ends: set[str] = set()
    order = [c["request_id"] for c in wf.calls]
    while len(placed) < len(order):
        nxt = next(r for r in order if r not in placed)
        if set(wf.parents[nxt]) != ends:
            raise Unexpressible(f"call {nxt} depends on {sorted(wf.parents[nxt])}, not on the stage "
                                f"before it ({sorted(ends)})")
        group = [r for r in order if r not in placed and set(wf.parents[r]) == ends]
        if len(group) == 1:
            items.append(("call", [[calls[nxt]]]))
            placed.add(nxt)
            ends = {nxt}
            continue
        if not items or items[-1][0] == "group":
            raise Unexpressible(f"the fan-out at {nxt} has no call of its own before it (AIPerf runs "
                                "adjacent sub-agents as one group and drops those nothing spawned)")
        chains = []
        for first in group:
            chain = [first]
            placed.add(first)
            while True:     # extend while the chain's last call has one child: the same agent's next
                kids = children.get(chain[-1], [])
                if (len(kids) == 1 and kids[0] not in placed and wf.parents[kids[0]] == [chain[-1]]
                        and calls[kids[0]]["agent_id"] == calls[first]["agent_id"]):
                    chain.append(kids[0])
                    placed.add(kids[0])
                else:
                    break
            chains.append([calls[r] for r in chain])
        items.append(("group", chains))
        ends = {chain[-1]["request_id"] for chain in chains}
    return items


def trace(wf: Workflow, block_size: int) -> dict:
    """The Weka trace object of one workflow (raises :class:`Unexpressible`)."""
    items = layout(wf)
    hashes = BlockIds(block_size).workflow(wf)      # one hash namespace per trace file
    t0 = wf.start
    last_id = wf.calls[-1]["request_id"]
    models = sorted({c.get("model") or "unknown" for c in wf.calls})
    requests: list[dict] = []
    n_sub = 0
    for kind, chains in items:
        if kind == "call":
            c = chains[0][0]
            requests.append(_request(wf, c, hashes, t0, c["request_id"] == last_id))
            continue
        t_group = round(min(chain[0]["t_arrival"] for chain in chains) - t0, 6)
        for chain in chains:
            n_sub += 1
            requests.append({
                "t": t_group, "type": "subagent", "agent_id": f"agent_{n_sub:03d}",
                "subagent_type": chain[0]["agent_id"],
                "duration_ms": round((max(c["t_finish"] for c in chain) - chain[0]["t_arrival"]) * 1000, 3),
                "total_tokens": sum(int(c["input_tokens"]) + int(c["output_tokens"]) for c in chain),
                "tool_use_count": sum(len(c.get("tool_calls") or []) for c in chain), "status": "completed",
                "requests": [_request(wf, c, hashes, t0, c["request_id"] == last_id) for c in chain],
                "models": sorted({c.get("model") or "unknown" for c in chain}), "tool_tokens": 0,
                "system_tokens": 0})
    return {"id": wf.workflow_id, "models": models, "block_size": block_size, "hash_id_scope": "local",
            "tool_tokens": 0, "system_tokens": 0, "requests": requests}


def _file_name(workflow_id: str, used: set[str]) -> str:
    base = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in workflow_id)[:120] or "workflow"
    name, k = base, 1
    while name in used:
        k += 1
        name = f"{base}-{k}"
    used.add(name)
    return name + ".json"


def write(workflows: Sequence[Workflow], out: Path, block_size: int = 64) -> dict:
    """Write one trace per workflow: a folder of ``<workflow>.json`` files, or one JSON Lines file
    when ``out`` ends in ``.jsonl``. Returns counts and the workflows left out (with why)."""
    traces, skipped = [], []
    for wf in workflows:
        try:
            traces.append(trace(wf, block_size))
        except Unexpressible as exc:
            skipped.append(f"{wf.workflow_type_id}/{wf.workflow_id}: {exc}")
    if out.name.endswith(".jsonl"):
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for t in traces:
                fh.write(json.dumps(t, ensure_ascii=False, separators=(",", ":")) + "\n")
        tmp.replace(out)
        files = 1
    else:
        out.mkdir(parents=True, exist_ok=True)
        used: set[str] = set()
        for t in traces:
            (out / _file_name(t["id"], used)).write_text(json.dumps(t, ensure_ascii=False, indent=1),
                                                         encoding="utf-8")
        files = len(traces)
    calls = sum(len(wf.calls) for wf in workflows) - sum(
        len(wf.calls) for wf in workflows if any(s.startswith(f"{wf.workflow_type_id}/{wf.workflow_id}:")
                                                 for s in skipped))
    return {"files": files, "workflows": len(traces), "calls": calls, "skipped": skipped}
