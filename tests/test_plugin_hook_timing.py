"""The plugin times each hook it installs (``hook_us_<hook>`` in its counters line), so the bench
can say what the plugin costs the scheduler's loop. Runs without SGLang: ``timed`` is plain Python."""
from __future__ import annotations

import time

import pytest

from serving_hooks.sglang_plugin import HOOKS, timed
from serving_hooks.sglang_plugin.observe import counters_line
from serving_hooks.sglang_plugin.state import get_state


def test_timed_hook_adds_its_time_and_passes_results_and_errors_through() -> None:
    counters = get_state().counters
    before = counters["hook_us_slow_hook"]

    def slow_hook(x: int, *, y: int = 0) -> int:
        """a hook"""
        time.sleep(0.02)
        return x + y

    hook = timed("slow_hook", slow_hook)
    assert hook(1, y=2) == 3 and hook.__wrapped__ is slow_hook and hook.__doc__ == "a hook"
    assert counters["hook_us_slow_hook"] - before >= 20_000           # at least the 20 ms slept

    def failing() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        timed("failing", failing)()
    assert counters["hook_us_failing"] >= 0 and "hook_us_failing" in counters
    assert "hook_us_slow_hook=" in counters_line(dict(counters))


def test_every_installed_hook_has_its_own_counter_name() -> None:
    names = [h.function for h in HOOKS]
    # the two _split_node hooks share one function, hence one counter; every other hook its own
    assert len(set(names)) == len(HOOKS) - 1
