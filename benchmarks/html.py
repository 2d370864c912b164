"""The benchmarks' one HTML writer: every benchmark's ``--html`` report goes through
:func:`write_page`; and :func:`write_json`, for the ``--json`` documents that hold NaN.

A page has a title, the command line that produced it (:func:`command_line`), then sections
(:class:`Section`) of preformatted text, tables (:class:`Table`, which also renders as Markdown
for the docs and as aligned text for a terminal) and Plotly figures, with plotly.js inline from
the plotly package (no CDN: the file works offline).
"""

from __future__ import annotations

import html
import json
import math
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs


@dataclass(frozen=True)
class Table:
    """Rows of cells under column titles; cells come formatted, units in the titles."""

    columns: Sequence[str]
    rows: Sequence[Sequence[object]]

    def markdown(self) -> str:
        """A Markdown table, each cell on one line (its whitespace collapsed, ``|`` escaped)."""

        def line(cells: Sequence[object]) -> str:
            text = (" ".join(str(c).split()).replace("|", "\\|") for c in cells)
            return "| " + " | ".join(text) + " |"

        return "\n".join(
            [line(self.columns), "|" + "---|" * len(self.columns), *map(line, self.rows)]
        )

    def text(self) -> str:
        """Aligned plain text for a terminal: the first column to the left, the rest right."""
        cells = [[str(c) for c in self.columns], *([str(c) for c in row] for row in self.rows)]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        return "\n".join(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
            for row in cells
        )

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
            for row in self.rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass(frozen=True)
class Section:
    """A heading, then preformatted ``text`` (what the command printed), tables and figures."""

    title: str
    text: str = ""
    tables: Sequence[Table] = ()
    figures: Sequence[go.Figure] = ()

    def html(self) -> str:
        parts = [f"<h2>{html.escape(self.title)}</h2>"] if self.title else []
        if self.text:
            parts.append(f"<pre>{html.escape(self.text)}</pre>")
        parts += [t.html() for t in self.tables]
        parts += [
            f"<div>{f.to_html(full_html=False, include_plotlyjs=False)}</div>" for f in self.figures
        ]
        return "".join(parts)


def arguments(argv: Sequence[str] | None = None) -> list[str]:
    """A benchmark's arguments: ``argv``, or ``sys.argv``'s when it is None."""
    return list(sys.argv[1:] if argv is None else argv)


def command_line(module: str, argv: Sequence[str] | None = None) -> str:
    """How the report was asked for: ``python -m MODULE`` and its :func:`arguments`."""
    return shlex.join(["python", "-m", module, *arguments(argv)])


def jsonable(value: object) -> object:
    """``value`` as JSON has it: NaN and infinities null (JSON has no such numbers), tuples
    lists, and a tuple key its parts joined by "@" (``(0.5, "pacing")`` -> ``"0.5@pacing"``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {_key(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def _key(key: object) -> object:
    if not isinstance(key, tuple):
        return key
    return "@".join(f"{p:g}" if isinstance(p, float) else str(p) for p in key)


# An array of numbers (or nulls) only, as json.dumps indents it: one element a line.
_FLAT_ARRAY = re.compile(r"\[\s+((?:-?[0-9.eE+-]+|null)(?:,\s+(?:-?[0-9.eE+-]+|null))*)\s+\]")


def write_json(path: str | Path, doc: object) -> None:
    """Write ``doc`` (through :func:`jsonable`) to ``path``, indented, an array of numbers on
    one line (a curve would take a line a number); its parent folders made."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(jsonable(doc), indent=2)
    text = _FLAT_ARRAY.sub(lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)
    out.write_text(text + "\n", encoding="utf-8")


_STYLE = (
    "body{font-family:sans-serif;margin:2em}pre{font-size:12px;overflow-x:auto}"
    "table{border-collapse:collapse;font-size:13px;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}code{font-size:13px}"
)


def write_page(path: str | Path, title: str, sections: Sequence[Section], *, command: str) -> None:
    """Write one self-contained report: ``title``, the ``command`` that produced it, then the
    sections in order (their parent folders made)."""
    page = (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>"
        f'<script type="text/javascript">{get_plotlyjs()}</script>'
        f"<style>{_STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>Produced by <code>{html.escape(command)}</code></p>"
        + "".join(s.html() for s in sections)
        + "</body></html>\n"
    )
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
