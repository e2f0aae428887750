"""Regular expressions over agent names: syntax tree, parsers, printers, simplifier.

Two concrete syntaxes share one tree:

* the **readable** form shown to users and stored in the profile, over whole agent names:
  ``planner (explorer){1,4} (engineer){3,6} reviewer (verifier)?``. Concatenation is
  whitespace, ``|`` is choice, postfix ``*`` ``+`` ``?`` ``{m}`` ``{m,n}`` ``{m,}`` repeat the
  parenthesized group before them. Names are bare when made of letters, digits and ``_ - . : /
  @ #``, otherwise JSON-quoted (``"web search"``).
* the **symbol** form automata-lib reads and writes, where every agent is one character
  (``ab{1,4}c``).

The tree is made of hashable tuples so equal sub-expressions compare equal:
``("sym", name)``, ``("eps",)``, ``("cat", (children…))``, ``("alt", (children…))`` and
``("rep", child, lo, hi)`` with ``hi = None`` for an unbounded repeat (``*`` is (0, None),
``+`` is (1, None), ``?`` is (0, 1)).
"""
from __future__ import annotations

import json
import re
from typing import Callable, Iterable, Iterator, Sequence

Node = tuple

EPS: Node = ("eps",)

# -- construction helpers ---------------------------------------------------------------------


def sym(name: str) -> Node:
    return ("sym", name)


def cat(children: Sequence[Node]) -> Node:
    children = tuple(children)
    if not children:
        return EPS
    return children[0] if len(children) == 1 else ("cat", children)


def alt(children: Sequence[Node]) -> Node:
    children = tuple(children)
    return children[0] if len(children) == 1 else ("alt", children)


def rep(child: Node, lo: int, hi: int | None) -> Node:
    return ("rep", child, int(lo), None if hi is None else int(hi))


def walk(node: Node, path: tuple[int, ...] = ()) -> Iterator[tuple[tuple[int, ...], Node]]:
    """Every (path, sub-node) pair, parents before children; a path lists child indices."""
    yield path, node
    if node[0] in ("cat", "alt"):
        for i, child in enumerate(node[1]):
            yield from walk(child, path + (i,))
    elif node[0] == "rep":
        yield from walk(node[1], path + (0,))


