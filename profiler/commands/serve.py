"""`profiler serve`: the prediction sidecar (FastAPI + uvicorn)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from profiler.commands.common import app
from profiler.commands.common import err_console, fail

if TYPE_CHECKING:  # heavy: imported inside the commands so that `profiler --help` stays fast
    from prometheus_client import CollectorRegistry

    from serving_hooks.refit import RefitLoop
    from serving_hooks.service import PredictionService

HELP_SHADOW = "Shadow mode"


def build_service(profile: Path, prefix: str, *, reload_every: str, max_sessions: int,
                  session_idle: str, shadow_min_calls: int, coverage_window: int,
                  coverage_min_window: int, drift_drop: float, recover_drop: float,
                  max_session_mb: float = 512.0, max_unknown_types: int = 1000
                  ) -> "tuple[CollectorRegistry, PredictionService]":
    """Registry + PredictionService from command-line values (shared by serve and gateway)."""
    from prometheus_client import CollectorRegistry

    from profiler.profile_artifact import ProfileError
    from serving_hooks.refit import parse_duration
    from serving_hooks.service import prediction_service
    from serving_hooks.shadow import ShadowGate

    try:
        gate = ShadowGate(min_calls=shadow_min_calls, window=coverage_window,
                          min_window=coverage_min_window, drift_drop=drift_drop,
                          recover_drop=recover_drop, max_unknown_types=max_unknown_types)
        registry = CollectorRegistry()
        service = prediction_service(profile, registry, prefix, gate=gate,
                                     reload_every_s=parse_duration(reload_every),
                                     max_sessions=max_sessions,
                                     session_idle_s=parse_duration(session_idle),
                                     max_session_bytes=int(max_session_mb * (1 << 20)))
    except (ProfileError, ValueError, RuntimeError, FileNotFoundError) as exc:
        fail(str(exc))
    return registry, service


def refit_loop(profile: Path, logs: list[Path], refit_every: str,
               service: "PredictionService", refit_timeout: str = "30m") -> "RefitLoop | None":
    """The background refit of a server (child process per refit), or None without --logs."""
    from serving_hooks.refit import RefitLoop, parse_duration

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
def serve(
    profile: Annotated[Path, typer.Option("--profile", "-p", help="Profile root (follows its CURRENT: new versions are swapped in live) or one version folder (served as is).")],
    host: Annotated[str, typer.Option(help="Interface to listen on (0.0.0.0 for all).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8700,
    logs: Annotated[Optional[list[Path]], typer.Option("--logs", help="Log folder(s) to refit from online (e.g. the gateway's --log-dir). Repeat for several.")] = None,
    refit_every: Annotated[str, typer.Option(help="With --logs: how often to ingest new logs and refit (30s, 10m, 1h).")] = "10m",
    reload_every: Annotated[str, typer.Option(help="How often to check the profile's CURRENT for a new version.")] = "2s",
    admin_token: Annotated[Optional[str], typer.Option(envvar="PROFILER_ADMIN_TOKEN", help="Bearer token required by /v1/observe, /v1/reload, /v1/profile and /v1/sessions (default: env PROFILER_ADMIN_TOKEN; unset = open).")] = None,
    max_sessions: Annotated[int, typer.Option(help="Sessions kept in memory (least recently used beyond it are forgotten).")] = 100_000,
    max_session_mb: Annotated[float, typer.Option(help="Byte budget of the session table (estimated); beyond it the oldest kept responses, then the least recently used sessions, are dropped.")] = 512.0,
    max_unknown_types: Annotated[int, typer.Option(help="Workflow types absent from the profile remembered for shadow mode (LRU).")] = 1000,
    refit_timeout: Annotated[str, typer.Option(help="With --logs: kill a refit child that runs longer than this (0 = no limit).")] = "30m",
    session_idle: Annotated[str, typer.Option(help="Forget a session after this long without a call.")] = "1h",
    max_request_bytes: Annotated[int, typer.Option(help="Largest request body accepted (413 beyond).")] = 1 << 20,
    body_timeout: Annotated[float, typer.Option(help="Seconds a request body may take to arrive (408 beyond): slow clients cannot hold the server.")] = 30.0,
    shadow_min_calls: Annotated[int, typer.Option(help="Calls a workflow type needs in the profile before it can leave shadow mode.", rich_help_panel=HELP_SHADOW)] = 100,
    coverage_window: Annotated[int, typer.Option(help="Observed calls per workflow type in the live-coverage window.", rich_help_panel=HELP_SHADOW)] = 200,
    coverage_min_window: Annotated[int, typer.Option(help="Fewest observed calls before live coverage is judged.", rich_help_panel=HELP_SHADOW)] = 50,
    drift_drop: Annotated[float, typer.Option(help="Shadow a type when live coverage < nominal - this (drift).", rich_help_panel=HELP_SHADOW)] = 0.10,
    recover_drop: Annotated[float, typer.Option(help="Promote a shadowed type when live coverage >= nominal - this.", rich_help_panel=HELP_SHADOW)] = 0.05,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
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

    registry, service = build_service(
        profile, "profiler_sidecar", reload_every=reload_every, max_sessions=max_sessions,
        session_idle=session_idle, shadow_min_calls=shadow_min_calls,
        coverage_window=coverage_window, coverage_min_window=coverage_min_window,
        drift_drop=drift_drop, recover_drop=recover_drop, max_session_mb=max_session_mb,
        max_unknown_types=max_unknown_types)
    loop = refit_loop(profile, logs or [], refit_every, service, refit_timeout)
    app_ = create_sidecar_app(service, registry=registry, admin_token=admin_token,
                              max_request_bytes=max_request_bytes, body_timeout_s=body_timeout,
                              background=[loop] if loop else [])
    err_console.print(f"[green]sidecar[/] profile {service.predictor.version} on http://{host}:{port} "
                      f"(docs: /docs; admin token {'required' if admin_token else 'not set'}"
                      f"{'; refit every ' + refit_every + ' from ' + ', '.join(map(str, logs)) if loop else ''})")
    uvicorn.run(app_, host=host, port=port, log_level=log_level, access_log=False,
                timeout_graceful_shutdown=5)
