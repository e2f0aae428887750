"""Prompt composition: which parts of a prompt repeat earlier requests and responses.

Agent programs build each prompt largely from text the workflow has already produced: the
chat history (the previous request), a planner's response pasted into an engineer's prompt,
a tool result. For every call with text we find the spans of its prompt that are copies of
an earlier call's *request* (its rendered prompt) or *response* of the same workflow, and
describe the prompt as a sequence of parts: static text, references, and new text.

A reference is written ``${req_k:request:[a,b]}`` / ``${req_k:response:[a,b]}``: ``k`` counts
calls back from the current one in arrival order (``req_1`` = the previous call of the
workflow), ``[a,b]`` is a **character** range ``text[a:b]`` of that text, ``end`` standing for
its length (``[0,end]`` = the whole text, whatever its length).
``${new}`` is text that appeared nowhere before (the user's task, a tool's output).

Matching (per prompt, sources most recent first, each call's response before its request):
first every source found whole in a still uncovered stretch of the prompt becomes one
reference; then partial copies: anchors of ``min_match`` characters taken along the source
are looked up with ``str.find`` and every hit is grown right and left by binary search over
its length into a maximal copied piece (pieces touching the source's start or end first:
their ranges ``[0,b]`` / ``[a,end]`` stay put across workflows).

Templates: per agent, candidates are the most frequent *shapes* (the sequence of part kinds
with their references) over training calls, segmenting either the whole prompts or what
follows the prefix all of the agent's prompts share (then static text); literal parts
identical in every call of a shape, across at least two workflows, are static text, the
others ``${new}``. The candidate rebuilding the most training prompts exactly (then covering
the most characters) wins. Evaluation fills a template from a held-out call's own workflow
history and reports the share of prompts rebuilt exactly and the share of prompt characters
the template's static text and references reproduce (pieces found in order).
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

import duckdb

#: Shortest copied span worth a reference (characters).
MIN_MATCH = 32
#: How many earlier calls of the workflow are searched.
MAX_LOOKBACK = 16


@dataclass(frozen=True)
class TextCall:
    """The text of one call: its rendered prompt and its response ('' when absent)."""

    agent_id: str
    request: str
    response: str


def render_prompt(messages: object) -> str:
    """One string per prompt: ``[role]\\ncontent`` per message, joined by newlines.

    ``messages`` is a list of OpenAI chat messages (or its JSON text); content may be a
    string or a list of ``{"type": "text", "text": ...}`` parts.
    """
    if messages is None:
        return ""
    if isinstance(messages, str):
        messages = json.loads(messages)
    lines = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        lines.append(f"[{message.get('role', '')}]\n{content or ''}")
    return "\n".join(lines)


# -- segmentation -----------------------------------------------------------------------------

def _find_in(prompt: str, text: str, holes: list[tuple[int, int]]) -> int:
    for u, v in holes:
        pos = prompt.find(text, u, v)
        if pos >= 0:
            return pos
    return -1


def _longest_extension(prompt: str, src: str, a: int, b: int, holes: list[tuple[int, int]],
                       right: bool) -> int:
    """Grow the found piece ``src[a:b]`` to the right (returns b) or left (returns a)."""
    lo, hi = (b, len(src)) if right else (0, a)
    if right:
        while lo < hi:  # largest b' with src[a:b'] found
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if _find_in(prompt, src[a:mid], holes) >= 0 else (lo, mid - 1)
        return lo
    while lo < hi:  # smallest a' with src[a':b] found
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _find_in(prompt, src[mid:b], holes) >= 0 else (mid + 1, hi)
    return lo


def _copies(prompt: str, src: str, holes: list[tuple[int, int]], min_match: int,
            max_probes: int, grams: set[str]) -> Iterable[tuple[int, int, int]]:
    """Maximal pieces of ``src`` found in the holes: (position in prompt, a, b).

    Anchors of ``min_match`` characters are probed every ``stride`` characters of ``src``; a hit
    is grown right and left by binary search; scanning resumes after the grown piece.
    ``grams`` (every ``min_match``-character substring of the prompt) rejects most anchors
    with one set lookup.
    """
    stride = max(min_match // 2, len(src) // max_probes, 1)
    a = 0
    while a + min_match <= len(src):
        anchor = src[a:a + min_match]
        if anchor not in grams or _find_in(prompt, anchor, holes) < 0:
            a += stride
            continue
        b = _longest_extension(prompt, src, a, a + min_match, holes, right=True)
        a0 = _longest_extension(prompt, src, a, b, holes, right=False)
        yield _find_in(prompt, src[a0:b], holes), a0, b
        a = b


def segment_prompt(prompt: str, history: Sequence[TextCall], min_match: int = MIN_MATCH,
                   max_lookback: int = MAX_LOOKBACK, max_probes: int = 256) -> list[tuple]:
    """Parts of ``prompt``: ``("text", s)`` or ``("ref", k, kind, a, b, source_len)``.

    ``history`` holds the workflow's earlier calls in arrival order (the last is k = 1).
    Sources are tried most recent first, each response before its request; whole copies of
    a source are taken first, then partial copies touching the source's start or end (their
    ranges ``[0,b]`` / ``[a,end]`` stay put across workflows), then any partial copy.
    """
    holes = [(0, len(prompt))]
    grams = {prompt[i:i + min_match] for i in range(len(prompt) - min_match + 1)}
    gram_span = [len(prompt)]  # uncovered characters when ``grams`` was last built
    refs: list[tuple[int, tuple]] = []

    def take(pos: int, ref: tuple) -> None:
        refs.append((pos, ref))
        end = pos + ref[4] - ref[3]
        holes[:] = [piece for u, v in holes
                     for piece in ((u, min(v, pos)), (max(u, end), v)) if piece[1] > piece[0]]
        # ``grams`` only rejects anchors early; ``_find_in`` decides within the holes. Once
        # the holes have shrunk to half of what the grams were built from, rebuild it
        # (rebuilding on every take costs O(prompt) each time)
        uncovered = sum(v - u for u, v in holes)
        if uncovered <= gram_span[0] // 2:
            gram_span[0] = uncovered
            grams.clear()
            grams.update(prompt[i:i + min_match]
                         for u, v in holes for i in range(u, v - min_match + 1))

    sources = [(k, kind, getattr(history[-k], kind))
               for k in range(1, min(max_lookback, len(history)) + 1)
               for kind in ("response", "request")]
    sources = [s for s in sources if len(s[2]) >= min_match]
    for k, kind, src in sources:  # whole copies first
        while holes and (pos := _find_in(prompt, src, holes)) >= 0:
            take(pos, ("ref", k, kind, 0, len(src), len(src)))
    for edges_only in (True, False):  # copies of a source's start or end first: stabler ranges
        for k, kind, src in sources:
            if not holes:
                break
            for pos, a, b in _copies(prompt, src, holes, min_match, max_probes, grams):
                if edges_only and 0 < a and b < len(src):
                    continue
                take(pos, ("ref", k, kind, a, b, len(src)))
    parts: list[tuple] = []
    cursor = 0
    for pos, ref in sorted(refs):
        if pos > cursor:
            parts.append(("text", prompt[cursor:pos]))
        parts.append(ref)
        cursor = pos + ref[4] - ref[3]
    if cursor < len(prompt):
        parts.append(("text", prompt[cursor:]))
    return parts


# -- templates --------------------------------------------------------------------------------

def _range(a: int, b: int, source_len: int) -> tuple[int, int | str]:
    """Normalized range: ``end`` when it runs to the source's end."""
    return (a, "end") if b == source_len else (a, b)