def replace_at(node: Node, path: tuple[int, ...], new: Node) -> Node:
    """Copy of ``node`` with the sub-node at ``path`` replaced by ``new``."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if node[0] in ("cat", "alt"):
        children = list(node[1])
        children[head] = replace_at(children[head], rest, new)
        return (node[0], tuple(children))
    if node[0] == "rep":
        return ("rep", replace_at(node[1], rest, new), node[2], node[3])
    raise ValueError(f"path {path} goes below a leaf")


def map_symbols(node: Node, leaf: Callable[[str], Node]) -> Node:
    """Copy of ``node`` with every ``("sym", name)`` leaf replaced by ``leaf(name)``."""
    kind = node[0]
    if kind == "sym":
        return leaf(node[1])
    if kind == "eps":
        return node
    if kind in ("cat", "alt"):
        return (kind, tuple(map_symbols(c, leaf) for c in node[1]))
    return rep(map_symbols(node[1], leaf), node[2], node[3])


def symbols(node: Node) -> set[str]:
    return {n[1] for _, n in walk(node) if n[0] == "sym"}


def nullable(node: Node) -> bool:
    """Does the expression accept the empty sequence?"""
    kind = node[0]
    if kind == "eps":
        return True
    if kind == "sym":
        return False
    if kind == "cat":
        return all(nullable(c) for c in node[1])
    if kind == "alt":
        return any(nullable(c) for c in node[1])
    return node[2] == 0 or nullable(node[1])


# -- tokenizing and parsing -------------------------------------------------------------------

class RegexSyntaxError(ValueError):
    """A regex string that does not parse; the message names the position."""


_QUANT = re.compile(r"\{(\d+)(?:(,)(\d*))?\}")
_READABLE_TOKEN = re.compile(
    r'\s*(?:(?P<op>[()|*+?])|(?P<quant>\{\d+(?:,\d*)?\})|(?P<quoted>"(?:[^"\\]|\\.)*")'
    r'|(?P<name>[^\s()|*+?{}"]+))')
_BARE_NAME = re.compile(r"[A-Za-z0-9_\-.:/@#]+")


def _quantifier(text: str) -> tuple[int, int | None]:
    m = _QUANT.fullmatch(text)
    lo = int(m.group(1))
    if m.group(2) is None:
        return lo, lo
    return lo, int(m.group(3)) if m.group(3) else None


def tokenize_readable(text: str) -> list[tuple]:
    """Tokens of the readable form: ("op", c), ("q", lo, hi), ("sym", name), with positions."""
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _READABLE_TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise RegexSyntaxError(f"unexpected character {text[pos]!r} at position {pos} in "
                                   f"regex {text!r}")
        start = m.start(m.lastgroup)
        if m.group("op"):
            op = m.group("op")
            if op in "*+?":
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[op]
                tokens.append(("q", lo, hi, start))
            else:
                tokens.append(("op", op, start))
        elif m.group("quant"):
            lo, hi = _quantifier(m.group("quant"))
            tokens.append(("q", lo, hi, start))
        elif m.group("quoted"):
            tokens.append(("sym", json.loads(m.group("quoted")), start))
        else:
            tokens.append(("sym", m.group("name"), start))
        pos = m.end()
    return tokens


def tokenize_symbols(text: str) -> list[tuple]:
    """Tokens of the one-character-per-symbol form written by automata-lib."""
    tokens, pos = [], 0
    while pos < len(text):
        c = text[pos]
        if c in "()|":
            tokens.append(("op", c, pos))
        elif c in "*+?":
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            tokens.append(("q", lo, hi, pos))
        elif c == "{":
            m = _QUANT.match(text, pos)
            if m is None:
                raise RegexSyntaxError(f"bad quantifier at position {pos} in {text!r}")
            lo, hi = _quantifier(m.group(0))
            tokens.append(("q", lo, hi, pos))
            pos = m.end()
            continue
        else:
            tokens.append(("sym", c, pos))
        pos += 1
    return tokens


class _Parser:
    def __init__(self, tokens: list[tuple], text: str):
        self.tokens, self.text, self.i = tokens, text, 0

    def peek(self) -> tuple | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def error(self, what: str) -> RegexSyntaxError:
        tok = self.peek()
        where = f"position {tok[-1]}" if tok else "the end"
        return RegexSyntaxError(f"{what} at {where} in regex {self.text!r}")

    def parse(self) -> Node:
        node = self.alternation()
        if self.peek() is not None:
            raise self.error("unexpected token")
        return node

    def alternation(self) -> Node:
        branches = [self.concatenation()]
        while (tok := self.peek()) is not None and tok[:2] == ("op", "|"):
            self.i += 1
            branches.append(self.concatenation())
        return alt(branches)

    def concatenation(self) -> Node:
        items = []
        while (tok := self.peek()) is not None and not (tok[0] == "op" and tok[1] in ")|"):
            items.append(self.postfix())
        return cat(items)

    def postfix(self) -> Node:
        node = self.atom()
        while (tok := self.peek()) is not None and tok[0] == "q":
            if tok[2] is not None and tok[1] > tok[2]:
                raise self.error(f"repeat bounds {{{tok[1]},{tok[2]}}} are reversed")
            node = rep(node, tok[1], tok[2])
            self.i += 1
        return node

    def atom(self) -> Node:
        tok = self.peek()
        if tok is None:
            raise self.error("expected a name or '('")
        if tok[0] == "sym":
            self.i += 1
            return sym(tok[1])
        if tok[:2] == ("op", "("):
            self.i += 1
            inner = self.alternation()
            if self.peek() is None or self.peek()[:2] != ("op", ")"):
                raise self.error("expected ')'")
            self.i += 1
            return inner
        raise self.error(f"unexpected {tok[1]!r}")


def parse_readable(text: str) -> Node:
    """Tree of a readable regex over agent names (raises :class:`RegexSyntaxError`)."""
    return _Parser(tokenize_readable(text), text).parse()


def parse_symbols(text: str) -> Node:
    """Tree of an automata-lib regex (one character per symbol)."""
    return _Parser(tokenize_symbols(text), text).parse()


# -- printing ---------------------------------------------------------------------------------

def _quant_text(lo: int, hi: int | None) -> str:
    if (lo, hi) == (0, None):
        return "*"
    if (lo, hi) == (1, None):
        return "+"
    if (lo, hi) == (0, 1):
        return "?"
    if hi is None:
        return f"{{{lo},}}"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def _name_text(name: str) -> str:
    return name if _BARE_NAME.fullmatch(name) else json.dumps(name)


def to_readable(node: Node) -> str:
    """Readable form; every repeated item is parenthesized: ``(engineer){3,6}``."""
    kind = node[0]
    if kind == "sym":
        return _name_text(node[1])
    if kind == "eps":
        return "()"
    if kind == "cat":
        return " ".join(f"({to_readable(c)})" if c[0] == "alt" else to_readable(c)
                        for c in node[1])
    if kind == "alt":
        return " | ".join(to_readable(c) for c in node[1])
    return f"({to_readable(node[1])}){_quant_text(node[2], node[3])}"


def to_symbols(node: Node, char_of: Callable[[str], str]) -> str:
    """automata-lib form, mapping each name to one character with ``char_of``."""
    kind = node[0]
    if kind == "sym":
        return char_of(node[1])
    if kind == "eps":
        return "()"
    if kind == "cat":
        return "".join(f"({to_symbols(c, char_of)})" if c[0] == "alt" else
                       to_symbols(c, char_of) for c in node[1])
    if kind == "alt":
        return "|".join(to_symbols(c, char_of) for c in node[1])
    return f"({to_symbols(node[1], char_of)}){_quant_text(node[2], node[3])}"


def to_python(node: Node, char_of: Callable[[str], str],
              group_path: tuple[int, ...] | None = None, _path: tuple[int, ...] = ()) -> str:
    """Python ``re`` pattern; the sub-node at ``group_path`` is captured as group ``loop``."""
    kind = node[0]
    if kind == "sym":
        out = re.escape(char_of(node[1]))
    elif kind == "eps":
        out = ""
    elif kind == "cat":
        out = "".join(to_python(c, char_of, group_path, _path + (i,))
                      for i, c in enumerate(node[1]))
    elif kind == "alt":
        out = "(?:" + "|".join(to_python(c, char_of, group_path, _path + (i,))
                               for i, c in enumerate(node[1])) + ")"
    else:
        out = f"(?:{to_python(node[1], char_of, group_path, _path + (0,))})" + \
            _quant_text(node[2], node[3])
    return f"(?P<loop>{out})" if _path == group_path else out


# -- simplification ---------------------------------------------------------------------------

def _bounds(node: Node) -> tuple[Node, int, int | None]:
    return (node[1], node[2], node[3]) if node[0] == "rep" else (node, 1, 1)


def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def _simplify_cat(children: list[Node]) -> Node:
    flat: list[Node] = []
    for c in children:
        if c[0] == "cat":
            flat.extend(c[1])
        elif c != EPS:
            flat.append(c)
    # x x{m,n} -> x{m+1,n+1}; x* x* -> x*; x x -> x{2}
    out: list[Node] = []
    for c in flat:
        if out:
            base1, lo1, hi1 = _bounds(out[-1])
            base2, lo2, hi2 = _bounds(c)
            if base1 == base2:
                out[-1] = rep(base1, lo1 + lo2, _add(hi1, hi2))
                continue
        out.append(c)
    # (a b){m,n} next to "a b" -> (a b){m+1,n+1}
    i = 0
    while i < len(out):
        node = out[i]
        if node[0] == "rep" and node[1][0] == "cat":
            body = list(node[1][1])
            k = len(body)
            if i >= k and out[i - k:i] == body:
                out[i - k:i + 1] = [rep(node[1], node[2] + 1, _add(node[3], 1))]
                i -= k
                continue
            if out[i + 1:i + 1 + k] == body:
                out[i:i + 1 + k] = [rep(node[1], node[2] + 1, _add(node[3], 1))]
                continue
        i += 1
    return cat(out)


def _first_rest(node: Node) -> tuple[Node, Node]:
    if node[0] == "cat":
        return node[1][0], cat(node[1][1:])
    return node, EPS


def _last_rest(node: Node) -> tuple[Node, Node]:
    if node[0] == "cat":
        return node[1][-1], cat(node[1][:-1])
    return node, EPS


def _factor(members: list[Node], split: Callable, prefix: bool) -> list[Node] | None:
    """Factor members sharing a first (or last) element; None when nothing is shared."""
    groups: dict[Node, list[int]] = {}
    for i, m in enumerate(members):
        groups.setdefault(split(m)[0], []).append(i)
    shared = next((idx for idx in groups.values() if len(idx) > 1), None)
    if shared is None:
        return None
    head = split(members[shared[0]])[0]
    rests = alt(tuple(dict.fromkeys(split(members[i])[1] for i in shared)))
    factored = cat((head, rests)) if prefix else cat((rests, head))
    out = [m for i, m in enumerate(members) if i not in shared[1:]]
    out[out.index(members[shared[0]])] = factored
    return out


def _simplify_alt(children: list[Node]) -> Node:
    flat: list[Node] = []
    for c in children:
        flat.extend(c[1] if c[0] == "alt" else (c,))
    members = list(dict.fromkeys(flat))
    if EPS in members:
        rest = [m for m in members if m != EPS]
        if not rest:
            return EPS
        return rep(_simplify_alt(rest), 0, 1)
    for split, prefix in ((_first_rest, True), (_last_rest, False)):
        factored = _factor(members, split, prefix)
        if factored is not None:
            return alt(factored)
    return alt(members)


def _simplify_rep(child: Node, lo: int, hi: int | None) -> Node:
    if child == EPS or hi == 0:
        return EPS
    if (lo, hi) == (1, 1):
        return child
    if child[0] == "rep":
        c, ilo, ihi = child[1], child[2], child[3]
        if ilo in (0, 1) and lo in (0, 1) and (ihi is None or hi is None):
            return rep(c, ilo * lo, None)
        if (ilo, ihi) == (0, 1) and (lo, hi) == (0, 1):
            return child
    if lo == 0 and hi == 1 and nullable(child):
        return child
    return rep(child, lo, hi)


# -- unary sub-expressions: counting how many times one name repeats --------------------------

Intervals = list  # sorted disjoint [(lo, hi | None)], hi None = unbounded

_MAX_UNARY_REPEAT = 512


def _normalize(intervals: Iterable[tuple[int, int | None]]) -> Intervals:
    out: Intervals = []
    for lo, hi in sorted(intervals, key=lambda iv: iv[0]):
        if out and (out[-1][1] is None or lo <= out[-1][1] + 1):
            plo, phi = out[-1]
            out[-1] = (plo, None if phi is None or hi is None else max(phi, hi))
        else:
            out.append((lo, hi))
    return out


def _sumset(a: Intervals, b: Intervals) -> Intervals:
    return _normalize((x0 + y0, _add(x1, y1)) for x0, x1 in a for y0, y1 in b)


def unary_counts(node: Node) -> Intervals | None:
    """For an expression over a single name, the set of repeat counts it accepts, as intervals.

    ``(e (e){1,2})?`` accepts 0, 1, 2 or 3 copies: ``[(0, 3)]``. None when the set is not
    easily computed (huge bounds, unbounded repeats of bodies that cannot repeat once).
    """
    kind = node[0]
    if kind == "eps":
        return [(0, 0)]
    if kind == "sym":
        return [(1, 1)]
    if kind in ("cat", "alt"):
        parts = [unary_counts(c) for c in node[1]]
        if any(p is None for p in parts):
            return None
        if kind == "alt":
            return _normalize(iv for p in parts for iv in p)
        total: Intervals = [(0, 0)]
        for p in parts:
            total = _sumset(total, p)
        return total
    body = unary_counts(node[1])
    lo, hi = node[2], node[3]
    if body is None or lo > _MAX_UNARY_REPEAT or (hi is not None and hi > _MAX_UNARY_REPEAT):
        return None
    power: Intervals = [(0, 0)]
    for _ in range(lo):
        power = _sumset(power, body)
    if hi is None:
        if not any(a <= 1 and (b is None or b >= 1) for a, b in body):
            return None  # body cannot repeat one at a time: the tail is not an interval
        return _normalize((a, None) for a, _ in power)
    out = list(power)
    for _ in range(lo, hi):
        power = _sumset(power, body)
        out.extend(power)
    return _normalize(out)


def _collapse_unary(node: Node) -> Node | None:
    """``x{a,b}`` for a single-name expression accepting exactly a..b copies, else None."""
    names = symbols(node)
    if len(names) != 1:
        return None
    counts = unary_counts(node)
    if counts is None or len(counts) != 1:
        return None
    lo, hi = counts[0]
    return _simplify_rep(sym(next(iter(names))), lo, hi)


def _collapse_unary_runs(children: list[Node]) -> list[Node]:
    out: list[Node] = []
    run: list[Node] = []

    def flush() -> None:
        if len(run) > 1 and (collapsed := _collapse_unary(cat(run))) is not None:
            out.append(collapsed)
        else:
            out.extend(run)
        run.clear()

    for c in children:
        names = symbols(c)
        if len(names) == 1 and run and symbols(run[0]) == names:
            run.append(c)
            continue
        flush()
        if len(names) == 1:
            run.append(c)
        else:
            out.append(c)
    flush()
    return out


def _simplify_once(node: Node) -> Node:
    kind = node[0]
    if kind in ("sym", "eps"):
        return node
    if kind == "cat":
        out = _simplify_cat(_collapse_unary_runs([_simplify_once(c) for c in node[1]]))
    elif kind == "alt":
        out = _simplify_alt([_simplify_once(c) for c in node[1]])
    else:
        out = _simplify_rep(_simplify_once(node[1]), node[2], node[3])
    if out[0] in ("cat", "alt", "rep") and not (out[0] == "rep" and out[1][0] == "sym"):
        collapsed = _collapse_unary(out)
        if collapsed is not None:
            return collapsed
    return out


def simplify(node: Node, max_rounds: int = 50) -> Node:
    """Language-preserving rewrites until nothing changes.

    Flatten nested sequences and choices, drop duplicates, ``(x|)`` → ``(x)?``, factor shared
    prefixes/suffixes out of choices (``a b | a c`` → ``a (b | c)``), merge neighbouring
    repeats of the same item (``x (x)*`` → ``(x)+``, ``x (x){2,4}`` → ``(x){3,5}``) and
    collapse nested repeats (``((x)?)*`` → ``(x)*``).
    """
    for _ in range(max_rounds):
        new = _simplify_once(node)
        if new == node:
            return node
        node = new
    return node
