"""Roles: the report's grouping of many agents into a few, by name.

A team such as CaptainAgent's builds its experts per task (``Geometry_Expert``,
``Federico_Lauria_Expert``, ...): a workflow type can hold 170 agents that each speak a handful
of times. Drawn one node per agent, the graph is a hairball and the per-agent plots run to
screens; what the workflow *does* is "some domain experts talk, a verifier checks". So on a
large team (more than :data:`GROUP_ABOVE` agents) the report pools agents into **roles** by
ordered name rules: the first rule whose regular expression matches an agent's name (``re.search``)
gives its role; an agent no rule matches keeps its own name, and a role that only one agent of
the type matches keeps that agent's name too (nothing is gained by renaming it).

The default rules (:data:`DEFAULT_RULES`) pool CaptainAgent-style dynamic experts:

* names ending in ``Expert``/``Specialist`` that mention verification or validation
  → ``verifier experts``;
* every other name ending in ``Expert``/``Specialist`` → ``domain experts``.

``profiler report --group 'REGEX=ROLE'`` (repeatable) replaces them, ``--no-group`` turns grouping
off. The report says which rules it applied and lists the agents behind every role. Grouping only
changes what is drawn: the profile, its bands and its automaton stay per agent.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

#: Teams with more agents than this (per workflow type) are drawn by role.
GROUP_ABOVE = 16


@dataclass(frozen=True)
class RoleRule:
    """Agents whose name matches ``pattern`` (``re.search``) are drawn as ``role``."""

    pattern: str
    role: str

    def __post_init__(self) -> None:
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"bad role pattern {self.pattern!r}: {exc}") from None
        if not self.role.strip():
            raise ValueError(f"role rule {self.pattern!r} has an empty role name")

    def matches(self, agent: str) -> bool:
        return re.search(self.pattern, agent) is not None


DEFAULT_RULES: tuple[RoleRule, ...] = (
    RoleRule(r"(?i)(verif|valid).*(expert|specialist)$", "verifier experts"),
    RoleRule(r"(?i)(expert|specialist)$", "domain experts"),
)


def parse_rule(text: str) -> RoleRule:
    """``"REGEX=ROLE"`` (split at the last ``=``) as a :class:`RoleRule`; a one-line
    ``ValueError`` for anything else."""
    pattern, sep, role = text.rpartition("=")
    if not sep or not pattern:
        raise ValueError(f"--group takes REGEX=ROLE, got {text!r}")
    return RoleRule(pattern, role.strip())


@dataclass
class RoleMap:
    """How one workflow type's agents are drawn: ``role_of[agent]`` (every agent; itself when
    not pooled) and ``members[role]`` (only roles that pool two or more agents)."""

    role_of: dict[str, str]
    members: dict[str, list[str]] = field(default_factory=dict)
    rules: tuple[RoleRule, ...] = ()

    @property
    def active(self) -> bool:
        return bool(self.members)

    def symbol(self, symbol: str) -> str:
        """The role form of a step symbol; a fan-out step ``a|b`` maps member by member (sorted,
        duplicates merged: ``X_Expert|Y_Expert`` → ``domain experts``)."""
        if "|" not in symbol:
            return self.role_of.get(symbol, symbol)
        return "|".join(sorted({self.role_of.get(s, s) for s in symbol.split("|")}))


def group_roles(calls: Mapping[str, int], rules: Sequence[RoleRule] = DEFAULT_RULES,
                above: int = GROUP_ABOVE) -> RoleMap:
    """Roles of a type whose agents made ``calls[agent]`` calls: none unless it has more than
    ``above`` agents; then each agent takes the role of the first rule it matches, and roles
    matched by a single agent fall back to the agent's name."""
    agents = sorted(calls)
    if len(agents) <= above or not rules:
        return RoleMap({a: a for a in agents}, rules=tuple(rules))
    first = {a: next((r.role for r in rules if r.matches(a)), None) for a in agents}
    size = Counter(r for r in first.values() if r is not None)
    role_of = {a: (r if r is not None and size[r] > 1 else a) for a, r in first.items()}
    members: dict[str, list[str]] = {}
    for a in sorted(agents, key=lambda a: (-calls[a], a)):
        if role_of[a] != a:
            members.setdefault(role_of[a], []).append(a)
    return RoleMap(role_of, members, tuple(rules))


def role_paths(sequences: Iterable[Sequence[str]], roles: RoleMap,
               top: int = 8) -> tuple[list[tuple[str, int, float]], int]:
    """The most common workflow shapes over roles: each workflow's role sequence with runs of one
    role folded to ``role+``, the ``top`` most frequent with (shape, workflows, cumulative share);
    and the number of workflows."""
    shapes: Counter = Counter()
    n = 0
    for seq in sequences:
        out: list[str] = []
        for s in seq:
            r = roles.symbol(s)
            if out and out[-1] in (r, r + "+"):
                out[-1] = r + "+"
            else:
                out.append(r)
        shapes[" → ".join(out)] += 1
        n += 1
    rows, cum = [], 0
    for shape, k in shapes.most_common(top):
        cum += k
        rows.append((shape, k, cum / n))
    return rows, n
