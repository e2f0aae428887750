"""The prediction service a server runs: predictor + shadow gate + hot reload + metrics.

The sidecar and the gateway (with ``--profile``) both serve predictions from a profile folder the
same way; :func:`prediction_service` builds that bundle once so they cannot drift apart.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from predictors.contract import Annotation
from predictors.predictor import Predictor
from policies.priority import PriorityPolicy
from serving_hooks.metrics import DriftCollector, MemoryCollector, PredictionMetrics, prediction_metrics
from policies import AutoscalePolicy, live_autoscale_advice
from serving_hooks.profile_reload import ProfileReloader
from serving_hooks.shadow import ShadowGate

log = logging.getLogger(__name__)

#: The file in a profile root where a server records the drift alarms it raised (``profiler show``).
DRIFT_FILE = "drift.json"


def drift_alarm_lines(profile_root: str | Path, version: str | None) -> list[str]:
    """One line per workflow type whose drift alarm a server raised on profile ``version`` (the
    root's ``drift.json``; alarms raised on an older version were answered by a refit since)."""
    path = Path(profile_root) / DRIFT_FILE
    try:
        alarms = json.loads(path.read_text()).get("alarms", {}) if path.exists() else {}
    except (OSError, ValueError):
        return []
    lines = []
    for wt, a in sorted(alarms.items()):
        if a.get("profile_version") != version:
            continue
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(a.get("at_unix") or 0))
        cov, nominal = a.get("coverage"), a.get("nominal")
        lines.append(f"drift alarm {wt}: output-length coverage {cov:.3f} over the last {a.get('calls')} calls "
                     f"(nominal {nominal:.3f}) at {at}; refit with recent logs" if cov is not None and nominal
                     else f"drift alarm {wt} at {at}; refit with recent logs")
    return lines


