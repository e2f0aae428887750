"""Fault-injection points for crash-safety tests.

Every statement the ingester sends to the store and every file write of a profile version first
calls :func:`point` with a short label. In production :data:`hook` is ``None`` and a point costs one
attribute read. A test sets the hook to simulate a crash or a full disk at the *n*-th point::

    from store import faults
    faults.hook = lambda label: os._exit(137)          # kill -9 at this point
    faults.hook = lambda label: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left"))

(tests/test_store_crash_safety.py does this at every point of an incremental fit).
"""
from __future__ import annotations

from typing import Callable, Optional

#: Called with the point's label before every store statement and profile file write; None = off.
hook: Optional[Callable[[str], None]] = None


def point(label: str) -> None:
    """A place where a crash or a full disk may strike: run :data:`hook` if one is set."""
    if hook is not None:
        hook(label)
