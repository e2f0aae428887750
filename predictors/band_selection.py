"""Choosing an output-length band by cross-validation *by workflow* (the candidates and the rule).

Every node of the hierarchy (global → workflow type → agent) has a few candidate bands, each a
function of the node's training lengths. Workflows are dealt into K folds once for the whole fit
(:func:`store.folds.group_folds`), so an agent's fold k and its workflow type's fold k hold the same
workflows; each candidate's pooled held-out *coverage* and *mean width* are its validation figures.

**Candidates** (α = 1 − coverage): ``order_stat`` (split-conformal ranks ⌊(n+1)α/2⌋, ⌈(n+1)(1−α/2)⌉),
``order_stat_ceiling`` (a missing rank replaced by the support's end, so coverage ≥ 1 − α at
every n), ``one_sided`` (``[0, U(α)]``: output lengths are right-skewed; not offered at the global
node), ``empirical`` (the naive band), ``lognormal``, ``parent``, ``global`` and ``conditional``
(:mod:`predictors.quantile_tree`).

**Rule.** A candidate is accepted when its held-out misses m of N satisfy
m ≤ α·(N+1) + z·√(N·α·(1−α)), z = :data:`TOLERANCE_Z` = 1; the narrowest accepted candidate wins
(ties: :data:`CANDIDATE_ORDER`), else the highest coverage. **Forward in time** (issue 37): among
accepted candidates, the narrowest the same rule also accepts by rolling origin
(:data:`FORWARD_ORIGINS`) wins. **Ceiling**: no band end exceeds
``min(max_output_tokens, ⌈CEILING_FACTOR · max(max y, 1)⌉)``.

Why each candidate and the rule's tolerance, with their Who&When figures: docs/output-length.md
("Band selection: candidates and rule").
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
from scipy import stats

#: The largest observed length times this factor is an upper tail's ceiling.
CEILING_FACTOR = 2.0
#: Binomial standard deviations of held-out misses tolerated above the nominal α·(N+1).
TOLERANCE_Z = 1.0
#: Order of preference among equally wide candidates.
CANDIDATE_ORDER = ("order_stat", "one_sided", "empirical", "order_stat_ceiling", "lognormal", "conditional", "parent",
                   "global")
#: Shares of the log's workflows (by start time) at which the forward rule's origins cut: at each,
#: the candidates fit on the workflows before it are scored on those up to the next (rolling
#: origin; the last block runs to the end of the training log).
FORWARD_ORIGINS = (0.5, 0.6, 0.7, 0.8, 0.9)

Band = tuple[float, float]


def ceiling_of(y: np.ndarray, max_output_tokens: int | None = None) -> int:
    """``min(cap, ⌈CEILING_FACTOR · max(max y, 1)⌉)``, never below the largest observed length."""
    top = float(np.max(y)) if len(y) else 0.0
    c = math.ceil(CEILING_FACTOR * max(top, 1.0))
    if max_output_tokens:
        c = min(c, max(int(max_output_tokens), math.ceil(top)))
    return int(c)


def _ranks(n: int, coverage: float) -> tuple[int, int]:
    alpha = 1.0 - coverage
    return math.floor((n + 1) * alpha / 2), math.ceil((n + 1) * (1 - alpha / 2))


def _order_stats(y: np.ndarray, ranks: list[int]) -> dict[int, float]:
    """The values at the given 1-based ranks (np.partition, O(n))."""
    ks = sorted({k - 1 for k in ranks})
    part = np.partition(y, ks)
    return {k + 1: float(part[k]) for k in ks}


def order_stat_band(y: np.ndarray, coverage: float, ceiling: int) -> Band:
    """Only the ``order_stat`` candidate of :func:`candidate_bands` (same value, less work)."""
    n = len(y)
    k_lo, k_hi = _ranks(n, coverage)
    vals = _order_stats(np.asarray(y, dtype=float), [max(k_lo, 1), min(k_hi, n)])
    a, b = vals[max(k_lo, 1)], vals[min(k_hi, n)]
    return max(0.0, math.floor(a)), float(min(max(math.ceil(b), math.floor(a)), ceiling))


def order_stat_bands(y: np.ndarray, coverages: Sequence[float], ceiling: int) -> list[Band]:
    """:func:`order_stat_band` at several coverages, with one partition for all their ranks."""
    y = np.asarray(y, dtype=float)
    n = len(y)
    ranks = [_ranks(n, c) for c in coverages]
    vals = _order_stats(y, [r for lo, hi in ranks for r in (max(lo, 1), min(hi, n))])
    out = []
    for lo_k, hi_k in ranks:
        a, b = vals[max(lo_k, 1)], vals[min(hi_k, n)]
        out.append((max(0.0, math.floor(a)), float(min(max(math.ceil(b), math.floor(a)), ceiling))))
    return out


def candidate_bands(y: np.ndarray, coverage: float, ceiling: int, one_sided: bool = True) -> dict[str, Band]:
    """Every marginal candidate fit on ``y`` (n ≥ 1), clipped to ``[0, ceiling]``; ``one_sided``:
    include the ``one_sided`` one (the fit leaves it out at the global node, docs/output-length.md)."""
    y = np.asarray(y, dtype=float)
    n = len(y)
    alpha = 1.0 - coverage
    k_lo, k_hi = _ranks(n, coverage)
    k_up = math.ceil((n + 1) * (1 - alpha))      # the one-sided bound's rank
    vals = _order_stats(y, [max(k_lo, 1), min(k_hi, n), min(k_up, n)])
    lo, hi = vals[max(k_lo, 1)], vals[min(k_hi, n)]
    out: dict[str, Band] = {"order_stat": (lo, hi)}
    out["order_stat_ceiling"] = (lo if k_lo >= 1 else 0.0, hi if k_hi <= n else float(ceiling))
    if one_sided:
        out["one_sided"] = (0.0, vals[k_up] if k_up <= n else float(ceiling))
    q = np.quantile(y, [alpha / 2, 1 - alpha / 2])
    out["empirical"] = (float(q[0]), float(q[1]))
    if n >= 3:
        z = np.log(np.maximum(y, 1.0))
        sd = float(z.std(ddof=1))
        if sd > 0:
            half = float(stats.t.ppf(1 - alpha / 2, df=n - 1)) * sd * math.sqrt(1 + 1 / n)
            mu = float(z.mean())
            out["lognormal"] = (math.exp(min(mu - half, 700.0)), math.exp(min(mu + half, 700.0)))
    return {k: (max(0.0, math.floor(a)), float(min(max(math.ceil(b), math.floor(a)), ceiling)))
            for k, (a, b) in out.items()}


def accepted(misses: int, total: int, coverage: float, z: float = TOLERANCE_Z) -> bool:
    """m ≤ α·(N+1) + z·√(N·α·(1−α)): held-out misses compatible with nominal coverage."""
    if total == 0:
        return False
    alpha = 1.0 - coverage
    return bool(misses <= alpha * (total + 1) + z * math.sqrt(total * alpha * (1 - alpha)))


class FoldScores:
    """Held-out misses and widths of each candidate, pooled over folds."""

    def __init__(self) -> None:
        self.miss: dict[str, int] = {}
        self.width: dict[str, float] = {}
        self.total = 0

    def add(self, name: str, y: np.ndarray, lo: np.ndarray | float, hi: np.ndarray | float) -> None:
        self.miss[name] = self.miss.get(name, 0) + int(np.sum((y < lo) | (y > hi)))
        w = np.broadcast_to(np.asarray(hi, dtype=float) - np.asarray(lo, dtype=float), y.shape)
        self.width[name] = self.width.get(name, 0.0) + float(np.sum(w))

    def summary(self, coverage: float) -> dict[str, dict[str, Any]]:
        n = max(self.total, 1)
        return {name: {"coverage": 1.0 - self.miss[name] / n, "mean_width": self.width[name] / n,
                       "accepted": accepted(self.miss[name], self.total, coverage)}
                for name in self.miss}


def choose(summary: dict[str, dict[str, Any]], allowed: Callable[[str], bool] = lambda _: True,
           forward: dict[str, dict[str, Any]] | None = None) -> tuple[str, str]:
    """(name, reason): the narrowest accepted candidate, else the best-covering one. With
    ``forward`` (the rolling-origin figures, :meth:`OutputLengthIntervals._forward_scores`),
    the narrowest of those accepted both held out and forward in time, when there is one."""
    names = [c for c in CANDIDATE_ORDER if c in summary and allowed(c)]
    ok = [c for c in names if summary[c]["accepted"]]
    both = [c for c in ok if forward and (forward.get(c) or {}).get("accepted")]
    if both and both != ok:
        best = min(both, key=lambda c: (summary[c]["mean_width"], names.index(c)))
        return best, ("narrowest candidate whose held-out coverage reaches nominal, "
                      "of those whose forward-in-time coverage does too")
    if ok:
        best = min(ok, key=lambda c: (summary[c]["mean_width"], names.index(c)))
        return best, "narrowest candidate whose held-out coverage reaches nominal"
    best = min(names, key=lambda c: (-summary[c]["coverage"], summary[c]["mean_width"], names.index(c)))
    return best, "no candidate reached nominal on held-out workflows: highest held-out coverage"


def band_warnings(output_length: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    """``{(workflow type, agent): [warning, …]}`` for the ``output_length`` section of a profile:
    a band wider than its workflow type's or the global band (validation chose it over the parent,
    or an older profile's call-count rule did), and a degenerate agent's fallback reason."""
    g = output_length.get("global") or {}
    g_w = g.get("hi", 0) - g.get("lo", 0)
    out: dict[tuple[str, str], list[str]] = {}
    for wt, agents in (output_length.get("agents") or {}).items():
        t = (output_length.get("workflow_types") or {}).get(wt) or {}
        t_w = t.get("hi", 0) - t.get("lo", 0) if t else None
        for agent, b in agents.items():
            w = b["hi"] - b["lo"]
            notes = []
            if t_w is not None and w > t_w:
                notes.append(f"wider than its workflow type's band ({w:,} > {t_w:,} tokens)")
            if g and w > g_w:
                notes.append(f"wider than the global band ({w:,} > {g_w:,} tokens)")
            budget = (b.get("selection") or {}).get("budget")
            if notes and budget and budget.get("held_out_mean_width_at_nominal") is not None:
                notes.append(f"chosen under the shared coverage budget: held-out mean width of all "
                             f"calls {budget['held_out_mean_width']:,.0f} vs "
                             f"{budget['held_out_mean_width_at_nominal']:,.0f} with every agent at nominal")
            if b.get("fallback_reason"):
                notes.append(b["fallback_reason"])
            if notes:
                out[(wt, agent)] = notes
    return out


def selection_text(entry: dict[str, Any]) -> str:
    """One line: the chosen candidate and every candidate's held-out coverage/width."""
    sel = entry.get("selection")
    if not sel:
        return "(profile written before validated selection)"
    parts = [f"{name} {v['coverage']:.3f}/{v['mean_width']:,.0f}{' ✓' if v['accepted'] else ''}"
             for name, v in sel.get("candidates", {}).items()]
    head = f"{sel['chosen']} ({sel['reason']}; {sel.get('n_val', 0):,} held-out calls)"
    return head + (": " + " · ".join(parts) if parts else "")


