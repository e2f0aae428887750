"""One declaration per knob: the settings of ``profiler serve`` and ``profiler gateway`` (and the
mechanism every other settings class uses).

Both commands host the same :class:`~serving_hooks.service.PredictionService` (profile reload,
session table, shadow gate, refit child) behind an HTTP server, so the knobs of that service are
declared here once, as the fields of :class:`ServiceSettings`, and each command's flags are
generated from the fields (``profiler/commands/service_options.py``): a knob added here shows in
both ``--help`` pages, with one help text and one default.

A value can come from four places; the first that sets it wins::

    --flag  >  environment variable PROFILER_<NAME>  >  --config FILE (TOML key <name>)  >  default

:func:`resolve_settings` applies that order. It is pure (the environment is an argument), so a
test or a library user gets exactly what the command line gets. Bad input is one line naming
where it came from: ``serve.toml: unknown key 'max_sesions' (did you mean 'max_sessions'?)``,
``PROFILER_MAX_SESSIONS='lots': expected an integer``.

The environment prefix is ``PROFILER_`` because the one service variable that existed before,
``PROFILER_ADMIN_TOKEN``, already had it: it is now simply the ``admin_token`` setting's variable.

The mechanism (:func:`setting_field`, :func:`knobs`, :func:`resolve_settings`,
:func:`settings_toml`) serves every settings class of the project: the prefix is the class's
``env_prefix`` (``PROFILER_FIT_``, ``PROFILER_SIMULATE_``, ``PROFILER_REPLAY_``, and ``AWP_`` for
the SGLang plugin's variables, ``serving_hooks/sglang_plugin/settings.py``), and a field declared
``flag=False`` is a config key and variable only. docs/commands.md, Configuration, lists them.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional

from policies.session_end import DEFAULT_SESSION_END_P

#: Every service setting can be set from ``ENV_PREFIX + NAME.upper()``.
ENV_PREFIX = "PROFILER_"

#: Help panels the fields are grouped in (the shadow-mode knobs keep their own panel).
PANEL_SERVICE = "Prediction service (also --config keys, PROFILER_* env)"
PANEL_SHADOW = "Shadow mode (also --config keys, PROFILER_* env)"
PANEL_ENGINE = "Engine APIs (gateway; also --config keys, PROFILER_* env)"
PANEL_GATEWAY = "Gateway (also --config keys, PROFILER_* env)"

#: Spellings of Dynamo's agent identity (``serving_hooks.dialects.DYNAMO_APIS``, newest first).
DYNAMO_API_CHOICES = ("session", "trajectory", "agent_context")

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str | float | int) -> float:
    """Seconds in ``"10m"``, ``"90s"``, ``"1.5h"``, ``"250ms"`` or a bare number of seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    s = text.strip().lower()
    for unit in sorted(_DURATION_UNITS, key=len, reverse=True):
        if s.endswith(unit):
            number = s[: -len(unit)].strip()
            break
    else:
        unit, number = "s", s
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (examples: 30s, 10m, 1h, 250ms)") from None
    if value < 0:
        raise ValueError(f"duration must not be negative: {text!r}")
    return value * _DURATION_UNITS[unit]


class SettingsError(ValueError):
    """A setting that cannot be used; the message is one line naming its source and key."""


def setting_field(default: Any, help: str, *, panel: str = PANEL_SERVICE, duration: bool = False,
                  flag: bool = True, env: str | None = None, choices: tuple[str, ...] = ()) -> Any:
    """A settings field: its default plus what the flag's ``--help`` says and where (``panel``);
    ``duration``: a text like ``"30s"``, checked by :func:`parse_duration`; ``flag=False``: a
    rarely used tuning knob, a config key and environment variable only (no ``--flag``; still
    printed by ``--print-config``); ``env``: the variable's name when it is not the class's
    ``env_prefix`` + NAME (names users already set); ``choices``: the values a text may take."""
    return field(default=default, metadata={"help": help, "panel": panel, "duration": duration,
                                            "flag": flag, "env": env, "choices": tuple(choices)})


