"""Serving-time readers of a profile's estimator sections (numpy and the standard library only).

Each estimator of :mod:`predictors` is two things: a *fit* (pandas, scipy, scikit-learn) that
writes a section of ``profile.json``, and a *reader* that answers per-call questions from that
section. The readers live here and the estimators inherit them
(``OutputLengthIntervals(OutputBands, BaseEstimator)``, …), so the serving path —
``from predictors import Predictor``, the sidecar, the gateway — compiles a profile without
importing pandas, scipy or scikit-learn, and every answer comes from one implementation.

==========================  =============================================================
:class:`OutputBands`        ``output_length``: band of a call, U(α) table (capacity bounds)
:class:`ToolLatencyTable`   ``tool_latency``: per-tool lognormal entries
:class:`IdleGapTable`       ``idle_gap``: keep-alive TTL entries by level
==========================  =============================================================

One exception, for old profiles only: a band written before ``certified_alpha`` existed reads
its tail bound from the Student-t quantile (:func:`lognormal_upper`), which imports scipy on
first use; a current profile never reaches it.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

class Band(NamedTuple):
    """The output-length band served for one call: ``[lo, hi]`` tokens and the level that gave it
    (``agent``, ``workflow_type``, ``global`` or ``conditional``)."""

    lo: int
    hi: int
    level: str


class RemainingWork(NamedTuple):
    """A session's remaining output tokens at one call: the point figure served (R̂) and the
    p50 / p90 of the entry it came from, all scaled by the session factor."""

    expected: float
    p50: float
    p90: float


#: Risks α at which every band tabulates its one-sided upper bound U(α) (``band["upper"]``).
UPPER_ALPHAS = (0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001, 5e-4, 2e-4, 1e-4, 5e-5, 2e-5, 1e-5)
#: Largest exponent handed to exp() (e^700 ≈ 1e304: finite, and far past any ceiling).
_MAX_EXP = 700.0

#: Idle-gap levels from finest to coarsest.
LEVELS = ("tool", "agent", "workflow_type")
#: Key columns of each idle-gap level.
LEVEL_KEYS = {"tool": ["workflow_type_id", "agent_id", "tool"], "agent": ["workflow_type_id", "agent_id"],
              "workflow_type": ["workflow_type_id"]}
#: Gaps are floored here before logs (a 0 s gap is a clock artifact).
MIN_GAP_S = 1e-3
#: Bound of the session factor: ``c ∈ [1/8, 8]``.
MAX_FACTOR = 8.0
#: Bounds of the keep-alive TTL an engine holds: a served TTL (``keep_alive_ttl_s``) is held for
#: ``clip(TTL, HELD_TTL_MIN_S, HELD_TTL_MAX_S)`` (the defaults of the keep/drop policy's
#: ``min_ttl_s`` / ``max_ttl_s``). One definition for the policy, for eval's scoring and for the
#: online keep-alive level, which judges an idle gap against the TTL held, not the TTL served.
HELD_TTL_MIN_S = 0.5
HELD_TTL_MAX_S = 120.0
#: The TTL the keep/drop policy holds when a call is served none (``KeepDropPolicy.default_ttl_s``).
HELD_TTL_DEFAULT_S = 10.0


def held_ttl_s(ttl: float) -> float:
    """The keep-alive TTL held for a served ``ttl``: bounded to ``[HELD_TTL_MIN_S, HELD_TTL_MAX_S]``.
    A 0.3 s TTL is held 0.5 s, so a 0.4 s gap after it finds the KV still there (a hit)."""
    return min(HELD_TTL_MAX_S, max(HELD_TTL_MIN_S, ttl))


def _init_params(cls: type, params: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``params`` that ``cls.__init__`` accepts (a section's fit-time settings)."""
    names = set(inspect.signature(cls.__init__).parameters) - {"self"}
    return {k: v for k, v in params.items() if k in names}


# ------------------------------------------------------------------ output length
def lognormal_upper(mu: float, sigma: float, n: int, alpha: float) -> float:
    """One-sided (1 − α) lognormal prediction bound exp(μ + q·σ·√(1 + 1/n)), with q the
    Student-t quantile t_{n−1, 1−α} (the normal one when n is unknown or tiny). The exponent is
    capped (e^700), so a wild σ gives a huge finite number, never an OverflowError.

    Fit time, and serving of profiles written before ``certified_alpha``: scipy is imported on
    first use (module doc)."""
    from scipy import stats  # optional heavy dependency, off the current serving path

    q = stats.t.isf(alpha, df=n - 1) if n >= 3 else stats.norm.isf(alpha)
    return math.exp(min(mu + q * max(sigma, 0.0) * math.sqrt(1 + 1 / max(n, 1)), _MAX_EXP))