@dataclass
class RefitStatus:
    """What the server knows about its online refits (``GET /healthz``, ``/v1/profile``)."""

    runs: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_outcome: str | None = None        # changed | unchanged | nothing_new | error
    last_at_unix: float | None = None
    last_error: str | None = None
    last_error_at_unix: float | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class PredictionService:
    predictor: Predictor
    gate: ShadowGate
    metrics: PredictionMetrics
    reloader: ProfileReloader | None = None
    profile_root: Path | None = None
    started_at: float = field(default_factory=time.time)
    refit: RefitStatus = field(default_factory=RefitStatus)
    refit_counter: Counter | None = None
    refit_failed_at: Gauge | None = None
    #: called as ``hook(workflow_type_id, status)`` when a drift alarm turns on (the refit trigger)
    drift_hooks: list[Callable[[str, dict], None]] = field(default_factory=list)
    #: the priority rule a known call's ``priority`` is computed with (None: no priority field)
    priority: PriorityPolicy | None = field(default_factory=PriorityPolicy)
    #: (profile version, :attr:`priority` bound to it): :meth:`bound_priority`'s cache
    _bound: tuple[str | None, PriorityPolicy] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.predictor.coverage_monitor.on_alarm = self.on_drift_alarm

    def on_drift_alarm(self, workflow_type_id: str, status: dict) -> None:
        """A drift alarm turned on (:class:`predictors.coverage_monitor.CoverageMonitor`): record
        it in the profile root's ``drift.json`` (what ``profiler show`` lists) and run the hooks
        (``profiler serve --logs`` / ``gateway --logs`` start a refit)."""
        root = self.profile_root
        if root is not None and (root / "CURRENT").exists():
            entry = {**{k: status.get(k) for k in ("calls", "coverage", "nominal")},
                     "profile_version": self.predictor.version, "at_unix": time.time()}
            try:
                path = root / DRIFT_FILE
                data = json.loads(path.read_text()) if path.exists() else {}
                data.setdefault("alarms", {})[workflow_type_id] = entry
                tmp = root / (DRIFT_FILE + ".tmp")
                tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
                tmp.replace(path)
            except (OSError, ValueError) as exc:
                log.warning("could not record the drift alarm in %s: %s", root, exc)
        for hook in list(self.drift_hooks):
            try:
                hook(workflow_type_id, status)
            except Exception:
                log.exception("drift alarm hook failed")

    def record_refit(self, result: Any) -> None:
        """Count and log one online refit (a :class:`serving_hooks.refit.RefitResult`); a failure
        is logged at ERROR, counted in ``<prefix>_refits_total{outcome="error"}`` and shown in
        ``/healthz`` and the profile summary until a refit succeeds."""
        st, now = self.refit, time.time()
        outcome = "error" if result.error else "changed" if result.changed else \
            "unchanged" if result.ran else "nothing_new"
        st.runs += 1
        st.last_outcome, st.last_at_unix = outcome, now
        if result.error:
            st.failures += 1
            st.consecutive_failures += 1
            st.last_error, st.last_error_at_unix = result.error, now
            log.error("online refit failed (%d in a row): %s", st.consecutive_failures, result.error)
            if self.refit_failed_at is not None:
                self.refit_failed_at.set(now)
        else:
            st.consecutive_failures = 0
        if self.refit_counter is not None:
            self.refit_counter.labels(outcome).inc()

    def start(self) -> None:
        if self.reloader is not None:
            self.reloader.start()

    def stop(self) -> None:
        if self.reloader is not None:
            self.reloader.stop()

    def reload(self) -> bool:
        """Load the version ``CURRENT`` names now, even if it is the active one."""
        if self.reloader is None:
            return False
        return self.reloader.check(force=True)

    def annotate(self, app_metadata: Any, **kwargs) -> dict:
        """The sys_annotations JSON of one call (:meth:`annotate_call` rendered)."""
        return self.annotate_call(app_metadata, **kwargs).to_dict()

    def annotate_call(self, app_metadata: Any, *, priority_inputs: Mapping[str, Any] | None = None,
                      **kwargs: Any) -> Annotation:
        """The annotation contract of one call with its priority, counted in the metrics.

        The priority of a known call is computed here, once, by :attr:`priority`
        (:meth:`PriorityPolicy.call_priority`); ``priority_inputs`` are the gateway's model-pool
        inputs (``queue_depth``, ``agent_model``) when it has pools. The predictor facade leaves
        the field empty, so ``predictors`` depends on no policy."""
        ann = self.predictor.annotate_call(app_metadata, **kwargs)
        if ann.known and self.priority is not None:
            ann = replace(ann, priority=self.bound_priority().call_priority(ann, **(priority_inputs or {})))
        self.metrics.count_annotation(ann)
        return ann

    def bound_priority(self) -> PriorityPolicy | None:
        """:attr:`priority` bound to the profile the predictor serves now
        (:meth:`PriorityPolicy.for_profile`, once per profile version): the simulator binds it alike."""
        if self.priority is None or self.priority.rank_skill_min is None:
            return self.priority
        version = self.predictor.version
        if self._bound is None or self._bound[0] != version:
            profile = self.predictor.profile
            self._bound = (version, self.priority.for_profile(getattr(profile, "data", None)))
        return self._bound[1]

    def autoscale(self, horizon: int, window_s: float | None = None,
                  policy: AutoscalePolicy | None = None) -> dict:
        """Pythia alg. 4 over the live sessions: each workflow type's automaton projects the calls
        per agent over the next ``horizon`` steps from the sessions' current states, and
        :func:`policies.autoscale_advice` turns them into replicas per model
        (:func:`policies.autoscale.live_autoscale_advice`, which the simulator's
        predictive autoscaler calls too)."""
        return live_autoscale_advice(self.predictor, horizon, window_s=window_s, policy=policy)

    def observe(self, completion: dict) -> bool | None:
        hit = self.predictor.observe(completion)
        if hit is not None:
            wt = (completion.get("app_metadata") or completion).get("workflow_type_id")
            cov = self.gate.coverage(str(wt)) if wt is not None else None
            if cov is not None:
                self.metrics.live_coverage.labels(str(wt)).set(cov)
        return hit

    def profile_summary(self) -> dict:
        """What ``GET /v1/profile`` returns: version, provenance, types, shadow state."""
        m = self.predictor.profile
        if m is None:
            return {"version": None, "loaded": False}
        agents_by_type: dict[str, list[str]] = {}
        for wt, agent in sorted(m.agents):
            agents_by_type.setdefault(wt, []).append(agent)
        manifest = getattr(m, "manifest", {}) or {}
        return {
            "version": m.version,
            "loaded": True,
            "path": str(getattr(m, "path", None) or self.profile_root or ""),
            "loaded_at_unix": self.predictor.loaded_at,
            "created_at": manifest.get("created_at"),
            "counts": manifest.get("counts"),
            "output_len_coverage": m.coverage,
            "workflow_types": {wt: {"calls": calls, "agents": agents_by_type.get(wt, []),
                                    "has_automaton": wt in m.paths,
                                    **({"automaton_error": m.path_errors[wt]} if wt in m.path_errors else {})}
                               for wt, calls in sorted(m.workflow_type_calls.items())},
            "shadow": self.gate.status(),
            "shadow_options": self.gate.options(),
            "sessions": self.predictor.session_count(),
            "last_reload_error": self.reloader.last_error if self.reloader else None,
            "refit": self.refit.as_dict(),
            "memory": self.predictor.memory_stats(),
            "drift": self.predictor.coverage_monitor.status(),
            "online": self.online_status(),
        }

    def online_status(self) -> dict[str, Any]:
        """What the server has learnt since the profile loaded: each (type, agent)'s band and
        keep-alive levels (``OnlineCalibrator.status()``; the same levels as ``/metrics``) and each
        type's remaining-work choice (``RemainingSelector.status()``) and keep-alive candidate
        (``KeepAliveSelector.status()``); None where that is off."""
        p = self.predictor
        return {"band": p.calibrator.status() if p.calibrator is not None else None,
                "keep_alive": p.keep_alive_calibrator.status() if p.keep_alive_calibrator is not None else None,
                "remaining_selection": p.remaining_selector.status() if p.remaining_selector is not None else None,
                "keep_alive_selection": (p.keep_alive_selector.status()
                                         if p.keep_alive_selector is not None else None)}