def check_settings(obj: Any) -> None:
    """Check a settings object's durations and choices (its ``__post_init__`` calls this)."""
    for k in knobs(type(obj)):
        _check_value(k, getattr(obj, k.name), k.name, sep=": ")


# Knobs both commands have with a default of each: the gateway's subclass redeclares the default.
HELP_PORT = "TCP port (serve: 8700, gateway: 8080)."
HELP_MAX_REQUEST = "Largest request body accepted, MiB (413 beyond; serve: 1, gateway: 32)."
HELP_REFIT_EVERY = ("How often to refit the profile from the logs (serve: with --logs, default 10m; "
                    "gateway: with --profile and --log-dir, unset = never), e.g. 10m.")


@dataclass(frozen=True)
class ServiceSettings:
    """What ``profiler serve`` and ``profiler gateway`` share: the prediction service's knobs and
    the server's own (interface, admin token, body timeout, log level).

    Durations are kept as written (``"2s"``, ``"1h"``) and checked when the object is made; the
    ``*_s`` properties give them in seconds."""

    #: environment variables are ``env_prefix`` + the field's name in capitals
    env_prefix: ClassVar[str] = ENV_PREFIX

    host: str = setting_field(
        "127.0.0.1", "Interface to listen on (0.0.0.0 for all).")
    port: int = setting_field(8700, HELP_PORT)
    admin_token: Optional[str] = setting_field(
        None, "Bearer token of the admin and data endpoints (sidecar: /v1/observe, /v1/reload, "
              "/v1/profile, /v1/sessions, /v1/autoscale; gateway: /admin/*, also sent to a --sidecar); "
              "unset = open.")
    reload_every: str = setting_field(
        "2s", "How often to check the profile's CURRENT for a new version.", duration=True,
        flag=False)
    max_sessions: int = setting_field(
        100_000, "Sessions kept in memory (least recently used beyond it are forgotten).")
    max_session_mb: float = setting_field(
        512.0, "Byte budget of the session table (estimated); beyond it the oldest kept responses, "
               "then the least recently used sessions, are dropped.", flag=False)
    max_unknown_types: int = setting_field(
        1000, "Workflow types absent from the profile remembered for shadow mode (LRU).", flag=False)
    session_idle: str = setting_field(
        "1h", "Forget a session after this long without a call.", duration=True, flag=False)
    refit_every: Optional[str] = setting_field("10m", HELP_REFIT_EVERY, duration=True)
    refit_timeout: str = setting_field(
        "30m", "Kill a refit child (serve --logs, gateway --refit-every) that runs longer than this "
               "(0 = no limit).", duration=True, flag=False)
    body_timeout: float = setting_field(
        30.0, "Seconds a request body may take to arrive (408 beyond): slow clients cannot hold the "
              "server.", flag=False)
    max_request_mb: float = setting_field(1.0, HELP_MAX_REQUEST, flag=False)
    log_level: str = setting_field("info", "uvicorn log level.")
    online_calibration: bool = setting_field(
        True, "Adapt each (workflow type, agent)'s served output-length band and keep-alive TTL "
              "from the outcomes observed (adaptive conformal; predictors/online_calibration.py). "
              "Off: the fitted band and TTL are served as is, whatever is fed back.")
    remaining_selection: bool = setting_field(
        True, "Follow drift of the remaining-work order: per workflow type, serve the candidate "
              "(the fitted table, the position median, mrl) that ranked the sessions that ended "
              "recently better than the served one beyond noise (a session ends at a call with "
              "app_metadata.last_call, or idle expiry; predictors/online_selection.py). Off: the "
              "fit's figure.")
    keep_alive_selection: bool = setting_field(
        False, "Serve, per workflow type, the keep-alive TTL candidate ahead of the fitted one on "
               "the idle gaps seen (covers more at no more KV-seconds per covered gap, or holds "
               "less at nominal coverage): the plain per-type p95, the tool's p95 or a TTL that "
               "gives up on gaps past the 120 s cap (predictors/keep_alive_selection.py); the "
               "evidence starts from the fit's forward replay of the training side, stored in the "
               "profile. Off: the fitted TTL (calibrated online).", flag=False)
    shadow_min_calls: int = setting_field(
        100, "Calls a workflow type needs in the profile before it can leave shadow mode.",
        panel=PANEL_SHADOW, flag=False)
    coverage_window: int = setting_field(
        200, "Observed calls per workflow type in the live-coverage window.", panel=PANEL_SHADOW, flag=False)
    coverage_min_window: int = setting_field(
        50, "Fewest observed calls before live coverage is judged.", panel=PANEL_SHADOW, flag=False)
    drift_drop: float = setting_field(
        0.10, "Shadow a type when live coverage < nominal - this (drift).", panel=PANEL_SHADOW, flag=False)
    recover_drop: float = setting_field(
        0.05, "Promote a shadowed type when live coverage >= nominal - this.", panel=PANEL_SHADOW, flag=False)

    def __post_init__(self) -> None:
        check_settings(self)

    @property
    def reload_every_s(self) -> float:
        return parse_duration(self.reload_every)

    @property
    def session_idle_s(self) -> float:
        return parse_duration(self.session_idle)

    @property
    def refit_timeout_s(self) -> float:
        return parse_duration(self.refit_timeout)

    @property
    def max_session_bytes(self) -> int:
        return int(self.max_session_mb * (1 << 20))

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * (1 << 20))


