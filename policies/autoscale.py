"""Replica advice from the projected work of live sessions (Pythia algorithm 4).

The rule
--------
The live sessions' automaton states project how many calls each agent (or model) will
receive over the next ``H`` steps (``synth.session.WorkflowPaths.project_calls``). Each
call keeps one of a replica's ``concurrency`` batch slots busy for about its service time
``s_m`` (the agent's mean latency in the profile). Over a window of ``window_s`` seconds, to
keep utilisation at ``target_utilization``:

    busy_s_m   = calls_m · s_m
    replicas_m = ceil( busy_s_m / (window_s · concurrency_m · target_utilization) )

bounded to ``[min_replicas, max_replicas]`` (and 0 calls → ``min_replicas``). Agents that
share a model are summed first when an ``agent → model`` map is given, so the advice is per
model, which is what a cluster scales.

Worked example: 120 calls of 2 s each over a 60 s window, 8 slots per replica at 0.75
target utilisation: ``240 / (60 · 8 · 0.75) = 0.67`` → 1 replica; 600 calls → 3.33 → 4.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AutoscalePolicy:
    """Pythia alg. 4; pure arithmetic over the projections it is given.

    Parameters
    ----------
    target_utilization:
        Share of a replica's batch slots the advice aims to keep busy.
    concurrency:
        Requests one replica serves at once at the profiled latency (batch slots).
    min_replicas, max_replicas:
        Bounds of every suggestion.
    """

    target_utilization: float = 0.75
    concurrency: int = 8
    min_replicas: int = 1
    max_replicas: int = 64

    def suggest(
        self,
        projected_calls: Mapping[str, float],
        service_s: Mapping[str, float],
        window_s: float,
        current: Mapping[str, int] | None = None,
        agent_model: Mapping[str, str] | None = None,
        concurrency: Mapping[str, int] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Per model (or agent): projected calls, busy seconds, suggested replicas, delta.

        ``service_s`` is keyed by agent; an agent missing from it is counted with the mean of
        the known service times (or 1 s if none is known) and listed in ``"assumed"``.
        """
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        known = [float(v) for v in service_s.values() if v is not None and v > 0]
        fallback = sum(known) / len(known) if known else 1.0
        calls_by: dict[str, float] = {}
        busy_by: dict[str, float] = {}
        assumed: dict[str, list[str]] = {}
        for agent, calls in projected_calls.items():
            name = (agent_model or {}).get(agent, agent)
            s = service_s.get(agent)
            if s is None or s <= 0:
                s = fallback
                assumed.setdefault(name, []).append(agent)
            calls_by[name] = calls_by.get(name, 0.0) + float(calls)
            busy_by[name] = busy_by.get(name, 0.0) + float(calls) * float(s)
        out: dict[str, dict[str, Any]] = {}
        for name in sorted(calls_by):
            slots = (concurrency or {}).get(name, self.concurrency)
            need = busy_by[name] / (window_s * slots * self.target_utilization)
            replicas = math.ceil(need - 1e-9) if calls_by[name] > 0 else 0
            replicas = min(self.max_replicas, max(self.min_replicas, replicas))
            row: dict[str, Any] = {
                "projected_calls": round(calls_by[name], 4),
                "busy_s": round(busy_by[name], 4),
                "load_replicas": round(need, 4),
                "suggested_replicas": replicas,
            }
            if current is not None and name in current:
                row["current_replicas"] = int(current[name])
                row["delta"] = replicas - int(current[name])
            if name in assumed:
                row["assumed_service_s_for"] = sorted(assumed[name])
            out[name] = row
        return out