def leaf_quantiles(model: Mapping[str, Any], X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q_lo(x), q_hi(x)) per row of a quantile tree: walk every row down the tree at once."""
    left, right = np.asarray(model["left"]), np.asarray(model["right"])
    feat, thr = np.asarray(model["feature"]), np.asarray(model["threshold"])
    node = np.zeros(len(X), dtype=int)
    inner = left[node] != -1
    while inner.any():
        rows = np.flatnonzero(inner)
        n = node[rows]
        go_left = X[rows, feat[n]] <= thr[n]
        node[rows] = np.where(go_left, left[n], right[n])
        inner = left[node] != -1
    return np.asarray(model["q_lo"])[node], np.asarray(model["q_hi"])[node]


def tree_bands(model: Mapping[str, Any], X: np.ndarray, q: float | None = None,
               ceiling: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Integer bands [lo, hi] per row, corrected by ``q`` (default: the model's ``q_adjust``)."""
    q = float(model["q_adjust"]) if q is None else q
    ceiling = model.get("ceiling") if ceiling is None else ceiling
    qlo, qhi = leaf_quantiles(model, X)
    if math.isinf(q):
        lo = np.zeros(len(X))
        hi = np.full(len(X), np.inf)
    else:
        lo = np.expm1(np.log1p(qlo) - q)
        hi = np.expm1(np.minimum(np.log1p(qhi) + q, 700.0))
    if ceiling is not None:
        hi = np.minimum(hi, float(ceiling))
    lo = np.maximum(np.floor(lo), 0.0)
    return lo, np.maximum(np.ceil(hi), lo)