# ------------------------------------------------------------- shared coverage budget
#: Per-agent coverage levels an agent's order-statistic band may take under a shared budget.
BUDGET_LEVELS = (0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.998, 0.999)


class BudgetOption(NamedTuple):
    """One option on a group's menu in the shared coverage budget (:func:`allocate_budget`).

    ``name`` is the band as the profile names it (``selection.chosen``, ``method``): a validated
    candidate (``"parent"``, ``"order_stat"``, ...), ``"global"``, or ``"order_stat@0.97"``.
    ``keep``: the group's own validated choice at nominal, served unchanged (preferred on a
    tie). ``level``: the coverage of an order-statistic option (None otherwise)."""
    name: str
    keep: bool = False
    level: float | None = None

    @classmethod
    def order_stat(cls, level: float) -> "BudgetOption":
        """The order-statistic band at coverage ``level``."""
        return cls(f"order_stat@{level:g}", level=level)


#: The global band as a budget option.
GLOBAL_OPTION = BudgetOption("global")


#: Binomial standard deviations of tolerance in the shared miss budget (see budget_misses).
BUDGET_Z = 0.5


def budget_misses(total: int, coverage: float, z: float | None = None) -> int:
    """Held-out misses the whole log may spend: ⌊α·(N+1) + z·√(N·α·(1−α))⌋ with
    z = :data:`BUDGET_Z` (0.5: half the per-node rule's tolerance, because the allocation picks
    the best of many configurations on the same folds). Measured (Who&When, seeds 1–5 pooled,
    coverage / mean width): z = 1: 0.979 / 2,151; z = 0.5: 0.981 / 2,195 (global band
    0.990 / 3,308); docs/output-length.md has the full comparison."""
    alpha = 1.0 - coverage
    z = BUDGET_Z if z is None else z
    return int(math.floor(alpha * (total + 1) + z * math.sqrt(total * alpha * (1 - alpha)) + 1e-9))


