"""Autoscaling in the simulator: replicas move between model pools while the workflows run.

One **actuator** (:class:`Autoscaler`, a policy part) and two **recommenders** that tell it how
many replicas each pool should have:

* ``predictive`` (:class:`ProjectedCalls`) — Pythia's algorithm 4, the *same call* the sidecar
  serves at ``GET /v1/autoscale``: :func:`serving_hooks.policies.autoscale.live_autoscale_advice`
  over the simulation's ``predictors.Predictor`` (the live sessions' automaton states project
  the calls per agent over the next ``horizon`` steps; :class:`AutoscalePolicy` turns calls ×
  profiled service time into replicas per model pool). It sees the *phase* of the workflows:
  sessions still planning and exploring will send engineer calls next, so the ``code`` pool is
  grown before its queue does;
* ``reactive`` (:class:`QueueDepth`) — what users run: Kubernetes' Horizontal Pod Autoscaler
  rule on a queue metric (SGLang's ``num_queue_reqs`` per replica, as a Prometheus-adapter or
  KEDA metric; NVIDIA Dynamo's planner scales on queue depth thresholds too)::

      desired_p = ceil( Σ waiting_p / queue_target )        (HPA: ceil(current · metric / target))

  unchanged when ``|Σ waiting_p / (queue_target · current_p) − 1| ≤ tolerance`` (HPA's 0.1).

**The actuator** (the same for both, so the comparison is autoscaling vs autoscaling). Every
``interval_s`` (HPA's sync period, 15 s) it takes the recommendation ``r_p`` (≥ 1 per pool) and
fits it to the cap on replicas (the cluster's GPUs): when ``Σ r_p ≤ cap`` the targets are
``r_p`` (the rest of the GPUs are left free: a removal), otherwise the cap is apportioned in
proportion to the recommendation's weights (largest remainder, ≥ 1 each; the predictive weights
are alg. 4's unrounded ``load_replicas``). Then, per pool:

* **scale down** to ``max(targets of the last scale_down_window_s)`` (HPA's downscale
  stabilization: 300 s in Kubernetes, 60 s here — chosen for both recommenders on a validation
  draw, ``bench/autoscale_validation.py``; the split at start counts as a target made at
  ``t = 0``, as HPA records the current replicas when it starts): a replica still starting is cancelled first, else the active replica
  with the least work *drains* — it takes no new calls (routers no longer see it) and finishes
  every call it holds (running and queued); then its GPU is free. A pool keeps ≥ 1 active
  replica;
* **scale up** from free GPUs, largest deficit first: the replica loads the pool's model and
  serves nothing for ``startup_delay_s`` (then it joins the pool with empty KV tiers).

``startup_delay_s`` defaults to 60 s for Llama-3.1-8B, an assumption, not a measurement (its
reasoning, and how each default was chosen: docs/simulator.md, "Autoscaling").
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from serving_hooks.policies import AutoscalePolicy, live_autoscale_advice
from simulator.policy import Part
from simulator.settings import SimulateSettings as S

#: Replica states of the actuator.
FREE, STARTING, ACTIVE, DRAINING = "free", "starting", "active", "draining"
#: ``--autoscale`` modes.
MODES = ("off", "reactive", "predictive")


@dataclass
class AutoscaleOptions:
    """Settings of the actuator and its recommenders (defaults: ``profiler simulate``'s config
    keys, :class:`simulator.settings.SimulateSettings`)."""

    #: Seconds a replica loads its model before it serves (assumption; module docstring).
    startup_delay_s: float = S.startup_delay
    #: Seconds between decisions: the Kubernetes HPA sync period (15 s).
    interval_s: float = S.autoscale_interval
    #: A pool is not shrunk below its largest target of this window (HPA's downscale
    #: stabilization; HPA's default is 300 s — 60 s was better for both recommenders on the
    #: validation draw, bench/autoscale_validation.py).
    scale_down_window_s: float = S.scale_down_window
    #: Reactive: waiting calls per replica the pool is sized for (chosen on the validation draw
    #: among 1, 4, 16, 64).
    queue_target: float = S.queue_target
    #: Reactive: HPA's tolerance (no change within ±10 % of the target).
    tolerance: float = 0.1
    #: Predictive: steps each live session is projected (chosen on the validation draw among
    #: 1, 2, 3, 5, 10: the sidecar's default, 10).
    horizon_calls: int = S.autoscale_horizon
    #: Predictive: count the calls sessions have in flight (annotated, not finished) too (not
    #: chosen on the validation draw; the sidecar does not either).
    in_flight: bool = False
    #: Predictive: alg. 4's parameters (``max_replicas`` is set to the cap).
    policy: AutoscalePolicy = field(default_factory=AutoscalePolicy)


def fit_to_cap(desired: Mapping[str, int], weights: Mapping[str, float], cap: int) -> dict[str, int]:
    """``desired`` when it fits ``cap``; else ``cap`` split in proportion to ``weights``, ≥ 1
    each (Hamilton's largest remainder: floors of the quotas first, the seats left to the
    largest remainders, ties to the earlier pool)."""
    names = list(desired)
    if len(names) > cap:
        raise ValueError(f"autoscale: {len(names)} pools need at least {len(names)} replicas, cap {cap}")
    want = {n: max(1, int(desired[n])) for n in names}
    if sum(want.values()) <= cap:
        return want
    w = np.array([max(float(weights.get(n, want[n])), 0.0) for n in names])
    if w.sum() <= 0:
        w = np.ones(len(names))
    spare = cap - len(names)                 # one replica each first, the rest by weight
    quota = w / w.sum() * spare
    seats = np.floor(quota).astype(int)
    order = sorted(range(len(names)), key=lambda i: (-(quota[i] - seats[i]), i))
    for i in order[: spare - int(seats.sum())]:
        seats[i] += 1
    return {n: 1 + int(s) for n, s in zip(names, seats)}


class QueueDepth:
    """Reactive recommender: HPA's rule on waiting calls per replica (module docstring)."""

    name = "reactive"

    def __init__(self, options: AutoscaleOptions) -> None:
        self.options = options

    def recommend(self, scaler: "Autoscaler") -> tuple[dict[str, int], dict[str, float], dict]:
        sim, opt = scaler.sim, self.options
        desired: dict[str, int] = {}
        waiting: dict[str, int] = {}
        for p, name in enumerate(scaler.names):
            q = sum(len(sim.replicas[r].waiting) for r in sim.pools.replicas[p])
            cur = scaler.count(p)
            ratio = q / (opt.queue_target * max(cur, 1))
            desired[name] = cur if abs(ratio - 1.0) <= opt.tolerance else max(1, math.ceil(q / opt.queue_target - 1e-9))
            waiting[name] = q
        return desired, {n: float(v) for n, v in desired.items()}, {"waiting": waiting}