def shape_of(parts: Sequence[tuple]) -> tuple:
    """The template key of a segmentation: part kinds and normalized references."""
    return tuple(("text",) if p[0] == "text" else ("ref", p[1], p[2], *_range(p[3], p[4], p[5]))
                 for p in parts)


def candidate_templates(segmentations: Sequence[Sequence[tuple]], workflow_of: Sequence[int],
                        top: int = 5) -> list[list[list]]:
    """Templates from the ``top`` shapes seen in the most workflows.

    A literal part is static when it is the same in every prompt of that shape and those
    prompts come from at least two workflows, else ``["new"]``.
    """
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, seg in enumerate(segmentations):
        groups[shape_of(seg)].append(i)
    ranked = sorted(groups, key=lambda sh: (-len({workflow_of[i] for i in groups[sh]}),
                                            -len(groups[sh]), len(sh), repr(sh)))
    out = []
    for shape in ranked[:top]:
        members = groups[shape]
        several = len({workflow_of[i] for i in members}) > 1
        template: list[list] = []
        for j, part in enumerate(shape):
            if part[0] == "ref":
                template.append(["ref", part[1], part[2], part[3], part[4]])
                continue
            texts = {segmentations[i][j][1] for i in members}
            template.append(["text", texts.pop()] if len(texts) == 1 and several else ["new"])
        out.append(template)
    return out


def template_string(template: Sequence[Sequence]) -> str:
    """``static text${req_1:response:[0,end]}${new}…`` (a literal ``$`` is written ``$$``)."""
    out = []
    for part in template:
        if part[0] == "text":
            out.append(part[1].replace("$", "$$"))
        elif part[0] == "new":
            out.append("${new}")
        else:
            out.append(f"${{req_{part[1]}:{part[2]}:[{part[3]},{part[4]}]}}")
    return "".join(out)


