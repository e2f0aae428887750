"""Shadow mode: which workflow types are observed and refit but annotated ``known: false``.

Pythia (§5) profiles a new application in *shadow* first and only starts steering the engine
with its predictions once confidence is established. :class:`ShadowGate` applies that to two
cases, with every threshold an option:

* **New workflow type.** A type seen live while absent from the profile (or present with fewer
  than ``min_calls`` calls) is shadowed. It is *promoted* when a refit gave it at least
  ``min_calls`` calls and its live coverage over the latest window recovers (below).
* **Drift.** A live type whose output-length coverage over the last ``window`` observed calls
  (at least ``min_window`` of them) falls below ``nominal − drift_drop`` is shadowed.

Live coverage is the share of observed calls whose true output length fell inside the band the
predictor gave them (computed for shadowed types too, without serving it). A shadowed type is
promoted once its window has ``min_window`` calls with coverage ≥ ``nominal − recover_drop``
(``recover_drop < drift_drop``: hysteresis, so a type does not flap at the threshold).

Workflow types the profile does not have are remembered in an LRU of at most
``max_unknown_types`` (any client can invent names; the least recently seen is forgotten and
simply starts shadowed again if it comes back).

Types present in the first profile a server loads with enough calls are trusted from the start
(the fit validated them on held-back data). A new profile version resets the coverage windows:
the old bands' misses say nothing about the new ones. A trusted type that a later version lacked
(its calls then turned unknown and shadowed it as ``new_workflow_type``) is trusted again as soon
as a version brings it back with enough calls: it is the good version restored, not a new type
(issue 35: it stayed in shadow after the good version came back). A type shadowed for drift
waits for its window to recover, whatever version arrives.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass


@dataclass
class _TypeState:
    window: deque
    shadowed: bool = False
    reason: str | None = None          # "new_workflow_type" | "too_few_calls" | "drift"
    promotions: int = 0
    demotions: int = 0

    def coverage(self) -> float | None:
        return sum(self.window) / len(self.window) if self.window else None


class ShadowGate:
    """Thread-safe shadow-mode bookkeeping (see module doc)."""

    def __init__(self, *, min_calls: int = 100, window: int = 200, min_window: int = 50,
                 drift_drop: float = 0.10, recover_drop: float = 0.05,
                 max_unknown_types: int = 1000) -> None:
        if not 0 <= recover_drop <= drift_drop:
            raise ValueError(f"need 0 <= recover_drop ({recover_drop}) <= drift_drop ({drift_drop})")
        if min_window > window:
            raise ValueError(f"min_window ({min_window}) cannot exceed window ({window})")
        self.min_calls = int(min_calls)
        self.window = int(window)
        self.min_window = int(min_window)
        self.drift_drop = float(drift_drop)
        self.recover_drop = float(recover_drop)
        self.max_unknown_types = int(max_unknown_types)
        self.unknown_evicted = 0
        self._unknown: OrderedDict[str, None] = OrderedDict()   # LRU of types not in the profile
        self.nominal: float | None = None
        self._profile_calls: dict[str, int] = {}
        self._types: dict[str, _TypeState] = {}
        self._trusted: set[str] = set()      # types served unshadowed from some profile so far
        self._lock = threading.Lock()

    def _state(self, wt: str) -> _TypeState:
        st = self._types.get(wt)
        if st is None:
            st = self._types[wt] = _TypeState(deque(maxlen=self.window))
        return st

    # -- driven by the Predictor ----------------------------------------------------------------
    def on_profile(self, workflow_type_calls: dict[str, int], nominal: float | None, first: bool) -> None:
        """A profile was loaded: reset the windows, shadow thin types, keep earlier decisions.

        ``first`` is True for the first profile a server loads: its well-fitted types are trusted.
        A type shadowed before (new or drifted) stays shadowed until its window recovers.
        """
        with self._lock:
            self.nominal = nominal
            self._profile_calls = dict(workflow_type_calls)
            for wt in workflow_type_calls:
                self._unknown.pop(wt, None)   # in the profile now: no longer a stranger
            for wt, calls in workflow_type_calls.items():
                st = self._types.get(wt)
                if st is None and calls >= self.min_calls:
                    if first:
                        self._trusted.add(wt)
                    continue
                st = self._state(wt)
                st.window.clear()
                if calls < self.min_calls:
                    if not st.shadowed and not first:
                        st.demotions += 1
                    st.shadowed, st.reason = True, "too_few_calls"
                elif st.shadowed and st.reason == "new_workflow_type" and wt in self._trusted:
                    st.shadowed, st.reason = False, None     # the good version is back
                    st.promotions += 1

    def note_unknown(self, wt: str) -> None:
        """A call of a workflow type the profile does not have: start shadowing it."""
        with self._lock:
            if wt not in self._profile_calls:
                self._unknown[wt] = None
                self._unknown.move_to_end(wt)
                while len(self._unknown) > self.max_unknown_types:
                    gone, _ = self._unknown.popitem(last=False)
                    self._types.pop(gone, None)
                    self.unknown_evicted += 1
            st = self._types.get(wt)
            if st is None or not st.shadowed:
                st = self._state(wt)
                st.shadowed, st.reason = True, "new_workflow_type"
                st.demotions += 1

    def is_shadowed(self, wt: str) -> bool:
        st = self._types.get(wt)
        return st is not None and st.shadowed

    def reason(self, wt: str) -> str | None:
        st = self._types.get(wt)
        return st.reason if st is not None and st.shadowed else None

    def record(self, wt: str, in_band: bool) -> None:
        """One observed call of ``wt``: did its output fall in the band it was given?"""
        with self._lock:
            st = self._state(wt)
            st.window.append(1 if in_band else 0)
            if self.nominal is None or len(st.window) < self.min_window:
                return
            cov = sum(st.window) / len(st.window)
            if st.shadowed:
                enough = self._profile_calls.get(wt, 0) >= self.min_calls
                if enough and cov >= self.nominal - self.recover_drop:
                    st.shadowed, st.reason = False, None
                    st.promotions += 1
                    self._trusted.add(wt)
            elif cov < self.nominal - self.drift_drop:
                st.shadowed, st.reason = True, "drift"
                st.demotions += 1

    # -- reporting --------------------------------------------------------------------------------
    def coverage(self, wt: str) -> float | None:
        """Live output-length coverage of ``wt`` over its current window (None: no observation)."""
        with self._lock:
            st = self._types.get(wt)
            return st.coverage() if st is not None else None

    def unknown_count(self) -> int:
        """Workflow types absent from the profile that are remembered (at most ``max_unknown_types``)."""
        return len(self._unknown)

    def shadowed_count(self) -> int:
        with self._lock:
            return sum(1 for st in self._types.values() if st.shadowed)

    def status(self) -> dict:
        """Per workflow type: shadowed, reason, live coverage, window size, profile calls."""
        with self._lock:
            return {wt: {"shadowed": st.shadowed, "reason": st.reason, "live_coverage": st.coverage(),
                         "window_calls": len(st.window), "profile_calls": self._profile_calls.get(wt, 0),
                         "promotions": st.promotions, "demotions": st.demotions}
                    for wt, st in sorted(self._types.items())}

    def options(self) -> dict:
        return {"min_calls": self.min_calls, "window": self.window, "min_window": self.min_window,
                "drift_drop": self.drift_drop, "recover_drop": self.recover_drop,
                "max_unknown_types": self.max_unknown_types}
