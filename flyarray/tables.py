"""The tables that fa.explain, fa.profile and fa.inspect print (text) and show in a notebook (HTML)."""
from __future__ import annotations

import html


def text_rows(columns, rows, numeric_from=None) -> list:
    """Aligned lines (two-space indent) of a header, a rule and ``rows`` (lists of strings). Columns
    from ``numeric_from`` on are right-aligned (numbers), the others left-aligned."""
    table = [list(columns)] + [list(r) for r in rows]
    widths = [max(len(r[c]) for r in table) for c in range(len(columns))]
    first = len(columns) if numeric_from is None else numeric_from
    lines = []
    for j, row in enumerate(table):
        cells = [cell.ljust(w) if c < first else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths))]
        lines.append(("  " + " | ".join(cells)).rstrip())
        if j == 0:
            lines.append("  " + "-+-".join("-" * w for w in widths))
    return lines


def html_table(columns, rows) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
