"""Seeded synthetic agent workloads (``profiler generate``).

A workload *spec* is data (JSON in ``datasets/workloads/``): the agents with their output-length
mean and coefficient of variation, the tools with lognormal latencies, which tools each agent
runs, and the workflow *structure* as a small grammar:

``{"agent": A}``                     one call of A
``{"agent": A, "fanout": [lo, hi]}`` k ~ U{lo..hi} parallel calls of A (one stage, joined after)
``{"agent": A, "repeat": [lo, hi]}`` r ~ U{lo..hi} sequential calls of A
``{"block": [...], "repeat": [lo, hi]}``        the block r times
``{"block": [...], "loop_p": p, "loop_max": m}`` the block again with probability p, at most m times

Output lengths are lognormal with the spec's mean m and CV c (σ² = ln(1 + c²), μ = ln m − σ²/2);
consecutive calls of the same agent in a workflow are correlated through an AR(1) process on the
normal scale (``autocorr`` ρ: z_t = ρ z_{t−1} + √(1−ρ²) ε_t), as Pythia observed for
high-variance agents. Tool latencies are lognormal with the given median (e^μ) and σ. A call's
prompt is the agent's system prompt, the task, and everything its parents produced (their
responses and tool outputs); its timing is queue + prefill (input / prefill speed) + decode
(output / decode speed); the next stage starts when every call of the current stage and its tools
are done.

With ``with_text`` the records carry ``messages`` and ``response_text`` whose prompts literally
contain the parents' responses, so prompt-composition mining has something real to find
(responses are abbreviated to at most :data:`TEXT_WORDS_MAX` words to keep files small).
"""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

#: Folder of the built-in specs (data, not code).
SPEC_DIR = Path(__file__).resolve().parents[1] / "datasets" / "workloads"
#: Built-in spec names accepted on the command line (dashes or underscores).
BUILTIN_SPECS = ("coding_assistant", "deep_research")
#: Cap on words per generated response text.
TEXT_WORDS_MAX = 120
#: Start of generated time (2025-10-01T00:00:00Z), so generated logs look like real epoch seconds.
EPOCH0 = 1_759_276_800.0

_VOCAB = (
    "the a function file module test class value error return call data path config result "
    "check update index parse request response token cache session agent tool run build query "
    "list map key item state model plan step review patch diff line code source fix issue bug "
    "report search page note summary fact claim evidence answer question topic section draft"
).split()


def load_spec(spec: str | Path) -> dict[str, Any]:
    """A built-in spec by name (``coding_assistant``, ``deep-research``…) or a JSON file path."""
    path = Path(spec)
    if not path.suffix:
        name = str(spec).replace("-", "_")
        path = SPEC_DIR / f"{name}.json"
        if not path.exists():
            raise ValueError(f"unknown workload {spec!r}: built-in workloads are "
                             f"{', '.join(BUILTIN_SPECS)} (or give a JSON spec file)")
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"workload spec {path} not found") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: invalid JSON in workload spec: {exc.msg}") from None


def lognormal_params(mean: float, cv: float) -> tuple[float, float]:
    """(μ, σ) of the lognormal with the given mean and coefficient of variation."""
    sigma2 = np.log1p(cv * cv)
    return float(np.log(mean) - sigma2 / 2), float(np.sqrt(sigma2))


def _expand(steps: list[dict], rng: np.random.Generator) -> list[list[str]]:
    """Unroll the structure grammar into stages (lists of agents; width > 1 = fan-out)."""
    stages: list[list[str]] = []
    for step in steps:
        if "agent" in step:
            if "fanout" in step:
                k = int(rng.integers(step["fanout"][0], step["fanout"][1] + 1))
                stages.append([step["agent"]] * k)
            else:
                lo, hi = step.get("repeat", [1, 1])
                stages.extend([[step["agent"]]] * int(rng.integers(lo, hi + 1)))
        elif "block" in step:
            if "loop_p" in step:
                for _ in range(int(step.get("loop_max", 1))):
                    if rng.random() >= step["loop_p"]:
                        break
                    stages.extend(_expand(step["block"], rng))
            else:
                lo, hi = step.get("repeat", [1, 1])
                for _ in range(int(rng.integers(lo, hi + 1))):
                    stages.extend(_expand(step["block"], rng))
        else:
            raise ValueError(f"structure step needs 'agent' or 'block': {step}")
    return stages


@dataclass
class _Call:
    request_id: str
    agent: str
    output_tokens: int
    response_text: str | None = None
    tool_outputs: list[tuple[str, int, str | None]] = field(default_factory=list)
    done_at: float = 0.0


def _words(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(_VOCAB, size=max(1, min(n, TEXT_WORDS_MAX))))


def _system_prompt(spec: dict, agent: str) -> str:
    words = np.random.default_rng(hash_str(agent)).choice(_VOCAB, size=40)
    return (f"You are the {agent} of a {spec['workflow_type_id'].replace('_', ' ')} team. "
            f"Follow the protocol: {' '.join(words)}.")


def hash_str(s: str) -> int:
    """Stable (process-independent) 32-bit hash of a string."""
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=4).digest(), "big")