def autoscale_advice(
    profile_data: Mapping[str, Any],
    projected_calls: Mapping[str, Mapping[str, float]],
    horizon_calls: int,
    window_s: float | None = None,
    policy: AutoscalePolicy | None = None,
    current: Mapping[str, int] | None = None,
    agent_model: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """JSON body for the sidecar's ``GET /v1/autoscale``.

    ``projected_calls`` is ``{workflow_type: WorkflowPaths.project_calls(states, horizon)}``
    for the live sessions of each workflow type; service times come from
    ``profile_data["agents"][wt][agent]["mean_latency_s"]``. Agents are keyed
    ``"<wt>/<agent>"`` unless ``agent_model`` maps those keys (or bare agent ids) to models.

    ``window_s`` is the wall time the horizon spans; by default ``horizon_calls`` times the
    call-weighted mean cycle of the profiled agents (latency + the gap after the call).
    """
    pol = policy or AutoscalePolicy()
    agents_prof = profile_data.get("agents") or {}
    flat_calls: dict[str, float] = {}
    service: dict[str, float] = {}
    mapping: dict[str, str] = {}
    cycle_num = cycle_den = 0.0
    for wt, per_agent in projected_calls.items():
        for agent, calls in per_agent.items():
            key = f"{wt}/{agent}"
            flat_calls[key] = flat_calls.get(key, 0.0) + float(calls)
            prof = (agents_prof.get(wt) or {}).get(agent) or {}
            if prof.get("mean_latency_s"):
                service[key] = float(prof["mean_latency_s"])
            if agent_model:
                mapping[key] = agent_model.get(key, agent_model.get(agent, key))
    for per_agent in agents_prof.values():
        for prof in per_agent.values():
            n = float(prof.get("calls") or 0)
            cyc = float(prof.get("mean_latency_s") or 0) + float(prof.get("mean_gap_after_s") or 0)
            if n > 0 and cyc > 0:
                cycle_num += n * cyc
                cycle_den += n
    if window_s is None:
        mean_cycle = cycle_num / cycle_den if cycle_den else 1.0
        window_s = max(1e-6, horizon_calls * mean_cycle)
    rows = pol.suggest(flat_calls, service, window_s, current=current, agent_model=mapping or None)
    return {
        "horizon_calls": int(horizon_calls),
        "window_s": round(float(window_s), 4),
        "target_utilization": pol.target_utilization,
        "concurrency_per_replica": pol.concurrency,
        "models": rows,
        "total_suggested_replicas": sum(r["suggested_replicas"] for r in rows.values()),
    }


def live_projection(predictor: Any, horizon_calls: int, in_flight: bool = False
                    ) -> tuple[dict[str, dict[str, float]], int]:
    """``({workflow_type: {agent: expected calls}}, live sessions)`` of a ``predictors.Predictor``.

    Each workflow type's automaton projects the calls per agent over the next
    ``horizon_calls`` steps of every live session from its current state
    (``WorkflowPaths.project_calls``). A session's state has already stepped past the calls it
    has in flight (annotated, not yet observed); ``in_flight=True`` adds those calls too, so
    the work already queued at the engines is counted with the work still to come.
    """
    model = predictor.profile
    if model is None:
        return {}, 0
    projected: dict[str, dict[str, float]] = {}
    live = 0
    for wt, paths in model.paths.items():
        states = predictor.live_states(wt)
        live += len(states)
        calls = dict(paths.project_calls(states, horizon_calls)) if states else {}
        if in_flight:
            for agent, n in predictor.in_flight(wt).items():
                calls[agent] = calls.get(agent, 0.0) + float(n)
        if calls:
            projected[wt] = calls
    return projected, live


def live_autoscale_advice(
    predictor: Any,
    horizon_calls: int,
    window_s: float | None = None,
    policy: AutoscalePolicy | None = None,
    current: Mapping[str, int] | None = None,
    agent_model: Mapping[str, str] | None = None,
    in_flight: bool = False,
) -> dict[str, Any]:
    """Alg. 4 over a predictor's live sessions: :func:`live_projection` then
    :func:`autoscale_advice`, plus ``live_sessions`` and ``profile_version``. The sidecar's
    ``GET /v1/autoscale`` and the simulator's predictive autoscaler both call this."""
    model = predictor.profile
    if model is None:
        return {"horizon_calls": int(horizon_calls), "models": {}, "total_suggested_replicas": 0,
                "live_sessions": 0}
    projected, live = live_projection(predictor, horizon_calls, in_flight)
    advice = autoscale_advice(model.data, projected, horizon_calls, window_s=window_s,
                              policy=policy, current=current, agent_model=agent_model)
    advice["live_sessions"] = live
    advice["profile_version"] = model.version
    if in_flight:
        advice["in_flight_counted"] = True
    return advice
