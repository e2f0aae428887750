"""HTML scaffolding of the report: one file, inline CSS and a few lines of inline JS, no
external resource of any kind (the page works offline and from ``file://``)."""
from __future__ import annotations

import math
import re
from html import escape
from typing import Any, Iterable

CSS = """
:root { --ink: #1a202c; --muted: #718096; --line: #e2e8f0; --accent: #2b6cb0; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       margin: 0; background: #f7fafc; }
header { background: #1a365d; color: #fff; padding: 18px 28px; }
header h1 { margin: 0 0 4px; font-size: 22px; }
header .meta { color: #cbd5e0; font-size: 13px; }
main { padding: 12px 28px 40px; max-width: 1500px; }
nav { margin: 10px 0 18px; font-size: 13px; }
nav a { margin-right: 14px; color: var(--accent); text-decoration: none; }
section.wt, section.eval { background: #fff; border: 1px solid var(--line); border-radius: 8px;
       padding: 14px 20px 18px; margin: 18px 0; }
h2 { margin: 4px 0 8px; font-size: 19px; }
h3 { margin: 18px 0 6px; font-size: 15px; color: #2d3748; }
.note { color: var(--muted); font-size: 12.5px; }
.graph-box { overflow-x: auto; border: 1px solid var(--line); border-radius: 6px; background: #fcfdff;
             padding: 6px; }
.graph-box svg { display: block; margin: 0 auto; max-width: 100%; height: auto; }
.wf-graph .node-label { font: 600 12px system-ui, sans-serif; fill: #1a202c; }
.wf-graph .edge-label { font: 11px system-ui, sans-serif; paint-order: stroke; stroke: #fcfdff;
                        stroke-width: 3px; stroke-linejoin: round; }
.wf-graph .edge:hover path { opacity: 1; stroke-width: 6; }
.hide-pruned .edge.pruned { display: none; }
.hide-rare .edge.rare { display: none; }
code.regex { display: block; background: #f7fafc; border: 1px solid var(--line); border-radius: 6px;
             padding: 8px 10px; font: 13px ui-monospace, SFMono-Regular, Menlo, monospace;
             white-space: pre-wrap; word-break: break-word; }
.grid { display: flex; flex-wrap: wrap; gap: 10px; }
.grid figure { margin: 0; background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 4px; }
.grid img { display: block; width: 420px; max-width: 100%; height: auto; }
img.wide { width: 720px; max-width: 100%; }
table { border-collapse: collapse; font-size: 12.5px; margin: 6px 0; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 10px 3px 0; text-align: left; }
td.num, th.num { text-align: right; }
tr.pruned td { color: var(--muted); }
tr.warn td { background: #fffaf0; }
.badge { display: inline-block; border-radius: 10px; padding: 1px 8px; font-size: 11.5px; white-space: nowrap; }
.badge.warn { background: #feebc8; color: #7b341e; border: 1px solid #f6ad55; }
figcaption { padding: 2px 4px; }
.legend span { display: inline-block; margin-right: 16px; }
.swatch { display: inline-block; width: 26px; height: 0; border-top: 3px solid #2b6cb0; vertical-align: middle;
          margin-right: 5px; }
.swatch.pruned { border-top: 3px dashed #a0aec0; }
.swatch.back { width: 22px; height: 10px; border: 2px solid #2b6cb0; border-left: none; border-radius: 0 8px 8px 0; }
"""

JS = """
(function () {
  [['toggle-pruned', 'hide-pruned'], ['toggle-rare', 'hide-rare']].forEach(function (pair) {
    document.querySelectorAll('input.' + pair[0]).forEach(function (box) {
      var target = document.getElementById(box.getAttribute('data-target'));
      function apply() { if (target) { target.classList.toggle(pair[1], !box.checked); } }
      box.addEventListener('change', apply);
      apply();
    });
  });
  var graphs = document.querySelectorAll('svg.wf-graph').length;
  document.body.setAttribute('data-graphs', String(graphs));
  document.body.setAttribute('data-ready', '1');
})();
"""


def slug(text: str) -> str:
    """An HTML id made of the text's letters and digits."""
    return "wt-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x")


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return escape(str(value))


def table(headers: Iterable[str], rows: Iterable[Iterable[Any]], numeric: set[int] | None = None,
          row_classes: Iterable[str] | None = None, raw: set[int] | None = None) -> str:
    """An HTML table; cells are escaped and formatted by :func:`fmt`, except the columns in
    ``raw``, which hold ready HTML (e.g. a badge)."""
    numeric = numeric or set()
    raw = raw or set()
    head = "".join(f'<th class="num">{escape(h)}</th>' if i in numeric else f"<th>{escape(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    classes = list(row_classes) if row_classes is not None else None
    for r, row in enumerate(rows):
        cls = f' class="{classes[r]}"' if classes and classes[r] else ""
        cells = "".join(f"<td>{v}</td>" if i in raw else
                        f'<td class="num">{fmt(v)}</td>' if i in numeric else f"<td>{fmt(v)}</td>"
                        for i, v in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def figure(uri: str, alt: str, wide: bool = False, caption: str = "") -> str:
    """An inline chart; ``caption`` is ready HTML (e.g. a warning badge) shown under it."""
    cls = ' class="wide"' if wide else ""
    cap = f"<figcaption>{caption}</figcaption>" if caption else ""
    return f'<figure><img{cls} src="{uri}" alt="{escape(alt)}">{cap}</figure>'


def document(title: str, header_meta: str, nav: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{escape(title)}</h1><div class=\"meta\">{header_meta}</div></header>"
        f"<main><nav>{nav}</nav>{body}</main><script>{JS}</script></body></html>\n"
    )