def _linear_cond_bands(model: Mapping[str, Any], X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bands of a linear CQR model (profiles written before the quantile tree)."""
    lo = X @ np.asarray(model["lo_coef"]) + model["lo_intercept"] - model["q_adjust"]
    hi = X @ np.asarray(model["hi_coef"]) + model["hi_intercept"] + model["q_adjust"]
    lo = np.maximum(np.floor(lo), 0)
    hi = np.maximum(np.ceil(hi), lo)
    return lo, hi


def cond_bands(model: Mapping[str, Any], X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bands of a conditional model (quantile tree, or the older linear CQR) per row of ``X``."""
    if model.get("kind") == "quantile_tree":
        return tree_bands(model, X)
    return _linear_cond_bands(model, X)


def band_upper_bound(band: Mapping[str, Any], alpha: float, coverage: float | None = None) -> int:
    """U(α) from one fitted entry (``predictors.output_length`` module doc): below
    ``certified_alpha`` or past the table's smallest α, the entry's ``ceiling``; never above it."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    table = band.get("upper")
    n = int(band.get("n") or 0)
    if band.get("certified_alpha") is not None and band.get("ceiling") is not None:
        ceiling = int(band["ceiling"])
        if alpha < float(band["certified_alpha"]) or not table:
            return ceiling
        pairs = sorted(((float(a), int(v)) for a, v in table.items()), reverse=True)
        usable = [v for a, v in pairs if a <= alpha]
        return min(usable[0], ceiling) if usable else ceiling
    if table:  # a profile written before certified_alpha: table, then the lognormal tail
        pairs = sorted(((float(a), int(v)) for a, v in table.items()), reverse=True)
        usable = [v for a, v in pairs if a <= alpha]
        if usable:
            return usable[0]
        if band.get("log_mu") is not None and band.get("log_sigma") is not None:
            return max(pairs[-1][1], int(math.ceil(lognormal_upper(
                float(band["log_mu"]), float(band["log_sigma"]), n, alpha))))
        return pairs[-1][1]
    mean, cv = band.get("mean"), band.get("cv")
    if mean and cv is not None and mean > 0:
        s2 = math.log1p(float(cv) ** 2)
        return int(math.ceil(lognormal_upper(math.log(float(mean)) - s2 / 2, math.sqrt(s2), n, alpha)))
    return int(band["hi"])


class OutputBands:
    """Reader of the ``output_length`` section: ``lookup``, ``predict_band``, ``upper_bounds``.

    Attributes (as the fit writes them): ``coverage``, ``min_calls``, ``global_``,
    ``workflow_types_``, ``agents_``, ``n_conditional_``.
    """

    def __init__(self, coverage: float = 0.99, min_calls: int = 50) -> None:
        self.coverage = coverage
        self.min_calls = min_calls

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OutputBands":
        est = cls(**_init_params(cls, d.get("params", {"coverage": d["coverage"]})))
        est.global_ = d["global"]
        est.workflow_types_ = d["workflow_types"]
        est.agents_ = d["agents"]
        est.n_conditional_ = sum(1 for agents in est.agents_.values()
                                 for b in agents.values() if b.get("conditional"))
        return est

    def lookup(self, workflow_type_id: str, agent_id: str) -> tuple[dict, str]:
        """The entry serving this agent and its level (an unseen agent: its workflow type's
        served band, an unseen type: the global band)."""
        band = self.agents_.get(workflow_type_id, {}).get(agent_id)
        if band is not None:
            return band, band["level"]
        wt = self.workflow_types_.get(workflow_type_id)
        if wt is not None:
            if "level" in wt:
                return wt, wt["level"]
            if wt["n"] >= self.min_calls:  # a profile written before validated selection
                return wt, "workflow_type"
        return self.global_, "global"

    def predict_band(self, workflow_type_id: str, agent_id: str,
                     features: Mapping[str, float | None] | None = None) -> Band:
        """(lo, hi, level) for one call; ``features`` feed the conditional model when present
        (keys ``prev_agent_output_tokens``, ``input_tokens``, ``agent_call_index``)."""
        band, level = self.lookup(workflow_type_id, agent_id)
        cond = band.get("conditional")
        if cond and features and features.get("input_tokens") is not None:
            prev = features.get("prev_agent_output_tokens")
            x = np.array([[prev is not None, prev or 0.0, features["input_tokens"],
                           features.get("agent_call_index") or 0.0]], dtype=float)
            lo, hi = cond_bands(cond, x)
            return Band(int(lo[0]), int(hi[0]), "conditional")
        return Band(int(band["lo"]), int(band["hi"]), level)

    def upper_bound(self, workflow_type_id: str, agent_id: str, alpha: float) -> int:
        """U(α): the (1 − α) one-sided upper bound of this agent's next output length; the
        entry's ceiling below its ``certified_alpha``."""
        band, _ = self.lookup(workflow_type_id, agent_id)
        return band_upper_bound(band, alpha, self.coverage)

    def upper_bounds(self, workflow_type_id: str, agent_id: str,
                     alphas: Sequence[float] = UPPER_ALPHAS) -> tuple[tuple[float, int], ...]:
        """``((α, U(α)), …)`` over ``alphas``, largest α first: the table a router interpolates."""
        band, _ = self.lookup(workflow_type_id, agent_id)
        return tuple((float(a), band_upper_bound(band, a, self.coverage))
                     for a in sorted(alphas, reverse=True))


# ------------------------------------------------------------------ tool latency
class ToolLatencyTable:
    """Reader of the ``tool_latency`` section: per (workflow type, tool) lognormal entries."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ToolLatencyTable":
        est = cls(**_init_params(cls, d.get("params", {})))
        est.tools_ = d["workflow_types"]
        est.global_tools_ = d.get("global", {})
        est.half_life_ = d.get("half_life", {})
        return est

    def lookup(self, workflow_type_id: str, tool: str) -> dict[str, Any] | None:
        """The entry for this tool in this workflow type, else the pooled one, else None."""
        entry = self.tools_.get(workflow_type_id, {}).get(tool)
        return entry if entry is not None else self.global_tools_.get(tool)

    def retain_s(self, workflow_type_id: str, tool_calls: Mapping[str, int], max_tools: int = 3) -> float | None:
        """The keep-alive TTL of an agent's tool (its ``retain_s``): of its ``max_tools`` most
        called tools (``tool_calls``: calls per tool) the first with an entry, its ``ttl_s``, else
        its p95; None without one."""
        for name in sorted(tool_calls, key=lambda t: (-tool_calls[t], t))[:max_tools]:
            entry = self.lookup(workflow_type_id, name)
            if entry:
                return entry.get("ttl_s") if entry.get("ttl_s") is not None else entry.get("p95_s")
        return None


# ---------------------------------------------------------------------- idle gap
class IdleGapTable:
    """Reader of the ``idle_gap`` section: TTL entries by level, backing off to coarser ones."""

    def __init__(self, max_ttl_s: float | None = 600.0) -> None:
        self.max_ttl_s = max_ttl_s

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "IdleGapTable":
        est = cls(**_init_params(cls, d.get("params", {})))
        est.workflow_types_ = dict(d.get("workflow_types") or {})
        est._index()
        return est

    def _index(self) -> None:
        """Lookup dicts from the entries: {(level, key tuple): entry}; a ``ttl_z`` of None (JSON
        for "not certified") is +inf in memory (served as the cap)."""
        self._lookup: dict[tuple, dict] = {}
        for wt, info in self.workflow_types_.items():
            for lv, rows in info.get("entries", {}).items():
                for r in rows:   # a copy: the profile's dict stays plain JSON
                    z = r.get("ttl_z")
                    self._lookup[(lv, tuple(r[k] for k in LEVEL_KEYS[lv]))] = {
                        **r, "ttl_z": math.inf if z is None else float(z)}

    def entry(self, wt: str, agent: str | None = None, tool: str | None = None,
              level: str | None = None) -> tuple[dict | None, str | None]:
        """The entry serving ``(wt, agent, tool)`` at ``level`` (default: the type's chosen one,
        the tool level when ``tool`` is given and validated), backing off to coarser levels."""
        info = self.workflow_types_.get(wt)
        if info is None or info.get("level") == "none":
            return None, None
        if level is None:
            level = "tool" if (tool is not None and info.get("tool_level")) else info["level"]
        for lv in LEVELS[LEVELS.index(level):]:
            key = {"tool": (wt, agent, tool), "agent": (wt, agent), "workflow_type": (wt,)}[lv]
            e = self._lookup.get((lv, key))
            if e is not None:
                return e, lv
        return None, None

    def median(self, wt: str, agent: str | None = None) -> float | None:
        """Median idle gap of the agent's entry (the session correction's reference)."""
        e, _ = self.entry(wt, agent, level="agent")
        return None if e is None else float(e["p50_s"])

    def prior_weight(self, wt: str) -> float | None:
        info = self.workflow_types_.get(wt) or {}
        return info.get("prior_weight")


# ------------------------------------------------------------------ remaining output tokens
#: Calls of one agent before this one, as the ``agent_calls`` level keys them (more are pooled).
MAX_AGENT_CALLS = 31


#: Largest elapsed-time bucket (longer sessions are pooled: 2^24 s ≈ half a year).
MAX_ELAPSED_BUCKET = 48


#: Relative size of the remaining-tokens tie-break (:func:`tie_broken`): far below the gap
#: between two distinct served figures (medians of token counts differ by ≥ ½ token), far above
#: float rounding.
TIE_EPS = 1e-9


def tie_broken(value: Any, finer: Any) -> Any:
    """``value`` nudged by at most ``TIE_EPS·(value + 1)`` toward the order of ``finer``: a
    lexicographic key (``value`` first, ``finer`` among equal values) as one number.

    A coarse remaining-work estimate (a position median) gives every session at the same
    position the same figure, and a ranking metric (the C-index) scores such ties ½. Breaking
    them by a finer estimate (the mean residual work at the exact call index: calls done → mean
    residual life) orders the tied sessions without changing the order of any untied pair
    (their figures differ by more than the nudge), nor, to nine digits, any figure served."""
    v = np.asarray(value, dtype=float)
    f = np.maximum(np.asarray(finer, dtype=float), 0.0)
    s = np.where(v + f > 0, (f - v) / np.maximum(v + f, 1e-300), 0.0)   # in [−1, 1], rising with f
    out = v + TIE_EPS * (np.abs(v) + 1.0) * s
    return float(out) if out.ndim == 0 else out


def elapsed_bucket(elapsed_s: float) -> int:
    """Seconds since the session's first call → bucket: two per doubling of ``1 + s``."""
    return min(MAX_ELAPSED_BUCKET, int(2 * math.log2(1.0 + max(0.0, float(elapsed_s)))))