def fill_template(template: Sequence[Sequence], history: Sequence[TextCall]) -> list[str | None]:
    """The template's parts filled from ``history``; None for ``new`` and missing sources."""
    out: list[str | None] = []
    for part in template:
        if part[0] == "text":
            out.append(part[1])
        elif part[0] == "new":
            out.append(None)
        else:
            _, k, kind, a, b = part
            if k > len(history):
                out.append(None)
                continue
            src = getattr(history[-k], kind)
            out.append(src[a:len(src) if b == "end" else b])
    return out


def score_prompt(template: Sequence[Sequence], history: Sequence[TextCall],
                 prompt: str) -> tuple[bool, int]:
    """(rebuilt exactly?, prompt characters reproduced by parts found in order)."""
    pieces = fill_template(template, history)
    exact = all(p is not None for p in pieces) and "".join(pieces) == prompt
    if exact:
        return True, len(prompt)
    covered, cursor = 0, 0
    for piece in pieces:
        if not piece:
            continue
        pos = prompt.find(piece, cursor)
        if pos >= 0:
            covered += len(piece)
            cursor = pos + len(piece)
    return False, covered


# -- store access -----------------------------------------------------------------------------

def load_text_workflows(con: duckdb.DuckDBPyConnection, workflow_type_id: str,
                        max_workflows: int | None = None) -> list[list[TextCall]]:
    """Workflows of a type that carry text, each as its calls (arrival order)."""
    columns = {row[0] for row in con.execute("DESCRIBE calls").fetchall()}
    if not {"messages", "response_text"} <= columns:
        return []
    limit = f"LIMIT {int(max_workflows)}" if max_workflows else ""
    rows = con.execute(f"""
        WITH wf AS (SELECT DISTINCT workflow_id FROM calls
                    WHERE workflow_type_id = ? AND messages IS NOT NULL
                    ORDER BY workflow_id {limit})
        SELECT c.workflow_id, c.agent_id, CAST(c.messages AS VARCHAR), c.response_text
        FROM calls c JOIN wf USING (workflow_id)
        WHERE c.workflow_type_id = ?
        ORDER BY c.workflow_id, c.t_arrival, c.request_id""",
        [workflow_type_id, workflow_type_id]).fetchall()
    out: dict[str, list[TextCall]] = defaultdict(list)
    for wf, agent, messages, response in rows:
        out[wf].append(TextCall(agent, render_prompt(messages), response or ""))
    return list(out.values())


def _calls_with_history(workflows: Iterable[list[TextCall]]):
    """(workflow number, call, the workflow's earlier calls) for every call with a prompt."""
    for w, calls in enumerate(workflows):
        for i, call in enumerate(calls):
            if call.request:
                yield w, call, calls[:i]


def learn_templates(workflows: Iterable[list[TextCall]], min_match: int = MIN_MATCH,
                    max_prompts_per_agent: int = 400) -> dict[str, list[list]]:
    """Template per agent from training workflows (see the module docstring).

    Candidates come from the most common shapes of two segmentations of the agent's prompts:
    of the whole prompts, and of what follows the prefix all of them share (the agent's
    system prompt, typically, then static text). The candidate that rebuilds the most training
    prompts exactly, then covers the most characters, wins.
    """
    per_agent: dict[str, list] = defaultdict(list)
    for w, call, history in _calls_with_history(workflows):
        if len(per_agent[call.agent_id]) < max_prompts_per_agent:
            per_agent[call.agent_id].append((call.request, history, w))
    templates = {}
    for agent, calls in sorted(per_agent.items()):
        workflow_of = [wf for _, _, wf in calls]
        candidates = candidate_templates([segment_prompt(p, h, min_match) for p, h, _ in calls],
                                         workflow_of)
        static = os.path.commonprefix([p for p, _, _ in calls]) if len(calls) > 1 else ""
        if static:
            rests = candidate_templates([segment_prompt(p[len(static):], h, min_match)
                                         for p, h, _ in calls], workflow_of)
            candidates += [[["text", static]] + rest for rest in rests]

        def train_score(template: list) -> tuple[int, int]:
            scores = [score_prompt(template, h, p) for p, h, _ in calls]
            return sum(ok for ok, _ in scores), sum(cov for _, cov in scores)
        templates[agent] = max(candidates, key=train_score)
    return templates


def evaluate_templates(templates: dict[str, list[list]],
                       workflows: Iterable[list[TextCall]]) -> dict:
    """Exact-reconstruction share and covered-character share over held-out prompts."""
    n = exact = chars = covered = 0
    for _, call, history in _calls_with_history(workflows):
        n += 1
        chars += len(call.request)
        template = templates.get(call.agent_id)
        if template is None:
            continue
        ok, cov = score_prompt(template, history, call.request)
        exact += ok
        covered += cov
    return {"n_prompts": n, "exact_share": exact / n if n else None,
            "covered_char_share": covered / chars if chars else None,
            "exact": exact, "chars": chars, "covered_chars": covered}