@dataclass(frozen=True)
class GatewaySettings(ServiceSettings):
    """``profiler gateway``'s settings: the service's, plus how the gateway talks to its upstreams
    and which version of each engine's agent API they speak (docs/dialects.md). The one place each
    gateway knob and its default is written: ``GatewayOptions`` (serving_hooks/gateway.py) takes
    its defaults from here."""

    port: int = setting_field(8080, HELP_PORT)
    max_request_mb: float = setting_field(32.0, HELP_MAX_REQUEST, flag=False)
    budget_ms: float = setting_field(
        5.0, "Time budget for one annotation, ms; beyond it (or on error) the request goes "
             "upstream unannotated.", panel=PANEL_GATEWAY)
    routing: str = setting_field(
        "round-robin", "round-robin, or capacity (Pythia alg. 2 over each upstream's /v1/loads; "
                       "round robin while they do not report).", panel=PANEL_GATEWAY,
        choices=("round-robin", "capacity"))
    refit_every: Optional[str] = setting_field(None, HELP_REFIT_EVERY, duration=True)
    upstream_timeout: float = setting_field(
        600.0, "Seconds without a byte from the upstream before the call fails with 504.",
        panel=PANEL_GATEWAY, flag=False)
    upstream_keepalive: float = setting_field(
        4.0, "Seconds a pooled upstream connection may sit idle before the gateway drops it; keep "
             "it below the engine's own idle limit (SGLang/uvicorn: 5 s), so the engine never "
             "closes a connection the gateway is about to reuse. 0: a new connection per call.",
        panel=PANEL_GATEWAY, flag=False)
    log_rotate_mb: float = setting_field(
        64.0, "Start a new call-log file beyond this size, MiB.", panel=PANEL_GATEWAY, flag=False)
    log_rotate_every: str = setting_field(
        "5m", "Close the open call-log file after this long (bounds how stale a refit's data is).",
        panel=PANEL_GATEWAY, duration=True, flag=False)
    retry_window: float = setting_field(
        60.0, "Seconds within which an identical body (or Idempotency-Key) of the same session is "
              "a retry, not a new call.", panel=PANEL_GATEWAY, flag=False)
    otlp_endpoint: Optional[str] = setting_field(
        None, "Send one OpenTelemetry span per call (GenAI attributes + agentprof.* predictions and "
              "outcomes) to this OTLP/HTTP endpoint, e.g. http://127.0.0.1:4318.",
        panel=PANEL_GATEWAY, env="OTEL_EXPORTER_OTLP_ENDPOINT")
    sglang_fields: bool = setting_field(
        False, "Also set SGLang's `priority` and flat `custom_params` (SGLang needs "
               "--enable-priority-scheduling for priority).", panel=PANEL_ENGINE)
    dialect: Optional[str] = setting_field(
        None, "Render the hints for this engine on every upstream without its own dialect=: sglang "
              "(priority + custom_params), vllm (priority + vllm_xargs), dynamo (nvext.agent_hints + "
              "Dynamo's identity and final flag, spelled as --dynamo-api says), headers "
              "(X-Agentprof-* for routers). docs/dialects.md.", panel=PANEL_ENGINE)
    session_end_p: float = setting_field(
        DEFAULT_SESSION_END_P, "Announce a call as its session's last (SGLang "
        "custom_params.session_end, vLLM vllm_xargs, Dynamo X-Dynamo-Session-Final, "
        "X-Agentprof-Session-End) when its predicted p_end reaches this, or when "
        "app_metadata.last_call is true; the SGLang plugin then releases the session's KV "
        "(docs/dialects.md, End of session).", panel=PANEL_ENGINE)
    session_end_signal: bool = setting_field(
        True, "Send the end-of-session signal at all (see session_end_p).", panel=PANEL_ENGINE,
        flag=False)
    strip_metadata: bool = setting_field(
        False, "Remove app_metadata and add no sys_annotations (for upstreams that reject unknown "
               "fields; use with --sglang-fields).", panel=PANEL_ENGINE, flag=False)
    stream_usage: bool = setting_field(
        True, "Ask streams for token usage (hidden from the client) so they can be logged.",
        panel=PANEL_ENGINE, flag=False)
    allow_path: tuple[str, ...] = setting_field(
        (), "Also forward these paths upstream (fnmatch patterns, e.g. ['/v1/rerank']). Engine "
            "admin paths are never forwarded.", panel=PANEL_ENGINE, flag=False)
    allow_client_scheduler_fields: bool = setting_field(
        False, "Keep a client's own scheduler fields in every dialect: `priority`, `custom_params`, "
               "`vllm_xargs`, `nvext.agent_hints`/`cache_control`, `X-Agentprof-*` headers "
               "(removed by default).", panel=PANEL_ENGINE, flag=False)
    dynamo_api: str = setting_field(
        "session", "Spelling of agent identity and end of session the dynamo dialect sends: "
                   "session (X-Dynamo-Session-ID / -Parent-Session-ID / -Session-Final headers; "
                   "Dynamo since PR #10896), trajectory (x-dynamo-trajectory-* headers; PR #10214 "
                   "to #10896), agent_context (nvext.agent_context + nvext.session_control; Dynamo "
                   "v1.2 and before). Identity is read in every spelling whatever this says.",
        panel=PANEL_ENGINE, choices=DYNAMO_API_CHOICES)
    sglang_sessions: bool = setting_field(
        False, "The SGLang upstreams run --enable-session-radix-cache: open an SGLang session per "
               "workflow (POST /open_session), tag each of its calls with session_id, and close it "
               "(POST /close_session, its KV released) after the call that ends the workflow "
               "(app_metadata.last_call, or p_end >= --session-end-p).", panel=PANEL_ENGINE)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("budget_ms", "upstream_timeout", "upstream_keepalive", "log_rotate_mb",
                     "retry_window", "max_request_mb"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name}: must not be negative, got {getattr(self, name)!r}")
        if not 0.0 <= self.session_end_p <= 1.0:
            raise SettingsError(f"session_end_p: {self.session_end_p!r} is not within [0, 1]")