class ProjectedCalls:
    """Predictive recommender: alg. 4 over the live sessions (module docstring). Uses the
    policy's ``PredictionFeed`` predictor when it has one (ours), else one of its own."""

    name = "predictive"

    def __init__(self, options: AutoscaleOptions, predictor: Any) -> None:
        self.options = options
        self.predictor = predictor

    def advice(self, scaler: "Autoscaler") -> dict:
        """The body ``GET /v1/autoscale`` would return for the simulation's live sessions, with
        the agents mapped to their pools and the cap as ``max_replicas``."""
        opt = self.options
        sim = scaler.sim
        pol = AutoscalePolicy(target_utilization=opt.policy.target_utilization,
                              concurrency=opt.policy.concurrency,
                              min_replicas=opt.policy.min_replicas, max_replicas=scaler.cap)
        current = {n: scaler.count(p) for p, n in enumerate(scaler.names)}
        return live_autoscale_advice(self.predictor, opt.horizon_calls, policy=pol,
                                     current=current, agent_model=sim.pools.agent_pool,
                                     in_flight=opt.in_flight)

    def recommend(self, scaler: "Autoscaler") -> tuple[dict[str, int], dict[str, float], dict]:
        body = self.advice(scaler)
        rows = body["models"]
        desired, weights = {}, {}
        for name in scaler.names:
            row = rows.get(name)
            desired[name] = int(row["suggested_replicas"]) if row else 1
            weights[name] = float(row["load_replicas"]) if row else 0.0
        return desired, weights, {"projected_calls": {n: r["projected_calls"] for n, r in rows.items()},
                                  "live_sessions": body.get("live_sessions", 0)}


