"""The prediction-service flags, generated once from :class:`serving_hooks.settings.ServiceSettings`.

``@with_service_settings`` on a Typer command adds one ``--flag`` per settings field declared a
flag (help text, default and panel from the field; the other fields are config keys and
environment variables only), plus ``--config FILE`` and ``--print-config``; the command
itself receives one ``settings`` argument, resolved as flag > ``PROFILER_*`` environment >
config file > default (:func:`serving_hooks.settings.resolve_settings`). ``profiler serve`` and
``profiler gateway`` both use it, so the two commands cannot drift apart: a field added to the
dataclass is a flag of both.

Only the flags typed on the command line count as flags (Click's parameter source); a flag left
at its default lets the environment and the file speak.
"""
from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from profiler.commands.common import fail
from serving_hooks.settings import (ENV_PREFIX, PANEL_SERVICE, ServiceSettings, SettingsError, knobs,
                                    resolve_settings, settings_toml)

HELP_CONFIG = ("TOML file of the settings in this panel and the shadow-mode panel (key: the "
               "flag's name with underscores, e.g. max_sessions = 50000). Precedence: flag > "
               f"environment ({ENV_PREFIX} + the key in capitals, e.g. {ENV_PREFIX}MAX_SESSIONS) > "
               "this file > default. See docs/commands.md, Configuration.")


def _option_parameters(cls: type) -> list[inspect.Parameter]:
    """One keyword parameter per settings field, plus --config and --print-config."""
    out = [
        inspect.Parameter("settings_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
        inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=Annotated[Optional[Path], typer.Option(
                              "--config", help=HELP_CONFIG, rich_help_panel=PANEL_SERVICE)]),
        inspect.Parameter("print_config", inspect.Parameter.KEYWORD_ONLY, default=False,
                          annotation=Annotated[bool, typer.Option(
                              "--print-config", help="Print the resolved settings as TOML, each "
                              "with its source (flag, env, file, default), and exit.",
                              rich_help_panel=PANEL_SERVICE)]),
    ]
    for k in knobs(cls):
        if not k.flag_declared:
            continue
        tp = Optional[list[str]] if k.type is tuple else Optional[k.type] if k.optional else k.type
        out.append(inspect.Parameter(
            k.name, inspect.Parameter.KEYWORD_ONLY, default=None if k.type is tuple else k.default,
            annotation=Annotated[tp, typer.Option(k.declaration, help=k.help, rich_help_panel=k.panel)]))
    return out


def with_service_settings(func: Callable[..., Any] | None = None, *,
                          cls: type = ServiceSettings) -> Any:
    """Decorate a command ``func(..., settings: ServiceSettings)`` (before ``@app.command``): its
    signature, as Typer reads it, gains the settings flags in place of ``settings``."""
    if func is None:
        return functools.partial(with_service_settings, cls=cls)
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
           for p in inspect.signature(func, eval_str=True).parameters.values() if p.name != "settings"]
    added = _option_parameters(cls)
    names = [p.name for p in added]
    clash = {p.name for p in own} & set(names)
    if clash:
        raise TypeError(f"{func.__name__} declares {sorted(clash)} itself; they come from {cls.__name__}")

    @functools.wraps(func)
    def command(**kwargs: Any) -> Any:
        ctx = kwargs.pop("settings_ctx")    # Typer passes the Click context to a Context parameter
        config, print_config = kwargs.pop("config"), kwargs.pop("print_config")
        flags = {}
        for k in (k for k in knobs(cls) if k.flag_declared):
            value = kwargs.pop(k.name)
            if k.type is tuple and value is not None:
                value = tuple(value)
            # by name: Typer >= 0.2x runs on its own vendored copy of Click (typer._click)
            if getattr(ctx.get_parameter_source(k.name), "name", None) == "COMMANDLINE":
                flags[k.name] = value
        try:
            resolved = resolve_settings(config=config, flags=flags, cls=cls)
        except SettingsError as exc:
            fail(str(exc))
        if print_config:
            sys.stdout.write(settings_toml(resolved))
            raise typer.Exit(0)
        return func(settings=resolved.settings, **kwargs)

    del command.__wrapped__          # Typer must read the signature below, not func's
    params = own + added
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command
