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

def help_config(cls: type) -> str:
    """``--config``'s help for the settings class ``cls``."""
    prefix = getattr(cls, "env_prefix", ENV_PREFIX)
    return ("TOML file of settings (key: a flag's name with underscores, or a config-only key; "
            "--print-config lists every key). Precedence: flag > environment "
            f"({prefix} + the key in capitals) > this file > default. See docs/commands.md, "
            "Configuration.")


def _option_parameters(cls: type) -> list[inspect.Parameter]:
    """One keyword parameter per settings field declared a flag, plus --config and --print-config."""
    panel = getattr(cls, "config_panel", PANEL_SERVICE)
    out = [
        inspect.Parameter("settings_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
        inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=Annotated[Optional[Path], typer.Option(
                              "--config", help=help_config(cls), rich_help_panel=panel)]),
        inspect.Parameter("print_config", inspect.Parameter.KEYWORD_ONLY, default=False,
                          annotation=Annotated[bool, typer.Option(
                              "--print-config", help="Print every setting, resolved, as TOML that "
                              "--config reads back, each with its source (flag, env, file, "
                              "default), and exit.", rich_help_panel=panel)]),
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
                          cls: type = ServiceSettings, resolved: bool = False) -> Any:
    """Decorate a command ``func(..., settings: ServiceSettings)`` (before ``@app.command``): its
    signature, as Typer reads it, gains the settings flags in place of ``settings``; with
    ``resolved=True`` ``settings`` is the :class:`~serving_hooks.settings.Resolved` (values and
    the source of each)."""
    if func is None:
        return functools.partial(with_service_settings, cls=cls, resolved=resolved)
    sig = inspect.signature(func, eval_str=True)
    wants_ctx = "ctx" in sig.parameters     # Typer hands the Click context to one parameter only
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
           for p in sig.parameters.values() if p.name not in ("settings", "ctx")]
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
            got = resolve_settings(config=config, flags=flags, cls=cls)
        except SettingsError as exc:
            fail(str(exc))
        if print_config:
            sys.stdout.write(settings_toml(got))
            raise typer.Exit(0)
        if wants_ctx:
            kwargs["ctx"] = ctx
        return func(settings=got if resolved else got.settings, **kwargs)

    del command.__wrapped__          # Typer must read the signature below, not func's
    params = own + added
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command
