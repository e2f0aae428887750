"""Named conditions of ``bench/bench_engine.py`` (``--condition``) and the workload each replays.

A condition changes one thing against ``default`` (issue 22, item 3), so a ratio that moves
between conditions can be read as that one thing's effect:

==================  =====================================================================
``default``         generated ``coding-assistant`` workflows at the machine's defaults
``many-in-flight``  3 × the default workflows in flight (``--concurrency``)
``tight-pool``      0.6 × the default KV pool (``--pool-tokens``)
``recorded-gaps``   the recorded tool/think gaps (``--time-scale 1``, not ÷ 50)
``multi-agent``     the real multi-agent trace ``seq_whowhen_magentic_captain.jsonl``
                    (Who&When: Magentic-One and CaptainAgent group chats, ``../shared/datasets``)
``agent-platform``  the simulator's ``--scenario agent-platform`` mix of six applications
                    (:data:`simulator.scenarios.PLATFORM_MIX`, :func:`simulator.sources.mixed`)
==================  =====================================================================

Three more are built for contention (issue 34): each names the arms it compares and sets the
replicas, so that a queue forms and only one thing differs between its arms. Their settings were
picked with ``bench/bench_engine.py --estimate`` (the simulator with the machine's reference step
time) where it predicts a gain of at least 15 % (docs/sglang.md gives the grid):

=======================  ================================================================
``contention``           ONE replica, the agent-platform mix, 3/8 of the default running
                         slots and 4 x the slots in flight; arms ``round-robin`` (plain
                         SGLang behind the same gateway) and ``hints``: only the hints differ
``kv-pressure``          one replica, the mix with the coding sessions' prompts x 4 more
                         tokens (prefill-dominated), a 4,000-token pool that the sessions in
                         flight overfill (eviction during tool gaps); arms ``hints`` and
                         ``no-retention``: retention and prefetch are what is tested
``open-contention``      as ``contention``, but the workflows arrive open loop (Poisson at
                         ``--rate``) as sessions do on a shared platform, instead of a closed
                         population whose mean JCT is fixed by Little's law
``platform-contention``  two replicas, the mix, half the slots, 3 x the slots in flight;
                         arms ``router`` (the real sglang-router) and ``hints``
``open-platform-...``    ``platform-contention``, open loop (its closed population left the queue empty)
=======================  ================================================================

The command line wins over a condition. Every workload is scaled to the replay's lengths, its
profile fitted on *other* workflows of the same applications, each seed a disjoint set of workflows
(docs/sglang.md, "How each condition's workload is prepared").
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

#: The real multi-agent trace (README of ../shared/datasets; a copy ships in datasets/real).
SHARED_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"
REPO_DATASETS = Path(__file__).resolve().parents[1] / "datasets" / "real"
MULTI_AGENT_TRACE = "seq_whowhen_magentic_captain.jsonl"
#: ``open-contention``'s arrival rate on CPU (workflows/s): the lowest rate tried at which the
#: simulator, calibrated on the CPU replica with the cache-aware extend attention, predicts a gain
#: of at least 15 % on each half of seeds 0-19 (1.8/s, picked before that attention made the
#: replica faster, left the queue short on half the seeds; docs/sglang.md); on GPU give ``--rate``
OPEN_RATE_CPU = 2.6
#: ``open-platform-contention``'s rate on CPU (two replicas), picked on the simulator calibrated on
#: session 10's ``platform-contention`` run, by what priority alone (hints vs no-priority) is
#: predicted to save — 6 / 11 / 12 / 15 % at 2.6 / 3.5 / 4.5 / 5.5 per s — since on these replicas
#: the engine showed the cache and routing earning nothing over sglang-router; 5.5 doubles a
#: seed's queue for 3 points more (docs/sglang.md, session 11)
OPEN_PLATFORM_RATE_CPU = 4.5
#: generated workflows the profile of a generated condition is fitted on (seed 1000: no replay
#: seed overlaps)
TRAIN_WORKFLOWS, TRAIN_SEED = 80, 1000


@dataclass(frozen=True)
class Condition:
    """A named preset: a workload and the settings it changes (each a function of the
    machine's default, so the same preset means the same on CPU and GPU)."""

    name: str
    workload: str                      # coding-assistant | multi-agent | agent-platform
    doc: str
    overrides: dict[str, Callable[[float], float]] = field(default_factory=dict)
    #: the arms this condition compares (None: the command line's ``--setups``)
    setups: tuple[str, ...] | None = None
    #: workflows in flight per running slot of the cluster (``--concurrency`` = this ×
    #: ``--max-running`` × ``--replicas`` unless given); None: the concurrency setting as is
    in_flight_per_slot: float | None = None


CONDITIONS: dict[str, Condition] = {c.name: c for c in (
    Condition("default", "coding-assistant", "generated coding-assistant workflows, machine defaults"),
    Condition("many-in-flight", "coding-assistant", "3 x the default workflows in flight",
              {"concurrency": lambda d: int(3 * d)}),
    Condition("tight-pool", "coding-assistant", "0.6 x the default KV pool per replica",
              {"pool_tokens": lambda d: int(0.6 * d)}),
    Condition("recorded-gaps", "coding-assistant", "tool/think gaps as recorded (time scale 1)",
              {"time_scale": lambda d: 1.0}),
    Condition("multi-agent", "multi-agent", f"real multi-agent trace ({MULTI_AGENT_TRACE}: Who&When)"),
    Condition("agent-platform", "agent-platform", "the simulator's agent-platform mix of six applications"),
    Condition("contention", "agent-platform",
              "one replica, the agent-platform mix, 4 x its running slots in flight: round robin vs hints",
              {"replicas": lambda d: 1, "max_running": lambda d: max(2, int(d) * 3 // 8),
               "workflows": lambda d: int(1.125 * d)},
              setups=("round-robin", "hints"), in_flight_per_slot=4.0),
    Condition("kv-pressure", "agent-platform",
              "one replica, prefill-dominated coding prompts (x4 tokens), a pool the sessions overfill: "
              "hints vs no-retention",
              {"replicas": lambda d: 1, "max_running": lambda d: max(2, int(d) // 2),
               "pool_tokens": lambda d: int(2 * d), "coding_token_scale": lambda d: 4.0},
              setups=("hints", "no-retention"), in_flight_per_slot=2.0),
    Condition("open-contention", "agent-platform",
              "one replica, the agent-platform mix arriving open loop (Poisson, 2.6 workflows/s on CPU), "
              "no cap in flight: round robin vs hints",
              {"replicas": lambda d: 1, "max_running": lambda d: max(2, int(d) * 3 // 8),
               "workflows": lambda d: int(2.5 * d), "rate": lambda d: OPEN_RATE_CPU},
              setups=("round-robin", "hints")),
    Condition("platform-contention", "agent-platform",
              "two replicas, the agent-platform mix, 3 x the running slots in flight: sglang-router vs hints",
              {"max_running": lambda d: max(2, int(d) // 2), "workflows": lambda d: int(1.5 * d)},
              setups=("router", "hints"), in_flight_per_slot=3.0),
    Condition("open-platform-contention", "agent-platform",
              f"two replicas, the agent-platform mix arriving open loop (Poisson, {OPEN_PLATFORM_RATE_CPU} workflows/s "
              "on CPU), no cap in flight: sglang-router vs hints",
              {"max_running": lambda d: max(2, int(d) // 2), "workflows": lambda d: int(2.5 * d),
               "rate": lambda d: OPEN_PLATFORM_RATE_CPU},
              setups=("router", "hints")),
)}
#: the mix's long single-agent coding sessions (``--coding-token-scale`` multiplies their prompts)
CODING_APPS = frozenset({"swe-agent", "mini-swe-agent", "coding-assistant"})


def condition_settings(name: str, given: dict[str, object], defaults: dict[str, object]) -> dict[str, object]:
    """The settings of condition ``name``: what the command line gave (``given``, None = unset)
    wins, then the condition's override of the machine default, then the default itself."""
    if name not in CONDITIONS:
        raise ValueError(f"unknown condition {name!r}: use one of {', '.join(CONDITIONS)}")
    cond = CONDITIONS[name]
    out = {}
    for key, default in defaults.items():
        if given.get(key) is not None:
            out[key] = given[key]
        elif key in cond.overrides:
            out[key] = cond.overrides[key](default)
        else:
            out[key] = default
    if cond.in_flight_per_slot is not None and given.get("concurrency") is None and "max_running" in out:
        out["concurrency"] = int(math.ceil(cond.in_flight_per_slot * out["max_running"] * out.get("replicas", 1)))
    return out


def multi_agent_trace() -> Path:
    """The Who&When trace: ``../shared/datasets`` when present, else the repository's copy."""
    for folder in (SHARED_DATASETS, REPO_DATASETS):
        if (folder / MULTI_AGENT_TRACE).exists():
            return folder / MULTI_AGENT_TRACE
    raise FileNotFoundError(f"{MULTI_AGENT_TRACE} is in neither {SHARED_DATASETS} nor {REPO_DATASETS}")


def scale_records(records: list[dict], token_scale: float, max_input: int, max_output: int) -> tuple[list[dict], int]:
    """Copies of ``records`` with lengths as the replay sends them (``round(n × token_scale)``,
    as :func:`serving_hooks.replay_plan.load_plan` scales; outputs at least 1), prompts capped at
    ``max_input`` and outputs at ``max_output`` tokens; returns them and how many calls a cap cut."""
    out, capped = [], 0
    for r in records:
        n_in = max(0, round(r["input_tokens"] * token_scale))
        n_out = max(1, round(r["output_tokens"] * token_scale))
        capped += n_in > max_input or n_out > max_output
        out.append({**r, "input_tokens": min(n_in, max_input), "output_tokens": min(n_out, max_output)})
    return out, capped


def seed_slice(workflow_ids: list[str], seed: int, k: int) -> list[str]:
    """Seed ``seed``'s ``k`` workflows of a fixed shuffle of ``workflow_ids``: the slice
    ``[seed·k, (seed+1)·k)``, wrapping past the end (disjoint across seeds while they fit)."""
    if k <= 0:
        raise ValueError(f"--workflows must be >= 1, not {k}")
    if not workflow_ids:
        raise ValueError("no workflow to replay")
    order = [workflow_ids[i] for i in np.random.default_rng(0).permutation(len(workflow_ids))]
    return [order[(seed * k + i) % len(order)] for i in range(min(k, len(order)))]


def coding_prompts(records: list[dict], factor: float) -> list[dict]:
    """``records`` with the prompts of the mix's coding sessions (:data:`CODING_APPS`, by the
    ``app:`` in front of the workflow id) × ``factor`` (outputs as they are): prompts long enough
    that prefill is most of a call's time. ``factor`` 1 returns ``records`` itself."""
    if factor == 1.0:
        return records
    return [{**r, "input_tokens": r["input_tokens"] * factor}
            if str(r.get("workflow_id", "")).split(":", 1)[0] in CODING_APPS else r for r in records]


@dataclass
class EngineWorkload:
    """What one condition replays: per seed the records (lengths scaled and capped, recorded
    times) and the profile's train records (scaled alike, on the replay's clock)."""

    condition: str
    replay: dict[int, list[dict]]
    train: dict[int, list[dict]]       # per seed; generated and multi-agent: the same list for all
    capped_calls: int = 0             # replayed calls whose prompt or output a cap cut
    notes: list[str] = field(default_factory=list)

    def shared_train(self) -> bool:
        """Whether every seed uses the same train records (one profile)."""
        return len({id(v) for v in self.train.values()}) == 1


def prepare_workload(name: str, seeds: list[int], args: argparse.Namespace) -> EngineWorkload:
    """The workload of condition ``name`` for ``seeds`` (see the module doc); ``args`` gives
    ``workflows``, ``token_scale``, ``time_scale`` and ``pool_tokens``."""
    from store.workloads import generate
    from serving_hooks.replay_plan import on_replay_clock
    from simulator.scenarios import PLATFORM_MIX, ROOT
    from simulator.sources import BUILTIN, load_logs, mixed

    cap_in, cap_out = args.pool_tokens // 2, max(1, args.pool_tokens // 4)
    capped = [0]
    coding = float(getattr(args, "coding_token_scale", 1.0) or 1.0)

    def scaled(records: list[dict]) -> list[dict]:
        out, n = scale_records(coding_prompts(records, coding), args.token_scale, cap_in, cap_out)
        capped[0] += n
        return out

    def clocked(records: list[dict]) -> list[dict]:
        return on_replay_clock(scale_records(coding_prompts(records, coding), args.token_scale, cap_in, cap_out)[0],
                               args.time_scale)

    workload = CONDITIONS[name].workload
    notes: list[str] = []
    if workload == "coding-assistant":
        train = clocked(list(generate("coding_assistant", TRAIN_WORKFLOWS, seed=TRAIN_SEED)))
        replay = {s: scaled(list(generate("coding_assistant", args.workflows, seed=s))) for s in seeds}
        trains = {s: train for s in seeds}
    elif workload == "multi-agent":
        src = load_logs([multi_agent_trace()], train=0.7, seed=0)
        train = clocked(src.train)
        ids = list(dict.fromkeys(r["workflow_id"] for r in src.test))
        if len(seeds) * args.workflows > len(ids):
            notes.append(f"{len(seeds)} seeds x {args.workflows} workflows > the {len(ids)} test workflows: "
                         "the seeds' sets overlap")
        replay = {}
        for s in seeds:
            chosen = set(seed_slice(ids, s, args.workflows))
            replay[s] = scaled([r for r in src.test if r["workflow_id"] in chosen])
        trains = {s: train for s in seeds}
    elif workload == "agent-platform":
        parts = [(app, w if w in BUILTIN else str(ROOT / w), share) for app, w, share in PLATFORM_MIX]
        replay, trains = {}, {}
        for s in seeds:
            src = mixed(parts, args.workflows, seed=s)
            replay[s], trains[s] = scaled(src.test), clocked(src.train)
            notes += [f"seed {s}: {n}" for n in src.notes]
    else:                                                      # pragma: no cover - CONDITIONS
        raise ValueError(f"unknown workload {workload!r}")
    return EngineWorkload(name, replay, trains, capped[0], notes)
