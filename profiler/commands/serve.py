"""`profiler serve`: the prediction sidecar (FastAPI + uvicorn)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from profiler.commands.common import ProfileOption, app
from profiler.commands.common import err_console, fail
from profiler.commands.service_options import with_service_settings
from serving_hooks.settings import ServiceSettings

if TYPE_CHECKING:  # heavy: imported inside the commands so that `profiler --help` stays fast
    from prometheus_client import CollectorRegistry

    from serving_hooks.refit import RefitLoop
    from serving_hooks.service import PredictionService


def build_service(profile: Path, prefix: str, settings: ServiceSettings
                  ) -> "tuple[CollectorRegistry, PredictionService]":
    """Registry + PredictionService from the shared settings (serve and gateway)."""
    from prometheus_client import CollectorRegistry

    from store.profile_artifact import ProfileError
    from serving_hooks.service import prediction_service
    from serving_hooks.shadow import ShadowGate

    s = settings
    try:
        gate = ShadowGate(min_calls=s.shadow_min_calls, window=s.coverage_window,
                          min_window=s.coverage_min_window, drift_drop=s.drift_drop,
                          recover_drop=s.recover_drop, max_unknown_types=s.max_unknown_types)
        registry = CollectorRegistry()
        service = prediction_service(profile, registry, prefix, gate=gate,
                                     reload_every_s=s.reload_every_s, max_sessions=s.max_sessions,
                                     session_idle_s=s.session_idle_s,
                                     max_session_bytes=s.max_session_bytes,
                                     online_calibration=s.online_calibration,
                                     remaining_selection=s.remaining_selection,
                                     keep_alive_selection=s.keep_alive_selection)
    except (ProfileError, ValueError, RuntimeError, FileNotFoundError) as exc:
        fail(str(exc))
    return registry, service


def refit_loop(profile: Path, logs: list[Path], refit_every: str,
               service: "PredictionService", refit_timeout: str = "30m") -> "RefitLoop | None":
    """The background refit of a server (child process per refit), or None without --logs."""
    from serving_hooks.refit import RefitLoop
    from serving_hooks.settings import parse_duration

    if not logs:
        return None
    if not (profile / "CURRENT").exists():
        fail("--logs/--refit-every need --profile to be a profile root (with CURRENT), "
             "not a version folder")

    def after(result) -> None:
        service.record_refit(result)  # logged, counted in /metrics, shown in /healthz
        if result.changed:
            service.reload()  # do not wait for the next poll

    try:
        every_s = parse_duration(refit_every)
        timeout_s = parse_duration(refit_timeout)
    except ValueError as exc:
        fail(str(exc))
    loop = RefitLoop(profile_root=profile, logs=list(logs), every_s=every_s, subprocess=True,
                     on_result=after, timeout_s=timeout_s or None)
    service.drift_hooks.append(lambda wt, _status: loop.trigger(f"output-length drift alarm in {wt}"))
    return loop


@app.command(no_args_is_help=True)
@with_service_settings
def serve(
    profile: Annotated[Path, ProfileOption("Profile root (follows its CURRENT: new versions are swapped in live) or one version folder (served as is).")],
    logs: Annotated[Optional[list[Path]], typer.Option("--logs", help="Log folder(s) to refit from online (e.g. the gateway's --log-dir). Repeat for several.")] = None,
    *,
    settings: ServiceSettings,
) -> None:
    """Run the **prediction sidecar**: per-call predictions over HTTP, under a millisecond of compute.

    `POST /v1/annotate` takes a call's `app_metadata` and returns its `sys_annotations`
    (output-length band, next agents, remaining calls and seconds, tool latencies, priority);
    `POST /v1/observe` reports a finished call; `GET /v1/profile`, `GET /healthz`,
    `GET /metrics` (Prometheus) and the OpenAPI docs at `/docs` complete it.

    The profile root is polled for new versions (from `profiler fit`/`profiler watch`, or from
    the built-in refit with `--logs`), swapped in without dropping a request. New or drifting
    workflow types are served in shadow mode (`known: false`) until their live coverage holds.

    Example: `profiler serve --profile profile/ --port 8700 --logs gateway-logs/ --refit-every 10m`
    """
    import uvicorn

    from serving_hooks.sidecar import create_sidecar_app

    registry, service = build_service(profile, "profiler_sidecar", settings)
    refit_every = settings.refit_every
    if logs and refit_every is None:
        fail("--logs needs refit_every (a duration such as 10m)")
    loop = refit_loop(profile, logs or [], refit_every, service, settings.refit_timeout)
    admin_token, host, port = settings.admin_token, settings.host, settings.port
    app_ = create_sidecar_app(service, registry=registry, admin_token=admin_token,
                              max_request_bytes=settings.max_request_bytes,
                              body_timeout_s=settings.body_timeout,
                              background=[loop] if loop else [])
    err_console.print(f"[green]sidecar[/] profile {service.predictor.version} on http://{host}:{port} "
                      f"(docs: /docs; admin token {'required' if admin_token else 'not set'}"
                      f"{'; refit every ' + refit_every + ' from ' + ', '.join(map(str, logs)) if loop else ''})")
    uvicorn.run(app_, host=host, port=port, log_level=settings.log_level, access_log=False,
                timeout_graceful_shutdown=5)
