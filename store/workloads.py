"""Seeded synthetic agent workloads (``profiler generate``).

A workload *spec* is data (JSON in ``store/workload_specs/``): the agents with their output-length
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

The built-in ``messy`` spec (``profiler generate --messy``) has its own generator,
:func:`generate_messy`: bimodal and heavy-tailed lengths, a rare agent and transition, a release
at the midpoint of the log, and tool latency that grows with the workflows in flight.

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
from typing import Any, Iterator, Mapping

import numpy as np

#: Folder of the built-in specs (data, not code), shipped as package data so a plain
#: ``pip install`` has them. (Not linked from ``datasets/``: ``profiler fit datasets/`` would
#: read the link as a log file outside the folder and quarantine it.)
SPEC_DIR = Path(__file__).resolve().parent / "workload_specs"
#: Built-in spec names accepted on the command line (dashes or underscores).
BUILTIN_SPECS = ("coding_assistant", "deep_research", "messy", "agent_user", "phased_team", "drift_team",
                 "claude_code_interactive", "codex_interactive")
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
    if spec_d.get("generator") == "messy":
        yield from generate_messy(spec_d, n_workflows, seed=seed, with_text=with_text,
                                  arrival_rate=arrival_rate)
        return
    special = {"agent_user": generate_agent_user, "phased": generate_phased,
               "interactive": generate_interactive, "drift": generate_drift}.get(spec_d.get("generator"))
    if special is not None:
        yield from special(spec_d, n_workflows, seed=seed, arrival_rate=arrival_rate)
        return
    arrivals = np.random.default_rng([seed, 7])
    t = EPOCH0
    for i in itertools.count() if n_workflows is None else range(n_workflows):
        t += float(arrivals.exponential(1.0 / arrival_rate))
        yield from generate_workflow(spec_d, i, seed, t, with_text)


# --------------------------------------------------------------------------- messy workloads
#: Name of the messy built-in spec (``profiler generate --messy``).
MESSY_SPEC = "messy"


def messy_arrivals(n_workflows: int | None, seed: int, arrival_rate: float,
                   amplitude: float, period_s: float) -> Iterator[float]:
    """Workflow start times in *waves*: a Poisson process whose rate swings sinusoidally,

    λ(t) = r · (1 + a · sin(2π (t − t₀) / P)),

    drawn by thinning (candidates at rate r(1 + a), each kept with probability λ(t) / (r(1 + a))),
    so the number of workflows in flight, and with it tool latency, rises and falls."""
    rng = np.random.default_rng([seed, 7, 1])
    peak = arrival_rate * (1.0 + amplitude)
    t = EPOCH0
    for _ in itertools.count() if n_workflows is None else range(n_workflows):
        while True:
            t += float(rng.exponential(1.0 / peak))
            lam = arrival_rate * (1.0 + amplitude * np.sin(2 * np.pi * (t - EPOCH0) / period_s))
            if rng.random() * peak <= lam:
                break
        yield t


def _messy_length(spec: dict, agent: str, release: str, router_index: int,
                  rng: np.random.Generator) -> int:
    """One output length of ``agent`` (see :func:`generate_messy` for the shapes)."""
    a = spec["agents"][agent]
    if agent == "router":  # bimodal; long replies likelier the later the router is called
        p_long = min(a["p_long_max"], a["p_long_start"] + a["p_long_step"] * router_index)
        if rng.random() < p_long:
            lo, hi = a["long_range"]
            return int(round(np.exp(rng.uniform(np.log(lo), np.log(hi)))))
        return max(1, int(round(a["short_median"] * np.exp(a["short_sigma"] * rng.standard_normal()))))
    if agent == "coder":  # Pareto: P(X > x) = (x_m / x)^α, heavy upper tail, capped at max_tokens
        xm = a["pareto_xm"][release]
        return int(min(spec["max_tokens"], round(xm * rng.random() ** (-1.0 / a["pareto_alpha"]))))
    mu, sigma = lognormal_params(a["output_mean"], a["output_cv"])
    return max(1, int(round(np.exp(mu + sigma * rng.standard_normal()))))


def _messy_path(spec: dict, release: str, rng: np.random.Generator) -> list[str]:
    """The agents of one workflow, in order.

    v1: router → (coder → router)×r → reviewer → [security_auditor] → tester
    v2: router → planner → (coder → tester)×r → reviewer → [security_auditor]
    (r ~ U{coder_loops[release]}; the auditor with probability ``p_security_audit``)."""
    lo, hi = spec["coder_loops"][release]
    r = int(rng.integers(lo, hi + 1))
    audit = ["security_auditor"] if rng.random() < spec["p_security_audit"] else []
    if release == "v1":
        return ["router"] + ["coder", "router"] * r + ["reviewer"] + audit + ["tester"]
    return ["router", "planner"] + ["coder", "tester"] * r + ["reviewer"] + audit


def generate_messy(spec: dict, n_workflows: int | None, seed: int = 0, with_text: bool = False,
                   arrival_rate: float = 0.2) -> Iterator[dict]:
    """Flat records of the *messy* workload (``store/workload_specs/messy.json``).

    What makes it messy, each on purpose (the tests measure every one):

    * **bimodal lengths**: ``router`` answers ~4 tokens or 200–1,500 (log-uniform); the long mode's
      probability grows with the router's call index (p = min(0.9, 0.1 + 0.2 i)), so length tracks
      position as in the real multi-agent traces;
    * **heavy tail**: ``coder`` is Pareto (α = 1.3: infinite variance), capped at ``max_tokens``;
    * **a small agent and a rare transition**: ``security_auditor`` follows the reviewer in ~2.5 %
      of workflows (tens of calls in a few hundred workflows);
    * **a release at the midpoint in time**: workflows starting after the midpoint of the start
      times (with an endless stream: after one load wave) run release ``v2`` — a new ``planner``,
      the tester moves into the coder loop, the coder writes about twice as much;
    * **latency grows with load**: arrivals come in waves (:func:`messy_arrivals`); a tool with
      ``load_beta`` β runs ``(1 + β (n − 1))`` times its base lognormal latency, where n is the
      number of workflows in flight when it starts (this one plus earlier ones not yet finished);
      the queueing delay grows the same way. Records carry ``release`` and ``in_flight``.

    Deterministic in ``seed``: workflow i's draws come from ``default_rng([seed, i, hash(type)])``.
    """
    wt = spec["workflow_type_id"]
    serving, tools = spec["serving"], spec["tools"]
    period_s = 150.0 / arrival_rate / spec["load"]["waves_per_150_workflows"]
    starts: Iterator[float] = messy_arrivals(n_workflows, seed, arrival_rate,
                                             spec["load"]["amplitude"], period_s)
    if n_workflows is not None:
        starts_l = list(starts)
        release_t = (starts_l[0] + starts_l[-1]) / 2 if starts_l else EPOCH0
        starts = iter(starts_l)
    else:
        release_t = EPOCH0 + period_s
    running = np.empty(0)  # end times of earlier workflows still running at this one's start
    for index, t_start in enumerate(starts):
        rng = np.random.default_rng([seed, index, hash_str(wt)])
        release = "v2" if t_start >= release_t else "v1"
        wf_id = f"{wt}-s{seed}-{index:07d}"
        task_tokens = int(rng.integers(spec["task_tokens"][0], spec["task_tokens"][1] + 1))
        context = task_tokens
        t = t_start
        router_index = 0
        n = 0
        running = running[running > t_start]
        for agent in _messy_path(spec, release, rng):
            in_flight = 1 + int(np.count_nonzero(running > t))
            out_tok = _messy_length(spec, agent, release, router_index, rng)
            router_index += agent == "router"
            in_tok = spec["agents"][agent]["system_tokens"] + context
            queue = float(serving["queue_s_median"] * (1 + serving["queue_load_factor"] * (in_flight - 1))
                          * np.exp(serving["queue_s_sigma"] * rng.standard_normal()))
            t_first = t + queue + in_tok / serving["prefill_tok_s"]
            t_fin = t_first + out_tok / serving["decode_tok_s"]
            n += 1
            rec: dict[str, Any] = {
                "request_id": f"{wf_id}#{n}", "workflow_type_id": wt, "workflow_id": wf_id,
                "agent_id": agent, "t_arrival": round(t, 6), "t_first_token": round(t_first, 6),
                "t_finish": round(t_fin, 6), "input_tokens": int(in_tok), "output_tokens": out_tok,
                "model": spec.get("model"), "release": release, "in_flight": in_flight,
            }
            t_tool = t_fin + 0.005
            tool_recs = []
            for choice in spec.get("agent_tools", {}).get(agent, []):
                if rng.random() >= choice["p"]:
                    continue
                tool = tools[choice["tool"]]
                slow = 1.0 + tool["load_beta"] * (in_flight - 1)
                dur = float(tool["median_s"] * slow * np.exp(tool["sigma"] * rng.standard_normal()))
                tool_recs.append({"name": choice["tool"], "t_start": round(t_tool, 6),
                                  "t_end": round(t_tool + dur, 6), "status": "ok"})
                context += tool["output_tokens"]
                t_tool += dur + 0.002
            rec["tool_calls"] = tool_recs
            if with_text:
                rec["messages"] = [{"role": "system", "content": _system_prompt(spec, agent)},
                                   {"role": "user", "content": "Task: " + _words(rng, task_tokens)}]
                rec["response_text"] = f"[{agent}] " + _words(rng, out_tok)
            context += out_tok
            yield rec
            t = t_tool + serving["think_s"]
        running = np.append(running, t)


def _poisson_starts(rng: np.random.Generator, n_workflows: int | None,
                    arrival_rate: float) -> Iterator[tuple[int, float]]:
    """``(i, start time)`` of each workflow: a Poisson process of ``arrival_rate`` from
    :data:`EPOCH0` (endless with ``n_workflows`` None). Draws one exponential per workflow, when
    it is asked for."""
    t0 = EPOCH0
    for i in itertools.count() if n_workflows is None else range(n_workflows):
        t0 += float(rng.exponential(1.0 / arrival_rate))
        yield i, t0


def _bounded_count(rng: np.random.Generator, spec: Mapping[str, Any]) -> int:
    """``spec["min"]`` and then one more with probability ``spec["p_more"]`` each, up to
    ``spec["max"]`` (a truncated geometric count: turns of a conversation, phases of a team)."""
    n = int(spec["min"])
    while n < spec["max"] and rng.random() < spec["p_more"]:
        n += 1
    return n


def _plain_call(rng: np.random.Generator, spec: dict, agent: str, wf: str, n: int, t: float,
                context: int, stage: str | None = None, scale: float = 1.0,
                workflow_type_id: str | None = None) -> tuple[dict[str, Any], float]:
    """The flat record of call ``n`` of ``wf`` by ``agent`` arriving at ``t`` after ``context``
    tokens of conversation (lognormal output from the agent's mean/CV, times ``scale``, at most
    the spec's ``max_tokens``; prefill and decode at the spec's speeds; ``stage`` recorded when
    given), and its finish time. Draws one normal from ``rng``."""
    a, serving = spec["agents"][agent], spec["serving"]
    mu, sigma = lognormal_params(a["output_mean"], a["output_cv"])
    out_tok = max(1, int(round(scale * np.exp(mu + sigma * rng.standard_normal()))))
    if spec.get("max_tokens"):
        out_tok = min(out_tok, int(spec["max_tokens"]))
    in_tok = a["system_tokens"] + context
    t_fin = t + in_tok / serving["prefill_tok_s"] + out_tok / serving["decode_tok_s"]
    rec: dict[str, Any] = {"request_id": f"{wf}#{n}",
                           "workflow_type_id": workflow_type_id or spec["workflow_type_id"],
                           "workflow_id": wf, "agent_id": agent}
    if stage is not None:
        rec["stage"] = stage
    rec.update({"t_arrival": round(t, 6), "t_finish": round(t_fin, 6), "input_tokens": int(in_tok),
                "output_tokens": out_tok, "model": spec.get("model")})
    return rec, t_fin


def generate_agent_user(spec: dict, n_workflows: int | None, seed: int = 0,
                        arrival_rate: float = 0.2) -> Iterator[dict]:
    """Flat records of the agent <-> user-simulator workload (``agent_user.json``).

    A conversation is 1..``turns.max`` turns (another turn with probability ``turns.p_more``);
    a turn is one user-simulator call, then agent calls: an agent response calls a tool with
    probability ``p_tool_by_streak[k]`` after ``k`` tool calls in a row in this turn (its
    ``tool_calls`` record names one tool), and the agent is called again; a response without a
    tool ends the turn. So the call after an agent call is certain once its response is known
    (the Bayes bound of next-agent top-1 after the response is 1) but not at its arrival.
    """
    rng = np.random.default_rng([seed, 11])
    wt, serving = spec["workflow_type_id"], spec["serving"]
    turns, p_tool, tools = spec["turns"], spec["p_tool_by_streak"], spec["tools"]
    for i, t0 in _poisson_starts(rng, n_workflows, arrival_rate):
        wf, t, n, context = f"{wt}-{seed}-{i}", t0, 0, 0
        n_turns = _bounded_count(rng, turns)
        for _turn in range(n_turns):
            streak = 0
            for agent in itertools.chain(["user"], itertools.repeat("agent")):
                n += 1
                rec, t_fin = _plain_call(rng, spec, agent, wf, n, t, context)
                context += rec["output_tokens"]
                t = t_fin + float(rng.exponential(serving["think_s"]))
                called = agent == "agent" and rng.random() < p_tool[min(streak, len(p_tool) - 1)]
                if called:
                    dur = float(rng.lognormal(np.log(serving["tool_s_median"]), 0.5))
                    rec["tool_calls"] = [{"name": str(rng.choice(tools)), "t_start": round(t_fin + 0.005, 6),
                                          "t_end": round(t_fin + 0.005 + dur, 6), "status": "ok"}]
                    t = t_fin + 0.01 + dur
                    streak += 1
                yield rec
                if agent == "agent" and not called:
                    break


def generate_phased(spec: dict, n_workflows: int | None, seed: int = 0,
                    arrival_rate: float = 0.2) -> Iterator[dict]:
    """Flat records of the phased-team workload (``phased_team.json``), each call with its
    ``stage`` (the phase it ran in).

    A workflow is ``middle_phases.min``..``max`` middle phases (another with probability
    ``p_more``), each drawn uniformly and independently from ``phases``, then the final phase;
    a phase is one call of the ``chair`` and one of the phase's worker, both with the phase as
    their ``stage``. Which worker follows a chair call is therefore independent of every agent
    before it and certain given the chair call's stage; the final phase's chair call is
    followed by exactly one more call.
    """
    rng = np.random.default_rng([seed, 13])
    wt, serving = spec["workflow_type_id"], spec["serving"]
    chair, phases, final = spec["chair"], spec["phases"], spec["final_phase"]
    mid = spec["middle_phases"]
    names = sorted(phases)
    for i, t0 in _poisson_starts(rng, n_workflows, arrival_rate):
        wf, t, n, context = f"{wt}-{seed}-{i}", t0, 0, 0
        n_mid = _bounded_count(rng, mid)
        plan = [names[int(k)] for k in rng.integers(0, len(names), n_mid)]
        steps = [(p, phases[p]) for p in plan] + list(final.items())
        for stage, worker in steps:
            for agent in (chair, worker):
                n += 1
                rec, t_fin = _plain_call(rng, spec, agent, wf, n, t, context, stage)
                context += rec["output_tokens"]
                yield rec
                t = t_fin + float(rng.exponential(serving["think_s"]))


def generate_interactive(spec: dict, n_workflows: int | None, seed: int = 0,
                         arrival_rate: float = 0.2) -> Iterator[dict]:
    """Flat records of an interactive coding session (``claude_code_interactive.json``,
    ``codex_interactive.json``): a person at the keyboard and an agent that works in a tool loop.

    A session is ``turns.min``..``turns.max`` human turns (another with probability
    ``turns.p_more``); a turn is ``calls.min``..``calls.max`` agent calls (truncated geometric,
    ``calls.p_more``), each but the last followed by a tool whose time is lognormal around
    ``serving.tool_s_median`` (σ ``serving.tool_sigma``), the conversation growing by each
    output and ``tool_result_tokens`` per tool. The last call of a turn that is not the
    session's last is ``wait_after: "human"`` (the log contract's mark, as the Claude Code, Codex
    and TraceLab importers set it) and the person answers after a lognormal think time around
    ``serving.human_wait_s_median`` (σ ``serving.human_wait_sigma``), clipped to
    ``serving.human_wait_s_range``: seconds to minutes.
    """
    rng = np.random.default_rng([seed, 17])
    wt, serving = spec["workflow_type_id"], spec["serving"]
    lo, hi = serving["human_wait_s_range"]
    for i, t0 in _poisson_starts(rng, n_workflows, arrival_rate):
        wf, t, n, context = f"{wt}-{seed}-{i}", t0, 0, 0
        n_turns = _bounded_count(rng, spec["turns"])
        for turn in range(n_turns):
            context += int(spec["prompt_tokens"])          # the person's prompt
            n_calls = _bounded_count(rng, spec["calls"])
            for k in range(n_calls):
                n += 1
                rec, t_fin = _plain_call(rng, spec, "main", wf, n, t, context)
                context += rec["output_tokens"]
                if k < n_calls - 1:
                    dur = float(rng.lognormal(np.log(serving["tool_s_median"]), serving["tool_sigma"]))
                    rec["tool_calls"] = [{"name": str(rng.choice(spec["tools"])),
                                          "t_start": round(t_fin, 6), "t_end": round(t_fin + dur, 6),
                                          "status": "ok"}]
                    context += int(spec["tool_result_tokens"])
                    t = t_fin + dur
                elif turn < n_turns - 1:
                    rec["wait_after"] = "human"
                    wait = float(rng.lognormal(np.log(serving["human_wait_s_median"]),
                                               serving["human_wait_sigma"]))
                    t = t_fin + min(max(wait, lo), hi)
                yield rec


def _drift_path(spec: dict, rng: np.random.Generator) -> list[str]:
    """The agents of one drift-team workflow, in order: product manager → architect →
    engineer×r → QA×q → [security reviewer] → reviewer → [release manager] (r, q uniform over
    ``engineer_loops`` / ``qa_loops``; each rare agent with its ``p_rare``)."""
    r = int(rng.integers(spec["engineer_loops"][0], spec["engineer_loops"][1] + 1))
    q = int(rng.integers(spec["qa_loops"][0], spec["qa_loops"][1] + 1))
    rare = {a: bool(rng.random() < p) for a, p in sorted(spec["p_rare"].items())}
    return (["product_manager", "architect"] + ["engineer"] * r + ["qa_engineer"] * q
            + ["security_reviewer"] * rare.get("security_reviewer", False) + ["reviewer"]
            + ["release_manager"] * rare.get("release_manager", False))


def generate_drift(spec: dict, n_workflows: int | None, seed: int = 0,
                   arrival_rate: float = 0.2) -> Iterator[dict]:
    """Flat records of the drift-team workload (``drift_team.json``): issue 37's first row.

    Each workflow runs prompt variant ``b`` with probability ``p_variant_b`` (else ``a``); the
    variant is the workflow type. Under a variant listed in ``growth`` an agent's output length is
    its lognormal draw times ``1 + (g − 1) · clip((f − s) / (1 − s), 0, 1)``, ``f`` ∈ [0, 1]
    the workflow's rank in start order over the log (with an endless stream: over the first
    1,000 workflows, then 1) and ``s`` the spec's ``growth_start``: that variant's lengths stay
    put until the share ``s`` of the log and then grow to ``g`` times (1.5–3×) by its last
    workflow, while the other variant stays put. A workflow runs 2 + r + q + rare calls, r and
    q uniform over ``engineer_loops`` / ``qa_loops``. Rare agents (``p_rare``) get a few dozen calls in a few hundred
    workflows. Deterministic in ``seed``."""
    rng = np.random.default_rng([seed, 17])
    serving, types, growth = spec["serving"], spec["workflow_type_ids"], spec.get("growth", {})
    horizon = max((n_workflows or 1000) - 1, 1)
    start = float(spec.get("growth_start", 0.0))
    for i, t0 in _poisson_starts(rng, n_workflows, arrival_rate):
        variant = "b" if rng.random() < spec["p_variant_b"] else "a"
        wt, f = types[variant], min(i / horizon, 1.0)
        ramp = min(max((f - start) / (1.0 - start), 0.0), 1.0)
        wf, t, context = f"{wt}-s{seed}-{i:07d}", t0, 0
        for n, agent in enumerate(_drift_path(spec, rng), start=1):
            g = float(growth.get(variant, {}).get(agent, 1.0))
            rec, t_fin = _plain_call(rng, spec, agent, wf, n, t, context, scale=1.0 + (g - 1.0) * ramp,
                                     workflow_type_id=wt)
            rec["prompt_variant"] = variant
            context += rec["output_tokens"]
            yield rec
            t = t_fin + float(rng.exponential(serving["think_s"]))


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