#: How ``profiler replay`` sends a workflow's identity (``serving_hooks.replay``).
REPLAY_IDENTITY_MODES = ("app_metadata", "headers", "both", "none")
PANEL_REPLAY = "What is sent (--config keys, PROFILER_REPLAY_* env; --print-config)"


@dataclass(frozen=True)
class ReplaySettings:
    """``profiler replay``'s config keys: what each request carries besides the recorded call
    (its flags, the load shape, are the command's own). ``ReplayOptions`` takes its defaults
    from here."""

    env_prefix: ClassVar[str] = "PROFILER_REPLAY_"
    config_panel: ClassVar[str] = PANEL_REPLAY

    ignore_eos: bool = setting_field(
        True, "Send ignore_eos so the engine generates the recorded output length (SGLang, vLLM); "
              "false for servers that reject unknown fields.", panel=PANEL_REPLAY, flag=False)
    identity: str = setting_field(
        "app_metadata", "How the workflow identity is sent: app_metadata (body, read by `profiler "
        "gateway`), headers (x-workflow-type-id, x-workflow-id, x-agent-id), both, none.",
        panel=PANEL_REPLAY, flag=False, choices=REPLAY_IDENTITY_MODES)
    extra_body: Optional[str] = setting_field(
        None, 'JSON object merged into every request body, e.g. \'{"priority": 0}\'.',
        panel=PANEL_REPLAY, flag=False)
    headers: tuple[str, ...] = setting_field(
        (), "Extra headers, each 'Name: value'.", panel=PANEL_REPLAY, flag=False)
    run_tag: Optional[str] = setting_field(
        None, "Suffix appended to workflow and request ids so runs do not collide in the target's "
              "session state (unset: random; '' keeps the recorded ids).", panel=PANEL_REPLAY, flag=False)
    timeout: float = setting_field(600.0, "Seconds one call may take.", panel=PANEL_REPLAY, flag=False)
    progress: bool = setting_field(True, "Progress bar on stderr.", panel=PANEL_REPLAY, flag=False)

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True)
class Knob:
    """One field of a settings class as the command line, the file and the environment see it."""

    name: str        #: the field, the TOML key
    type: type       #: str, int, float, bool or tuple (of str) (``Optional[X]``: X, and None allowed)
    optional: bool
    default: Any
    help: str
    panel: str
    duration: bool = False
    env: str = ""    #: the environment variable
    flag_declared: bool = True   #: a ``--flag`` of the command (else config key / env only)
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def declaration(self) -> str:
        """What the command line declares: ``--flag``, or ``--flag/--no-flag`` for a bool (a
        bool that defaults to True must be possible to turn off)."""
        return f"{self.flag}/--no-{self.flag[2:]}" if self.type is bool else self.flag