def prediction_service(profile: str | Path, registry: CollectorRegistry, prefix: str, *,
                       gate: ShadowGate | None = None, reload_every_s: float = 2.0,
                       **predictor_kwargs: Any) -> PredictionService:
    """Load ``profile`` (a profile root, or a version folder: then no hot reload) and wire it up."""
    gate = gate or ShadowGate()
    predictor = Predictor(gate=gate, **predictor_kwargs)

    def unknown_ratio() -> float:
        total = predictor.annotations_total
        return predictor.annotations_unknown / total if total else 0.0

    metrics = prediction_metrics(registry, prefix, unknown_ratio, predictor.session_count,
                                 gate.shadowed_count)
    registry.register(MemoryCollector(prefix, predictor.memory_stats, gate))
    registry.register(DriftCollector(prefix, predictor.coverage_monitor.status,
                                     lambda: predictor.calibrator.status() if predictor.calibrator else {},
                                     lambda: (predictor.keep_alive_calibrator.status()
                                              if predictor.keep_alive_calibrator else {})))
    refit_counter = Counter(f"{prefix}_refits", "Online refits by outcome (changed, unchanged, "
                            "nothing_new, error).", ["outcome"], registry=registry)
    refit_failed_at = Gauge(f"{prefix}_refit_last_failure_timestamp_seconds", "When the last "
                            "online refit failed (epoch s; 0: never).", registry=registry)

    def on_reload(outcome: str, version: str | None) -> None:
        metrics.profile_reloads.labels(outcome).inc()
        if outcome == "ok":
            metrics.set_profile(version, time.time())

    root = Path(profile)
    reloader = None
    if (root / "CURRENT").exists():
        reloader = ProfileReloader(root, predictor, interval_s=reload_every_s, on_reload=on_reload)
        reloader.check(force=True)
        if predictor.version is None:
            raise RuntimeError(f"{root}: could not load the profile CURRENT names: {reloader.last_error}")
    else:
        predictor.load(root)  # a version folder: served as is, no hot reload
        on_reload("ok", predictor.version)
    return PredictionService(predictor=predictor, gate=gate, metrics=metrics, reloader=reloader,
                             profile_root=root, refit_counter=refit_counter,
                             refit_failed_at=refit_failed_at)
