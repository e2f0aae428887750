"""Rebuild the small copies in this folder from the full real sets (see README.md).

    python datasets/real/make_subsets.py [/path/to/shared/datasets]

Whole workflows only, every field of every record kept, lines copied verbatim. Workflows are
taken in the order of ``md5("real:" + workflow_id)`` (deterministic, independent of file order),
round-robin over workflow types so every type of a set is represented, until the copy would pass
its byte budget.
"""
from __future__ import annotations

import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: File name -> byte budget of its copy. (swe_agent_glm45_bs4.jsonl has no copy here: the whole
#: set is in ../swe_agent/, and a subset beside it made `profiler fit datasets/` skip 1,218
#: duplicate calls.)
BUDGETS = {
    "agentless_pr28.jsonl": 300_000,
    "seq_whowhen_magentic_captain.jsonl": 900_000,
    "mini_swe_agent_gemini3.jsonl": 900_000,
}


def subset(src: Path, dst: Path, budget: int) -> tuple[int, int]:
    """Copy whole workflows of ``src`` to ``dst`` within ``budget`` bytes; (workflows, lines)."""
    by_wf: dict[tuple[str, str], list[str]] = defaultdict(list)
    for line in src.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.strip():
            r = json.loads(line)
            by_wf[(r["workflow_type_id"], r["workflow_id"])].append(line)
    key = lambda k: hashlib.md5(f"real:{k[1]}".encode()).hexdigest()  # noqa: E731
    queues = {wt: sorted((k for k in by_wf if k[0] == wt), key=key) for wt in sorted({k[0] for k in by_wf})}
    chosen, size = [], 0
    while any(queues.values()):
        progressed = False
        for wt, q in queues.items():
            while q:
                k = q.pop(0)
                n = sum(len(x.encode()) for x in by_wf[k])
                if size + n <= budget:
                    chosen.append(k)
                    size += n
                    progressed = True
                    break
        if not progressed:
            break
    keep = set(chosen)
    lines = [ln for k in by_wf if k in keep for ln in by_wf[k]]  # original order of workflows
    dst.write_text("".join(lines), encoding="utf-8")
    return len(keep), len(lines)


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[2] / "shared" / "datasets"
    for name, budget in BUDGETS.items():
        wfs, n = subset(root / name, HERE / name, budget)
        print(f"{name}: {wfs} workflows, {n} calls, {(HERE / name).stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