def generate_workflow(spec: dict, index: int, seed: int, t_start: float,
                      with_text: bool = False) -> list[dict]:
    """All call records of workflow number ``index`` (deterministic in ``seed`` and ``index``)."""
    rng = np.random.default_rng([seed, index, hash_str(spec["workflow_type_id"])])
    wt = spec["workflow_type_id"]
    wf_id = f"{wt}-s{seed}-{index:07d}"
    serving = spec["serving"]
    agents = spec["agents"]
    tools = spec["tools"]
    task_tokens = int(rng.integers(spec["task_tokens"][0], spec["task_tokens"][1] + 1))
    task_text = _words(rng, task_tokens) if with_text else None
    ar_state: dict[str, float] = {}
    records: list[dict] = []
    parents: list[_Call] = []
    t_ready = t_start
    n = 0
    for stage in _expand(spec["structure"], rng):
        stage_calls: list[_Call] = []
        for agent in stage:
            a = agents[agent]
            mu, sigma = lognormal_params(a["output_mean"], a["output_cv"])
            rho = float(a.get("autocorr", 0.0))
            eps = rng.standard_normal()
            z = rho * ar_state[agent] + np.sqrt(1 - rho * rho) * eps if agent in ar_state else eps
            ar_state[agent] = z
            out_tok = max(1, int(round(np.exp(mu + sigma * z))))
            in_tok = a["system_tokens"] + task_tokens + sum(
                p.output_tokens + sum(t[1] for t in p.tool_outputs) for p in parents)
            n += 1
            rid = f"{wf_id}#{n}"
            t_arr = t_ready + (float(rng.uniform(0, 0.02)) if len(stage) > 1 else 0.0)
            queue = float(np.exp(np.log(serving["queue_s_median"]) + serving["queue_s_sigma"] * rng.standard_normal()))
            t_first = t_arr + queue + in_tok / serving["prefill_tok_s"]
            t_fin = t_first + out_tok / serving["decode_tok_s"]
            call = _Call(rid, agent, out_tok)
            rec: dict[str, Any] = {
                "request_id": rid, "workflow_type_id": wt, "workflow_id": wf_id, "agent_id": agent,
                "t_arrival": round(t_arr, 6), "t_first_token": round(t_first, 6),
                "t_finish": round(t_fin, 6), "input_tokens": int(in_tok), "output_tokens": out_tok,
                "model": spec.get("model"),
            }
            if parents:
                rec["parent_request_ids"] = [p.request_id for p in parents]
            t_tool = t_fin + 0.005
            tool_recs = []
            for choice in spec.get("agent_tools", {}).get(agent, []):
                if rng.random() >= choice["p"]:
                    continue
                tool = tools[choice["tool"]]
                dur = float(np.exp(np.log(tool["median_s"]) + tool["sigma"] * rng.standard_normal()))
                tool_recs.append({"name": choice["tool"], "t_start": round(t_tool, 6),
                                  "t_end": round(t_tool + dur, 6), "status": "ok"})
                call.tool_outputs.append((choice["tool"], tool["output_tokens"],
                                          _words(rng, tool["output_tokens"]) if with_text else None))
                t_tool += dur + 0.002
            rec["tool_calls"] = tool_recs
            call.done_at = t_tool
            if with_text:
                call.response_text = f"[{agent}] " + _words(rng, out_tok)
                context = "".join(
                    f"\n\n### {p.agent} wrote:\n{p.response_text}"
                    + "".join(f"\n\n### {name} returned:\n{text}" for name, _, text in p.tool_outputs)
                    for p in parents)
                rec["messages"] = [
                    {"role": "system", "content": _system_prompt(spec, agent)},
                    {"role": "user", "content": f"Task: {task_text}{context}"},
                ]
                rec["response_text"] = call.response_text
            records.append(rec)
            stage_calls.append(call)
        parents = stage_calls
        t_ready = max(c.done_at for c in stage_calls) + serving.get("think_s", 0.0)
    return records


def generate(spec: str | Path | dict, n_workflows: int | None, seed: int = 0, with_text: bool = False,
             arrival_rate: float = 0.2) -> Iterator[dict]:
    """Flat records of ``n_workflows`` workflows (None = without end); starts are a Poisson process.

    ``arrival_rate`` is in workflows per second (mean gap 1/rate between workflow starts).
    """
    spec_d = spec if isinstance(spec, dict) else load_spec(spec)
    arrivals = np.random.default_rng([seed, 7])
    t = EPOCH0
    for i in itertools.count() if n_workflows is None else range(n_workflows):
        t += float(arrivals.exponential(1.0 / arrival_rate))
        yield from generate_workflow(spec_d, i, seed, t, with_text)


def write_jsonl(records: Iterator[dict], out: Path, gzip_output: bool = False) -> int:
    """Write records as JSON Lines (``.gz`` when asked); returns how many were written."""
    import gzip

    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    opener = gzip.open if gzip_output else open
    with opener(out, "wt", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, separators=(",", ":")))
            fh.write("\n")
            n += 1
    return n
