"""AIPerf agentic traces / SemiAnalysis cc-traces ("Weka" format) -> flat records.

One trace object per file (``*.json``; or one per line of a ``*.jsonl``): ``{"id", "models",
"block_size", "hash_id_scope", "tool_tokens", "system_tokens", "requests": [...]}`` whose items are
requests ``{"t", "type": "n" | "s", "model", "in", "out", "hash_ids", "stop", "api_time",
"think_time", "ttft"?}`` or sub-agent markers ``{"t", "type": "subagent", "agent_id",
"subagent_type", "status", "requests": [...]}`` (nested, possibly again).

One call per request: ``workflow_id`` = the trace's ``id``; ``request_id`` = ``<id>#<k>`` in
reading order; ``t_arrival`` = ``t`` (seconds from the conversation's start: the trace has no
epoch, so a workflow starts at 0; a sub-agent whose requests start before its marker counts them
from the marker, the raw kv-cache-tester convention, else from the root, SemiAnalysis AgentX's),
``t_finish`` = ``t + api_time`` (without ``api_time``: ``t``, flagged ``timing: created_only``),
``t_first_token`` = ``t + ttft``. ``agent_id``: inside a sub-agent its ``subagent_type`` (else its
``agent_id``); at the top level the chain of ``hash_ids`` the request continues (same first block
and model: the first chain is ``main``, later ones ``agent_1``, ``agent_2``, ...), the evidence
AIPerf uses to tell flattened agents apart. A request ending ``stop: "end_turn"`` that the same
agent's next request follows was answered by a person: ``wait_after: "human"`` (think time, kept
apart from tool waits; a sub-agent's ``end_turn`` returns to its parent instead).

**Parents**, as AIPerf replays the nesting (its Weka tutorial): a request depends on the item
before it in its list — a request, or a group of adjacent sub-agent markers, by each one's last
call (an ``async_launched`` sub-agent is not waited for); a sub-agent's first request depends on
the request before its group. Kept per call: ``hash_ids`` and the trace's ``block_size`` /
``hash_id_scope`` (prefix structure), ``stop``, ``subagent_id``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from store.importers._common import (ErrorHandler, ImportFormatError, count_field, iter_json_lines,
                                     load_json_document, report)

NAME = "aiperf-agentic"
ALIASES = ("weka", "cc-traces", "aiperf")
SUMMARY = "AIPerf agentic / SemiAnalysis cc-traces (Weka) JSON traces, nested sub-agents"
FILE_PATTERNS = ("*.json", "*.jsonl", "*.json.gz", "*.jsonl.gz")
DEFAULT_TYPE = "aiperf_agentic"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class _Reader:
    """Flattens one trace (module docstring)."""

    def __init__(self, trace: dict, path: Path, line: int | None, workflow_type: str | None,
                 on_error: ErrorHandler | None) -> None:
        self.trace, self.path, self.line, self.on_error = trace, path, line, on_error
        self.wid = str(trace.get("id"))
        self.wtype = workflow_type or DEFAULT_TYPE
        self.records: list[dict] = []
        #: (first hash id, model) of each top-level agent chain -> its agent id
        self.chains: dict[tuple, str] = {}

    def bad(self, reason: str, fld: str) -> ImportFormatError:
        return ImportFormatError(str(self.path), self.line, reason, fld)

    def request(self, item: dict, where: str, agent: str, parents: list[str], sub: str | None,
                offset: float = 0.0) -> str | None:
        t = _number(item.get("t"))
        n_in, n_out = count_field(item.get("in")), count_field(item.get("out"))
        if t is None:
            report(self.on_error, self.bad("request without t (seconds)", f"{where}.t"))
            return None
        if n_in is None or n_out is None:
            report(self.on_error, self.bad("request without in/out token counts", f"{where}.in"))
            return None
        t += offset
        rid = f"{self.wid}#{len(self.records) + 1}"
        rec: dict[str, Any] = {"request_id": rid, "workflow_type_id": self.wtype, "workflow_id": self.wid,
                               "agent_id": agent, "t_arrival": t, "input_tokens": n_in, "output_tokens": n_out,
                               "parent_request_ids": list(parents)}
        api = _number(item.get("api_time"))
        if api is not None and api >= 0:
            rec["t_finish"] = t + api
        else:
            rec["t_finish"] = t
            rec["timing"] = "created_only"
        if (ttft := _number(item.get("ttft"))) is not None and 0 <= ttft:
            rec["t_first_token"] = min(t + ttft, rec["t_finish"])
        if item.get("model") and item["model"] != "unknown":
            rec["model"] = str(item["model"])
        if isinstance(item.get("hash_ids"), list):
            rec["hash_ids"] = item["hash_ids"]
            rec["block_size"] = self.trace.get("block_size")
            rec["hash_id_scope"] = self.trace.get("hash_id_scope")
        if item.get("stop"):
            rec["stop"] = item["stop"]
        if isinstance(item.get("input_types"), list) and "tool_result" in item["input_types"]:
            rec["input_kind"] = "tool_result"    # a tool answered the call before: no person
        if sub is not None:
            rec["subagent_id"] = sub
        rec["source_format"] = NAME
        rec["import_source"] = f"{self.path}{':' + str(self.line) if self.line else ''}#{where}"
        self.records.append(rec)
        return rid

    def items(self, items: list, where: str, agent: str | None, before: list[str], sub: str | None,
              offset: float) -> list[str]:
        """Read ``items``; returns the calls that end the list (what the next item depends on).
        ``agent`` None: the top level, whose agents come from their ``hash_ids`` chains."""
        ends = list(before)
        k = 0
        while k < len(items):
            item = items[k]
            if not isinstance(item, dict):
                report(self.on_error, self.bad("not a JSON object", f"{where}[{k}]"))
                k += 1
                continue
            if item.get("type") == "subagent":      # adjacent markers: one group, all spawned by `ends`
                group_ends, waited = [], False
                while k < len(items) and isinstance(items[k], dict) and items[k].get("type") == "subagent":
                    m = items[k]
                    name = str(m.get("subagent_type") or m.get("agent_id") or "subagent")
                    inner = [i for i in m.get("requests") or [] if isinstance(i, dict)]
                    firsts = [t for i in inner if (t := _number(i.get("t"))) is not None]
                    mt = _number(m.get("t"))
                    # raw kv-cache-tester traces count nested t from the marker, AgentX ones from the root
                    rel = mt is not None and bool(firsts) and min(firsts) < mt - 1e-9
                    last = self.items(m.get("requests") or [], f"{where}[{k}].requests", name, ends,
                                      str(m.get("agent_id") or name), offset + (mt if rel else 0.0))
                    if m.get("status") != "async_launched":
                        group_ends += [e for e in last if e not in group_ends]
                        waited = True
                    k += 1
                if waited:
                    ends = group_ends
                continue
            rid = self.request(item, f"{where}[{k}]", agent or self.top_agent(item), ends, sub, offset)
            if rid is not None:
                ends = [rid]
            k += 1
        return ends

    def top_agent(self, item: dict) -> str:
        """The agent of a top-level request: the chain whose first ``hash_ids`` block it shares
        (the first chain is ``main``, later ones ``agent_1``, ``agent_2`` ...), as AIPerf tells the
        agents of a flat trace apart; ``main`` without ``hash_ids``."""
        ids = item.get("hash_ids")
        if not isinstance(ids, list) or not ids or isinstance(ids[0], list):
            return "main"
        key = (ids[0], item.get("model"))
        if key not in self.chains:
            self.chains[key] = "main" if not self.chains else f"agent_{len(self.chains)}"
        return self.chains[key]

    def read(self) -> list[dict]:
        if not isinstance(self.trace.get("requests"), list):
            raise self.bad("no requests list", "requests")
        self.items(self.trace["requests"], "requests", None, [], None, 0.0)
        by_id = {r["request_id"]: r for r in self.records}
        for r in self.records:     # a person answered an end_turn the same agent followed
            for p in r["parent_request_ids"]:    # (a sub-agent's end_turn returns to its parent)
                if (by_id[p].get("stop") == "end_turn" and by_id[p]["agent_id"] == r["agent_id"]
                        and r.get("input_kind") != "tool_result"):
                    by_id[p]["wait_after"] = "human"
        return self.records


def read_file(path: Path, *, workflow_type: str | None = None, on_error: ErrorHandler | None = None,
              **_: Any) -> Iterator[dict]:
    """Flat records of one trace file, or of every trace in a JSON Lines file (module docstring)."""
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        traces = list(iter_json_lines(path, on_error))
    else:
        traces = [(None, load_json_document(path))]
    for line, trace in traces:
        if not isinstance(trace, dict) or "id" not in trace:
            report(on_error, ImportFormatError(str(path), line, "not a trace object (no id)", "id"))
            continue
        try:
            yield from _Reader(trace, path, line, workflow_type, on_error).read()
        except ImportFormatError as err:
            report(on_error, err)