def knobs(cls: type = ServiceSettings) -> tuple[Knob, ...]:
    """The fields of a settings dataclass ``cls`` (any dataclass of :func:`setting_field`
    fields; its ``env_prefix`` class attribute names the variables, ``PROFILER_`` by default)."""
    hints = typing.get_type_hints(cls)
    prefix = getattr(cls, "env_prefix", ENV_PREFIX)
    out = []
    for f in dataclasses.fields(cls):
        tp, optional = hints[f.name], False
        args = typing.get_args(tp)
        if type(None) in args:
            tp, optional = next(a for a in args if a is not type(None)), True
        if typing.get_origin(tp) is tuple:
            tp = tuple
        meta = f.metadata
        out.append(Knob(f.name, tp, optional, f.default, meta.get("help", ""),
                        meta.get("panel", PANEL_SERVICE), meta.get("duration", False),
                        meta.get("env") or prefix + f.name.upper(), meta.get("flag", True),
                        meta.get("choices", ())))
    return tuple(out)


_TYPE_WORD = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
              tuple: "a list of strings"}


def _check_typed(k: Knob, value: Any, where: str) -> Any:
    """A TOML value for ``k``: TOML is typed, so only the type is checked (an int is a float)."""
    if k.type is tuple:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        value = tuple(value) if ok else value
    else:
        ok = (isinstance(value, k.type) and not (k.type is int and isinstance(value, bool))) or \
            (k.type is float and isinstance(value, int) and not isinstance(value, bool))
    if not ok:
        raise SettingsError(f"{where}: key {k.name!r} must be {_TYPE_WORD.get(k.type, k.type.__name__)}, "
                            f"got {value!r} ({type(value).__name__})")
    _check_value(k, value, f"{where}: key {k.name!r}")
    return float(value) if k.type is float else value


def _check_value(k: Knob, value: Any, where: str, sep: str = "=") -> None:
    """A knob's value is a duration it can parse and one of its choices; the error names
    ``where`` (a key, flag or variable) and the value after ``sep``."""
    if k.duration and value is not None:
        try:
            parse_duration(value)
        except ValueError as exc:
            raise SettingsError(f"{where}: {exc}") from None
    if k.choices and value is not None and value not in k.choices:
        raise SettingsError(f"{where}{sep}{value!r}: expected one of {', '.join(k.choices)}")


