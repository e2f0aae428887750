"""What every exporter needs from our flat records: workflows in call order, each call's parents
(explicit ``parent_request_ids`` or the previous call, the store's rule), the gap before it, and
prompt-block ids that encode the prefix structure the simulator assumes.

Order inside a workflow is the store's: ``(t_arrival, request_id)`` (``store.derive``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable


@dataclass
class Workflow:
    """One workflow's calls in store order, with each call's parents (request ids)."""

    workflow_type_id: str
    workflow_id: str
    calls: list[dict]
    parents: dict[str, list[str]] = field(default_factory=dict)

    @property
    def start(self) -> float:
        return min(c["t_arrival"] for c in self.calls)

    def by_id(self) -> dict[str, dict]:
        return {c["request_id"]: c for c in self.calls}

    def gap_s(self, call: dict) -> float | None:
        """Seconds from the latest parent's finish to this call's arrival (None for a root)."""
        ids = self.parents.get(call["request_id"]) or []
        if not ids:
            return None
        calls = self.by_id()
        return call["t_arrival"] - max(calls[p]["t_finish"] for p in ids)


def group_workflows(records: Iterable[dict]) -> list[Workflow]:
    """Records grouped by (workflow type, workflow), calls in store order, parents resolved:
    explicit ``parent_request_ids`` that name calls of the same workflow, else the previous call
    (absent parents mean "the previous call of the same workflow", log-format §1)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for rec in records:
        groups.setdefault((str(rec["workflow_type_id"]), str(rec["workflow_id"])), []).append(rec)
    out = []
    for (wtype, wid), calls in groups.items():
        calls.sort(key=lambda c: (c["t_arrival"], c["request_id"]))
        wf = Workflow(wtype, wid, calls)
        ids = {c["request_id"] for c in calls}
        prev = None
        for c in calls:
            explicit = c.get("parent_request_ids")
            if explicit is not None:
                wf.parents[c["request_id"]] = [p for p in explicit if p in ids and p != c["request_id"]]
            else:
                wf.parents[c["request_id"]] = [prev] if prev is not None else []
            prev = c["request_id"]
        out.append(wf)
    out.sort(key=lambda w: (w.start, w.workflow_type_id, w.workflow_id))
    return out


class BlockIds:
    """Prompt-block ids that encode the prefix structure (one id per ``block_size`` tokens of a
    prompt, ``ceil(input / block_size)`` ids; equal ids = the same KV block).

    A call's prompt extends the previous call of the same agent in its workflow (conversation
    lineage, what ``simulator.workload`` assumes): when its prompt is at least as long as that
    call's, its first ``min(previous prompt + output, prompt) // block_size`` blocks are shared:
    those that were full blocks of the previous prompt keep their ids, the rest get ids of their
    own that a later call of the conversation shares in turn; every other block is new. Ids start at ``first`` and grow through the export (one
    counter: unique across workflows, so ``global`` and ``local`` scope read the same)."""

    def __init__(self, block_size: int, first: int = 1) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be at least 1 (got {block_size})")
        self.block_size = block_size
        self.next_id = first

    def _fresh(self, n: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids

    def workflow(self, wf: Workflow) -> dict[str, list[int]]:
        """request id -> its prompt's block ids, for every call of ``wf``."""
        conv: dict[str, tuple[list[int], int, int]] = {}   # agent -> (ids, prompt, output) of its last call
        out: dict[str, list[int]] = {}
        bs = self.block_size
        for c in wf.calls:
            n_in, n_out = int(c["input_tokens"]), int(c["output_tokens"])
            n_blocks = math.ceil(n_in / bs) if n_in > 0 else 0
            last = conv.get(c["agent_id"])
            keep: list[int] = []
            if last is not None and n_in >= last[1]:
                ids, prev_in, prev_out = last
                shared = min(prev_in + prev_out, n_in) // bs
                keep = ids[:min(shared, prev_in // bs)]     # the previous prompt's full blocks
                # the rest of the shared run (the previous output, the previous prompt's last
                # partial block now filled): blocks no earlier prompt held in full, new ids
                keep += self._fresh(shared - len(keep))
            ids = keep[:n_blocks] + self._fresh(n_blocks - min(len(keep), n_blocks))
            out[c["request_id"]] = ids
            # remember the whole conversation (this prompt's blocks; its output's come next time)
            conv[c["agent_id"]] = (ids, n_in, n_out)
        return out