#: Charge every option of the budget at least its nominal misses (see :func:`charged_misses`).
#: Off: measured on Who&When (seeds 1–5 pooled, 3,536 held-out calls) it bought 0.6 pt of
#: coverage (0.976 → 0.982) for a band wider than the global one (3,546 vs 3,308 tokens).
CHARGE_NOMINAL = False


def charged_misses(observed: int, n: int, coverage: float) -> int:
    """Misses an option is charged in the budget: its held-out misses, but never fewer than a band
    at its own nominal level makes on average, round((1 − coverage)·n). Choosing among many
    configurations on the same folds favours options that missed less than their level by
    chance (winner's curse); charging the nominal floor removes that advantage."""
    if not CHARGE_NOMINAL:
        return int(observed)
    return max(int(observed), int((1.0 - coverage) * n + 0.5))


def allocate_budget(menus: list[dict[BudgetOption, tuple[int, float]]], budget: int
                    ) -> tuple[list[BudgetOption], int, float] | None:
    """One option per group minimizing the summed held-out width with summed misses ≤ ``budget``.

    ``menus[g]`` maps option → (held-out misses, held-out width sum) of group g (an agent, or
    the agents served their parent's band). A multiple-choice knapsack, solved exactly by dynamic
    programming over the miss count (budgets are small: ⌊α·(N+1)⌋). Returns (choices, misses,
    width sum), or None when no combination fits the budget."""
    inf = np.inf
    best = np.full(budget + 1, inf)
    best[0] = 0.0                      # best[m]: least width with exactly m misses so far
    back: list[tuple[np.ndarray, list[BudgetOption]]] = []  # per group: option index per m, options
    for menu in menus:
        names = sorted(menu, key=lambda o: (not o.keep, o.name))  # ties: keep, then by name
        nxt = np.full(budget + 1, inf)
        pick = np.full(budget + 1, -1)
        for j, name in enumerate(names):
            miss, width = int(menu[name][0]), float(menu[name][1])
            if miss > budget:
                continue
            cand = np.full(budget + 1, inf)
            cand[miss:] = best[:budget + 1 - miss] + width
            better = cand < nxt - 1e-9
            nxt[better], pick[better] = cand[better], j
        best = nxt
        back.append((pick, names))
    if not np.isfinite(best).any():
        return None
    m_end = int(np.argmin(best))
    choices: list[BudgetOption] = []
    m = m_end
    for g in range(len(menus) - 1, -1, -1):
        pick, names = back[g]
        name = names[int(pick[m])]
        choices.append(name)
        m -= int(menus[g][name][0])
    return choices[::-1], m_end, float(best[m_end])
