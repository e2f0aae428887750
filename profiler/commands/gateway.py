"""`profiler gateway`: OpenAI-compatible proxy that injects predictions and logs calls."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from profiler.commands.common import ProfileOption, app
from profiler.commands.common import err_console, fail
from profiler.commands.serve import build_service, refit_loop
from profiler.commands.service_options import with_service_settings
from policies.session_end import SessionEndRule
from serving_hooks.settings import GatewaySettings


@app.command(no_args_is_help=True)
@with_service_settings(cls=GatewaySettings)
def gateway(
    upstream: Annotated[Optional[list[str]], typer.Option("--upstream", "-u", help="Required: OpenAI-compatible server(s), e.g. http://127.0.0.1:30000 (SGLang). Repeat, or separate with commas, for several. Per upstream: URL,dialect=sglang|vllm|dynamo|headers[,priority=high_first|low_first] (docs/dialects.md)[,pool=MODEL] (the model it serves: calls go to the upstreams of the model they name).")] = None,
    profile: Annotated[Optional[Path], ProfileOption("Predict in process from this profile root (hot-reloaded).")] = None,
    sidecar: Annotated[Optional[str], typer.Option(help="Or ask a running `profiler serve` at this URL.")] = None,
    log_dir: Annotated[Optional[Path], typer.Option(help="Write every completed call as a gateway record to rotating JSONL files here (input for `profiler fit`/`watch`).")] = None,
    identity_map: Annotated[Optional[Path], typer.Option(help="TOML or JSON file: how agent-harness headers (Claude Code, Codex, OpenCode, Dynamo) become app_metadata — workflow type from a header, the model, or a default (docs/dialects.md).")] = None,
    *,
    settings: GatewaySettings,
) -> None:
    """Run the **annotating gateway** in front of SGLang or any OpenAI-compatible server.

    Clients point their OpenAI SDK at the gateway and tag each call:
    `client.chat.completions.create(..., extra_body={"app_metadata": {"workflow_type_id": ...,
    "workflow_id": ..., "agent_id": ...}})`. The gateway adds `sys_annotations` (and with
    `--sglang-fields`, `priority` + `custom_params`) and forwards everything else byte for byte,
    streams included. If the predictor fails or is slower than `--budget-ms`, the call goes
    upstream unannotated. Upstream errors reach the client unchanged.

    With `--log-dir` each completed call becomes a gateway record that `profiler fit` reads as
    is (tool latency = the gap to the session's next call); add `--refit-every 10m` (or run
    `profiler watch`) to keep the profile learning.

    Example: `profiler gateway --upstream http://127.0.0.1:30000 --profile profile/ --log-dir logs/ --sglang-fields`

    Engine dialects (docs/dialects.md): `--dialect vllm`, or per upstream
    `--upstream http://127.0.0.1:8000,dialect=vllm --upstream http://127.0.0.1:30000,dialect=sglang`.

    Engine API versions (docs/dialects.md): `--dynamo-api session|trajectory|agent_context` names
    the spelling of Dynamo's agent identity and end of session the upstream reads (newest:
    session); `--sglang-sessions` opens SGLang's own session per workflow and closes it at the
    workflow's end (SGLang started with `--enable-session-radix-cache`), releasing its KV.

    Multi-model workflows (docs/serving.md "Model pools"): name the model each upstream serves,
    `--upstream http://127.0.0.1:30000,pool=llama-70b --upstream http://127.0.0.1:30001,pool=qwen-coder`;
    a call goes to the upstreams of the model it names, and with `--routing capacity` a workflow
    about to reach an idle pool gets a higher priority.
    """
    import uvicorn
    from rich.markup import escape
    from prometheus_client import CollectorRegistry

    from serving_hooks.annotator import LocalAnnotator, SidecarAnnotator
    from serving_hooks.gateway import DEFAULT_FORWARD_PATHS, Gateway, GatewayOptions, create_gateway_app
    from serving_hooks.gateway_log import GatewayLog
    from serving_hooks.settings import parse_duration
    from serving_hooks.upstreams import CapacityRouting, RoundRobinRouter

    s = settings
    admin_token, host, port, routing, dialect = s.admin_token, s.host, s.port, s.routing, s.dialect
    refit_every = s.refit_every
    if not upstream:      # optional for Typer only, so that --print-config runs without one
        fail("give --upstream URL: the OpenAI-compatible server(s) the gateway forwards to")
    if (profile is None) == (sidecar is None):
        fail("give exactly one of --profile DIR (predict in process) or --sidecar URL")
    from serving_hooks.dialects import DIALECTS, parse_upstreams
    from serving_hooks.identity import IdentityMap, harness_identity_note, load_identity_map
    from serving_hooks.telemetry import CallTracer, otlp_tracer_provider
    from policies.pools import ModelPools
    from serving_hooks.upstreams import normalize_upstream

    try:
        specs = parse_upstreams(upstream)
        identity = load_identity_map(identity_map) if identity_map else IdentityMap()
        upstream_dialects = {normalize_upstream(sp.url): (sp.dialect, sp.priority_order)
                             for sp in specs}
    except ValueError as exc:
        fail(str(exc))
    if dialect is not None and dialect not in DIALECTS:
        fail(f"--dialect {dialect!r}: expected one of {', '.join(DIALECTS)}")
    try:
        session_end_rule = SessionEndRule(s.session_end_signal, s.session_end_p)
    except ValueError as exc:
        fail(str(exc))
    urls = [sp.url for sp in specs]
    pools = ModelPools({normalize_upstream(sp.url): sp.pool for sp in specs})
    try:
        router = {"round-robin": RoundRobinRouter, "capacity": CapacityRouting}[routing](urls, pools=pools)
    except KeyError:
        fail(f"--routing must be round-robin or capacity, not {routing!r}")
    except ValueError as exc:
        fail(str(exc))
    if refit_every and (profile is None or log_dir is None):
        fail("--refit-every needs --profile and --log-dir (with --sidecar, give --logs to `profiler serve`)")
    service = None
    if profile is not None:
        registry, service = build_service(profile, "profiler_gateway", settings)
        annotator = LocalAnnotator(service)
    else:
        registry = CollectorRegistry()
        annotator = SidecarAnnotator(sidecar, token=admin_token)
    try:
        writer = GatewayLog(log_dir, max_bytes=int(s.log_rotate_mb * (1 << 20)),
                            max_age_s=parse_duration(s.log_rotate_every)) if log_dir else None
    except ValueError as exc:
        fail(str(exc))
    loop = refit_loop(profile, [log_dir], refit_every, service, settings.refit_timeout) if refit_every else None
    if loop is not None:
        loop.before_refit = writer.rotate  # the refit sees every call logged so far
    options = GatewayOptions(budget_s=s.budget_ms / 1000.0, sglang_fields=s.sglang_fields,
                             strip_metadata=s.strip_metadata, stream_usage=s.stream_usage,
                             upstream_timeout_s=s.upstream_timeout, upstream_keepalive_s=s.upstream_keepalive,
                             max_request_bytes=s.max_request_bytes, body_timeout_s=s.body_timeout,
                             admin_token=admin_token,
                             forward_paths=DEFAULT_FORWARD_PATHS + s.allow_path,
                             allow_client_scheduler_fields=s.allow_client_scheduler_fields,
                             dialect=dialect, upstream_dialects=upstream_dialects,
                             identity=identity, retry_window_s=s.retry_window,
                             session_end=session_end_rule, dynamo_api=s.dynamo_api,
                             sglang_sessions=s.sglang_sessions, freeze_gc=True)
    provider = otlp_tracer_provider(s.otlp_endpoint)
    gw = Gateway(router, annotator, log_writer=writer, options=options, registry=registry,
                 service=service, tracer=CallTracer(provider) if provider is not None else None,
                 pools=pools)
    if loop is not None:
        gw.background.append(loop)
    app_ = create_gateway_app(gw)
    source = f"profile {service.predictor.version}" if service else f"sidecar {sidecar}"
    err_console.print(f"[green]gateway[/] on http://{host}:{port} → {', '.join(router.upstreams)} "
                      f"({routing}); predictions from {source}; "
                      f"{'logging to ' + str(log_dir) if log_dir else 'no call log'}")
    if service is not None and service.predictor.profile is not None:
        note = harness_identity_note(identity, service.predictor.profile.workflow_type_calls)
        if note:
            err_console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    # The upstream's Date/Server headers pass through; uvicorn must not add its own.
    uvicorn.run(app_, host=host, port=port, log_level=settings.log_level, access_log=False,
                server_header=False, date_header=False, timeout_graceful_shutdown=5)