#: The naive remaining-work baselines written beside the model (``remaining_tokens.baselines``)
#: and the key each reads: ``position_median`` the position bucket, ``mrl`` the exact call index
#: (calls done → mean residual life). Both are also candidates the fit may serve
#: (``{"level": "baseline", "baseline": name}``), read by :func:`baseline_figures` in serving and
#: in ``profiler eval`` alike.
BASELINE_KEYS = {"position_median": "bucket", "mrl": "index"}


def baseline_figures(table: Mapping[str, float] | tuple[np.ndarray, np.ndarray], at: Any) -> Any:
    """A baseline's figure at every key in ``at`` (position buckets or call indices, by
    :data:`BASELINE_KEYS`): the table's value at the nearest key at or before it (a session past
    every training workflow keeps the last one's), the first key's value before the first.
    ``table``: the section's ``{key: value}``, or its :func:`baseline_arrays` (serving keeps them)."""
    keys, vals = table if isinstance(table, tuple) else baseline_arrays(table)
    pos = np.searchsorted(keys, np.asarray(at), side="right") - 1
    out = vals[np.maximum(pos, 0)]
    return float(out) if out.ndim == 0 else out


def baseline_arrays(table: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """``(sorted keys, their values)`` of a baseline's ``{key: value}`` table."""
    keys = np.array(sorted(int(k) for k in table))
    return keys, np.array([float(table[str(k)]) for k in keys])


#: The simplest remaining-tokens candidate (the position median, ties broken by calls done → mean
#: residual life): what the fit keeps unless a richer one wins beyond noise, and the ``fitted``
#: candidate of a profile that serves a baseline without recording the one it passed over.
SIMPLEST = {"level": "position", "point": "p50", "beta": 0.0, "kappa": 0.0, "tie_break": "index"}
#: The remaining-tokens candidates the fit's forward rule and the online selection
#: (:mod:`predictors.online_selection`) choose among, simplest first: the two naive baselines
#: as ``profiler eval`` scores them and the cross-validated table candidate (``fitted``).
RW_CANDIDATES = ("position_median", "mrl", "fitted")


class RemainingTokensTable:
    """``remaining_tokens``: remaining output tokens of a session at one of its calls.

    The serving half of :class:`predictors.remaining_tokens.RemainingTokens` (see its module doc
    for the model): a per-type context table ``key → [n, mean, p50, p90]`` over keys ``""``
    (the type), ``"b<bucket>"`` (position), ``"b<bucket>|<agent>"``, ``"c<calls>|<agent>"`` (the
    agent's calls before this one), ``"e<bucket>"`` (:func:`elapsed_bucket`) and ``"i<index>"``
    (the exact call index: calls done → residual work of the training workflows that ran that
    long), and the type's chosen candidate ``{level, point, beta, kappa}``, with
    ``tie_break: "index"`` where equal figures are ordered by the mean residual work at the
    exact call index (:func:`tie_broken`)."""

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        data = data or {}
        self.workflow_types_: dict[str, Any] = dict(data.get("workflow_types") or {})
        self.params_: dict[str, dict[str, Any]] = dict(data.get("params") or {})
        self.baselines_: dict[str, Any] = dict(data.get("baselines") or {})
        self._baseline_arrays: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}   # built once each
        # the cross-validated candidate of each type where the forward rule serves a baseline
        self.fitted_params_: dict[str, dict[str, Any]] = {
            wt: sel["forward"]["fitted"] for wt, sel in (data.get("selection") or {}).items()
            if isinstance(sel, Mapping) and isinstance(sel.get("forward"), Mapping) and sel["forward"].get("fitted")}

    def served_candidate(self, wt: str) -> str:
        """Which of :data:`RW_CANDIDATES` the fit serves for type ``wt``."""
        p = self.params_.get(wt) or {}
        return p["baseline"] if p.get("level") == "baseline" else "fitted"

    def candidate_params(self, wt: str, name: str) -> dict[str, Any]:
        """The ``params`` of candidate ``name`` (:data:`RW_CANDIDATES`) for type ``wt``."""
        if name in BASELINE_KEYS:     # a profile without the baseline's table: the served figure
            return ({"level": "baseline", "baseline": name} if (self.baselines_.get(wt) or {}).get(name)
                    else self.params_.get(wt) or {})
        if name != "fitted":
            raise ValueError(f"unknown remaining-tokens candidate {name!r}; expected one of {RW_CANDIDATES}")
        p = self.params_.get(wt) or {}
        return self.fitted_params_.get(wt, SIMPLEST) if p.get("level") == "baseline" else p

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RemainingTokensTable":
        return cls(data)

    def lookup(self, wt: str, bucket: int, agent: str | None = None,
               agent_calls: int | None = None, elapsed: int | None = None,
               index: int | None = None) -> list[float]:
        """``[n, mean, p50, p90]`` at ``(agent, calls of that agent before this one)`` when
        ``agent_calls`` is given, else at ``(bucket, agent)``, backed off to ``(bucket, agent)``,
        to the bucket, then to the nearest earlier bucket the type has (a session past every
        training workflow keeps the last bucket's figures), then to the whole type. ``elapsed``
        (an :func:`elapsed_bucket`) or ``index`` (the exact call index) is looked up first when
        given."""
        entry = self.workflow_types_[wt]
        keys = entry["keys"]
        if index is not None:
            hit = keys.get(f"i{index}")
            if hit is not None:
                return hit
        if elapsed is not None:
            hit = keys.get(f"e{elapsed}")
            if hit is not None:
                return hit
        if agent is not None and agent_calls is not None:
            hit = keys.get(f"c{min(int(agent_calls), MAX_AGENT_CALLS)}|{agent}")
            if hit is not None:
                return hit
        if agent is not None:
            hit = keys.get(f"b{bucket}|{agent}")
            if hit is not None:
                return hit
        hit = keys.get(f"b{bucket}")
        if hit is not None:
            return hit
        earlier = [b for b in entry["buckets"] if b <= bucket]
        return keys[f"b{earlier[-1]}"] if earlier else keys[""]

    def predict(self, wt: str, bucket: int, agent: str | None, out_so_far: float,
                expected_so_far: float, agent_calls: int | None = None,
                elapsed_s: float | None = None, index: int | None = None,
                params: Mapping[str, Any] | None = None) -> RemainingWork | None:
        """The :class:`RemainingWork` ``(R̂, p50, p90)`` for a call at position ``bucket`` by ``agent`` in a session that has
        written ``out_so_far`` tokens where its agents usually write ``expected_so_far``, after
        ``index`` calls (its exact call index; read by the ``index`` level); None for a type the
        section does not hold. All three are scaled by the session factor. ``params``: a
        candidate in place of the type's chosen one (:meth:`candidate_params`)."""
        entry = self.workflow_types_.get(wt)
        if entry is None:
            return None
        p = params if params is not None else (self.params_.get(wt) or {})
        level = p.get("level")
        if level == "baseline":      # a naive baseline chosen forward in time: its figure as eval reads it
            name = p["baseline"]
            at = bucket if BASELINE_KEYS[name] == "bucket" or index is None else index
            stats = self.lookup(wt, bucket)
            arrays = self._baseline_arrays.get((wt, name))
            if arrays is None:
                arrays = self._baseline_arrays[wt, name] = baseline_arrays(self.baselines_[wt][name])
            return RemainingWork(baseline_figures(arrays, at), stats[2], stats[3])
        stats = self.lookup(wt, bucket, agent if level in ("agent", "agent_calls") else None,
                            agent_calls if level == "agent_calls" else None,
                            elapsed_bucket(elapsed_s) if level == "elapsed" and elapsed_s is not None else None,
                            index if level == "index" and index is not None else None)
        beta = float(p.get("beta") or 0.0)
        factor = 1.0
        if beta:
            prior = float(p.get("kappa") or 0.0) * float(entry["mean_out"])
            factor = ((out_so_far + prior) / max(expected_so_far + prior, 1e-9)) ** beta
        point = stats[2] if p.get("point", "p50") == "p50" else stats[1]
        value = point * factor
        if p.get("tie_break") == "index" and index is not None:   # ties broken by calls done → MRL
            value = tie_broken(value, self.lookup(wt, bucket, index=index)[1])
        return RemainingWork(value, stats[2] * factor, stats[3] * factor)

    def agent_mean(self, wt: str, agent: str) -> float | None:
        """Training mean output of ``agent`` in ``wt`` (the type's mean for an unseen agent)."""
        entry = self.workflow_types_.get(wt)
        if entry is None:
            return None
        return entry["agent_mean"].get(agent, entry["mean_out"])