class Autoscaler(Part):
    """The actuator (module docstring): replica states, drains, start-ups and the log.

    ``decisions`` holds one entry per decision (time, recommendation, targets, pool sizes);
    ``timeline`` the active replicas per pool after every change."""

    def __init__(self, recommender: Any, options: AutoscaleOptions | None = None) -> None:
        self.recommender = recommender
        self.options = options or AutoscaleOptions()
        self.decisions: list[dict] = []
        self.timeline: list[tuple[float, dict[str, int]]] = []
        self.counts = {"decisions": 0, "started": 0, "drained": 0, "cancelled": 0}

    # --- state --------------------------------------------------------------------------------
    def bind(self, sim: Any) -> None:
        super().bind(sim)
        if sim.pools is None:
            raise ValueError("autoscaling needs model pools (simulator.pools)")
        self.names = list(sim.pools.names)
        self.cap = len(sim.replicas)
        self.state = {r.idx: FREE for r in sim.replicas}
        self.pool: dict[int, int] = {}
        for p, reps in enumerate(sim.pools.replicas):
            for r in reps:
                self.state[r], self.pool[r] = ACTIVE, p
        self.ready_at: dict[int, float] = {}
        self.held_since: dict[int, float] = {r: 0.0 for r, s in self.state.items() if s != FREE}
        self.held_s = 0.0
        self.startup_s = 0.0
        self.target = {n: len(sim.pools.replicas[p]) for p, n in enumerate(self.names)}
        # the split at start counts as a recommendation made now, as Kubernetes' HPA records the
        # current replicas when it starts (recordInitialRecommendation): no pool is shrunk within
        # the first window on the strength of one early look
        self.history: deque = deque([(sim.now, dict(self.target))])
        self.next_decision = self.options.interval_s
        self._note()
        sim.add_timer(self.next_decision)

    def count(self, p: int) -> int:
        """Active plus starting replicas of pool ``p`` (what HPA calls the current replicas)."""
        return sum(1 for r, s in self.state.items() if self.pool.get(r) == p and s in (ACTIVE, STARTING))

    def active(self, p: int) -> list[int]:
        return list(self.sim.pools.replicas[p])

    def sizes(self) -> dict[str, int]:
        return {n: len(self.sim.pools.replicas[p]) for p, n in enumerate(self.names)}

    def _note(self) -> None:
        self.timeline.append((round(self.sim.now, 3), self.sizes()))

    # --- events -------------------------------------------------------------------------------
    def on_timer(self) -> None:
        now = self.sim.now
        for r, t in sorted(self.ready_at.items()):
            if t <= now + 1e-9:
                del self.ready_at[r]
                self.startup_s += now - self.held_since[r]
                self.state[r] = ACTIVE
                p = self.pool[r]
                self.sim.set_pool_members(p, self.active(p) + [r])
                self._note()
        if now + 1e-9 >= self.next_decision:
            self.decide()
            if not np.isfinite(self.sim.wf_finish).all():
                self.next_decision = now + self.options.interval_s
                self.sim.add_timer(self.next_decision)

    def on_finish(self, req: Any) -> None:
        r = req.replica
        if self.state.get(r) == DRAINING:
            rep = self.sim.replicas[r]
            if not rep.running and not rep.waiting:
                self._release(r)
                self._fill()

    # --- decisions ----------------------------------------------------------------------------
    def decide(self) -> None:
        now = self.sim.now
        desired, weights, info = self.recommender.recommend(self)
        split = fit_to_cap(desired, weights, self.cap)
        self.history.append((now, split))
        while self.history and self.history[0][0] < now - self.options.scale_down_window_s - 1e-9:
            self.history.popleft()
        floor = {n: max(s[n] for _, s in self.history) for n in self.names}
        self.target = split
        self.counts["decisions"] += 1
        for p, name in enumerate(self.names):
            excess = self.count(p) - max(floor[name], 1)
            while excess > 0 and self._shed(p):
                excess -= 1
        self._fill()
        self.decisions.append({"t": round(now, 3), "desired": desired, "target": split,
                               "sizes": self.sizes(), **info})

    def _shed(self, p: int) -> bool:
        """Cancel a start-up of pool ``p``, else drain its least-loaded active replica (never
        the last one); False when neither is possible."""
        starting = [r for r, s in self.state.items() if s == STARTING and self.pool.get(r) == p]
        if starting:
            r = max(starting, key=lambda r: self.ready_at[r])      # the latest to be ready
            del self.ready_at[r]
            self.startup_s += self.sim.now - self.held_since[r]
            self.counts["cancelled"] += 1
            self._release(r)
            return True
        members = self.active(p)
        if len(members) <= 1:
            return False
        reps = self.sim.replicas
        r = min(members, key=lambda r: (len(reps[r].running) + len(reps[r].waiting),
                                        reps[r].load_tokens(), r))
        self.sim.set_pool_members(p, [m for m in members if m != r])
        self.state[r] = DRAINING
        self.counts["drained"] += 1
        self._note()
        if not reps[r].running and not reps[r].waiting:
            self._release(r)
        return True

    def _release(self, r: int) -> None:
        """Replica ``r`` gives its GPU back (drained, or its start-up cancelled)."""
        now = self.sim.now
        self.held_s += now - self.held_since.pop(r, now)
        self.state[r] = FREE
        self.pool.pop(r, None)
        self.sim.reset_replica(r)

    def _fill(self) -> None:
        """Free GPUs load the models of the pools below target, largest deficit first."""
        now = self.sim.now
        free = sorted(r for r, s in self.state.items() if s == FREE)
        while free:
            deficit = {p: self.target[n] - self.count(p) for p, n in enumerate(self.names)}
            p = max(deficit, key=lambda p: (deficit[p], -p))
            if deficit[p] <= 0:
                break
            r = free.pop(0)
            self.state[r], self.pool[r] = STARTING, p
            self.held_since[r] = now
            self.ready_at[r] = now + self.options.startup_delay_s
            self.counts["started"] += 1
            self.sim.reset_replica(r)
            self.sim.add_timer(self.ready_at[r])

    # --- report -------------------------------------------------------------------------------
    def stats(self, end: float) -> dict:
        """Counters, GPU-seconds held (starting, active or draining) up to ``end``, the GPU-seconds
        spent starting (serving nothing), and the pool sizes over time."""
        held = self.held_s + sum(max(end - t, 0.0) for t in self.held_since.values())
        return {"autoscale": self.recommender.name, **{f"autoscale_{k}": v for k, v in self.counts.items()},
                "gpu_held_s": round(held, 3), "startup_s": round(self.startup_s, 3),
                "pool_timeline": self.timeline}
