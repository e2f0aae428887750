"""Which clock OpenHands timestamps were written in, and a warning when they look shifted.

OpenHands V0 events (and V1 SDK events) carry ``timestamp`` = ``datetime.now().isoformat()``:
the *local* time of the machine that ran the agent, with no offset. Read as UTC, a run made in
Beijing comes out 8 h late. V0 actions made by a model also keep the provider's response, whose
``created`` is epoch seconds (UTC) stamped when the call began; so for every such action,
``timestamp (read as UTC) - created`` is the zone offset plus a few seconds of latency. The
median of those differences, rounded to 15 minutes, is the zone the run was written in.

:func:`choose_zone` turns that into the zone to read the file in:

* ``--timezone`` given: use it; warn if the timestamps still disagree with ``created`` by 15
  minutes or more (a wrong zone);
* not given, and the file shows an offset: read in that fixed offset and warn that it did;
* not given, nothing to check against, naive timestamps: read as UTC and warn that this is an
  assumption.
"""
from __future__ import annotations

import statistics
from datetime import datetime, timedelta, timezone as dt_timezone, tzinfo
from pathlib import Path
from typing import Iterable

from store.importers._common import ErrorHandler, resolve_timezone, warn

QUARTER_HOUR_S = 900


def _naive_as_utc(text: str) -> float | None:
    """Epoch seconds of an ISO timestamp read as UTC, or None if it carries its own offset."""
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if t.tzinfo is not None:
        return None
    return t.replace(tzinfo=dt_timezone.utc).timestamp()


def shown_offset(pairs: Iterable[tuple[str, float]]) -> tuple[int | None, int]:
    """(offset in seconds rounded to 15 min, number of pairs used) from (naive timestamp,
    ``created`` epoch) pairs; offset None when no pair is usable."""
    diffs = []
    for text, created in pairs:
        try:
            t = _naive_as_utc(text)
        except ValueError:
            continue
        if t is not None:
            diffs.append(t - created)
    if not diffs:
        return None, 0
    return int(round(statistics.median(diffs) / QUARTER_HOUR_S)) * QUARTER_HOUR_S, len(diffs)


def _hhmm(seconds: int) -> str:
    sign = "+" if seconds >= 0 else "-"
    h, m = divmod(abs(seconds) // 60, 60)
    return f"UTC{sign}{h:02d}:{m:02d}"


def choose_zone(path: Path, timezone: str | None, pairs: list[tuple[str, float]], any_naive: bool,
                on_error: ErrorHandler | None) -> tzinfo:
    """The zone to read ``path``'s naive timestamps in (see the module docstring), warning as it goes."""
    offset, n = shown_offset(pairs)
    if timezone:
        tz = resolve_timezone(timezone)
        if offset is not None:
            sample = next(p for p in pairs if _naive_as_utc(p[0]) is not None)
            local = datetime.fromisoformat(sample[0])
            residual = offset - int((tz.utcoffset(local) or timedelta(0)).total_seconds())
            if abs(residual) >= QUARTER_HOUR_S:
                warn(on_error, path, f"timestamps look shifted by {residual / 3600:+.2f} h against the model "
                     f"responses' created times ({n} actions) when read in {timezone}: the run's clock was "
                     f"{_hhmm(offset)}", field="history[].timestamp")
        return tz
    if offset is not None and offset != 0:
        warn(on_error, path, f"timestamps have no offset and run {offset / 3600:+.2f} h from the model responses' "
             f"created times ({n} actions): read as local time {_hhmm(offset)} (pass --timezone to override)",
             field="history[].timestamp")
        return dt_timezone(timedelta(seconds=offset))
    if offset is None and any_naive:
        warn(on_error, path, "timestamps have no offset and nothing in the file tells the zone: read as UTC "
             "(pass --timezone with the zone of the machine that ran the agent if it was not UTC)",
             field="history[].timestamp")
    return dt_timezone.utc