def _parse_text(k: Knob, raw: str, where: str) -> Any:
    """An environment string for ``k``, parsed to its type (a list: comma-separated; an optional
    number: ``off`` is None)."""
    try:
        if k.optional and k.type in (int, float) and raw.strip().lower() == "off":
            return None
        if k.type is tuple:
            return tuple(v.strip() for v in raw.split(",") if v.strip())
        if k.type is bool:
            low = raw.strip().lower()
            if low not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError
            return low in ("1", "true", "yes", "on")
        value = k.type(raw.strip()) if k.type is not str else raw
    except ValueError:
        raise SettingsError(f"{where}={raw!r}: expected {_TYPE_WORD.get(k.type, k.type.__name__)}") from None
    _check_value(k, value, where)
    return value


def read_config(path: str | Path, cls: type = ServiceSettings) -> dict[str, Any]:
    """The settings a TOML file sets (only those), type-checked; one-line errors name the file."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SettingsError(f"{p}: no such config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{p}: cannot read config file: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{p}: not valid TOML: {exc}") from None
    by_name = {k.name: k for k in knobs(cls)}
    out = {}
    for key, value in data.items():
        k = by_name.get(key)
        if k is None:
            near = difflib.get_close_matches(key, by_name, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(by_name)})"
            raise SettingsError(f"{p}: unknown key {key!r}{hint}")
        out[key] = _check_typed(k, value, str(p))
    return out


def settings_from_env(environ: Mapping[str, str], cls: type = ServiceSettings) -> dict[str, Any]:
    """The settings ``environ`` sets through their variables (``PROFILER_<NAME>`` for the
    service's; an empty value is unset)."""
    return {k.name: _parse_text(k, environ[k.env], k.env)
            for k in knobs(cls) if environ.get(k.env, "") != ""}


@dataclass(frozen=True)
class Resolved:
    """Settings plus where each value came from (``flag``, ``env``, ``file`` or ``default``)."""

    settings: Any
    sources: Mapping[str, str]


def resolve_settings(*, config: str | Path | None = None, environ: Mapping[str, str] | None = None,
                     flags: Mapping[str, Any] | None = None, cls: type = ServiceSettings) -> Resolved:
    """``cls`` from the defaults, then ``config`` (TOML), then ``environ`` (``os.environ`` when
    None), then ``flags`` (only the flags the user gave): the later layer wins per key."""
    by_name = {k.name: k for k in knobs(cls)}
    given = dict(flags or {})
    for key, value in given.items():
        if key not in by_name:
            raise SettingsError(f"unknown setting {key!r} (known: {', '.join(by_name)})")
        _check_value(by_name[key], value, by_name[key].flag)
    layers = [("file", read_config(config, cls) if config is not None else {}),
              ("env", settings_from_env(os.environ if environ is None else environ, cls)),
              ("flag", given)]
    values: dict[str, Any] = {}
    sources = {name: "default" for name in by_name}
    for source, layer in layers:
        for key, value in layer.items():
            values[key] = value
            sources[key] = source
    return Resolved(cls(**values), sources)


def settings_toml(resolved: Resolved) -> str:
    """``resolved`` as a TOML file a ``--config`` reads back, each line commented with its source
    (the admin token is never printed, only whether it is set)."""
    prefix = getattr(type(resolved.settings), "env_prefix", ENV_PREFIX)
    lines = [f"# resolved settings: --flag > {prefix}* environment > --config file > default"]
    for k in knobs(type(resolved.settings)):
        value, source = getattr(resolved.settings, k.name), resolved.sources[k.name]
        if k.name == "admin_token":
            lines.append(f"# admin_token = {'(set)' if value else '(unset)'}  # {source}")
        elif value is None:
            lines.append(f"# {k.name} unset  # {source}")
        else:
            text = (("true" if value else "false") if isinstance(value, bool) else
                    json.dumps(list(value)) if isinstance(value, tuple) else
                    json.dumps(value) if isinstance(value, str) else repr(value))
            lines.append(f"{k.name} = {text}  # {source}")
    return "\n".join(lines) + "\n"
