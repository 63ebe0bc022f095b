"""A report as blocks, rendered twice: Markdown for a code host, and one HTML file (styles
inline, no script, nothing fetched from elsewhere). Charts are SVG files beside both pages,
which point to the same files, so each image exists once.

Every string is escaped where it is written, so text from records (a reason quoting a
library's message, a backend's name) can neither break a table nor inject markup.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from attnbench.runs.record_files import write_atomic


@dataclass(frozen=True)
class Bold:
    text: str


@dataclass(frozen=True)
class Link:
    text: str
    href: str
    md_href: str = ""  # where the Markdown version points, when it differs (index.md)


Inline = str | Bold | Link


@dataclass
class Heading:
    level: int
    text: str
    anchor: str = ""


@dataclass
class Para:
    parts: list[Inline]


@dataclass
class Bullets:
    items: list[list[Inline]]


@dataclass
class Table:
    frame: pd.DataFrame
    caption: str = ""


@dataclass
class Figure:
    file: str  # beside the report's index files
    alt: str
    caption: str = ""


@dataclass
class Figures:
    figures: list[Figure] = field(default_factory=list)


@dataclass
class Details:
    """One collapsed line (HTML ``<details>``): what a reader rarely needs, kept out of the
    way but never dropped."""
    summary: str
    items: list[list[Inline]] = field(default_factory=list)


Block = Heading | Para | Bullets | Table | Figures | Details

MD_SPECIAL = re.compile(r"([\\`*\[\]|<>#])")
# An underscore inside a word (sliding_window) is literal in GitHub's Markdown; one at a word's
# edge could start emphasis.
MD_EDGE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def md_escape(text) -> str:
    """Text as Markdown shows it literally: specials backslash-escaped, '&' as an entity, on
    one line."""
    text = str(text).replace("&", "&amp;").replace("\r", " ").replace("\n", " ")
    return MD_EDGE_UNDERSCORE.sub(r"\\_", MD_SPECIAL.sub(r"\\\1", text))


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


def anchors(blocks: list[Block]) -> None:
    """A unique anchor for every heading that has none."""
    seen: set[str] = set()
    for b in blocks:
        if isinstance(b, Heading) and not b.anchor:
            base = slug(b.text)
            a, n = base, 2
            while a in seen:
                a, n = f"{base}-{n}", n + 1
            b.anchor = a
            seen.add(a)


# ---- Markdown ---------------------------------------------------------------------------


def _md_inline(parts: list[Inline]) -> str:
    out = []
    for p in parts:
        if isinstance(p, Bold):
            out.append(f"**{md_escape(p.text)}**")
        elif isinstance(p, Link):
            href = p.md_href or p.href
            out.append(f"[{md_escape(p.text)}]({href.replace(' ', '%20').replace(')', '%29')})")
        else:
            out.append(md_escape(p))
    return "".join(out)


def _shown(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with a meaningful index turned into leading columns."""
    if isinstance(frame.index, pd.RangeIndex) and frame.index.name is None:
        return frame
    return frame.reset_index()


def _md_table(t: Table) -> str:
    f = _shown(t.frame)
    if f.empty:
        return "_none_\n"
    head = "| " + " | ".join(md_escape(c) for c in f.columns) + " |"
    sep = "|" + "---|" * len(f.columns)
    rows = ["| " + " | ".join(_md_cell(v) for v in r) + " |" for r in f.itertuples(index=False)]
    caption = f"_{md_escape(t.caption)}_\n\n" if t.caption else ""
    return caption + "\n".join([head, sep, *rows]) + "\n"


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return ""
    return str(v)


def _md_cell(v) -> str:
    """A table cell: a Link or a list of inline parts as such, anything else as text."""
    if isinstance(v, (Link, Bold)):
        return _md_inline([v])
    if isinstance(v, list):
        return _md_inline(v)
    return md_escape(_cell(v))


def _html_cell(v) -> str:
    if isinstance(v, (Link, Bold)):
        return _html_inline([v])
    if isinstance(v, list):
        return _html_inline(v)
    return esc(_cell(v))


def to_markdown(blocks: list[Block]) -> str:
    out = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"{'#' * b.level} {md_escape(b.text)}\n")
        elif isinstance(b, Para):
            out.append(_md_inline(b.parts) + "\n")
        elif isinstance(b, Bullets):
            out.append("\n".join(f"- {_md_inline(item)}" for item in b.items) + "\n")
        elif isinstance(b, Table):
            out.append(_md_table(b))
        elif isinstance(b, Details):
            items = "\n".join(f"- {_md_inline(item)}" for item in b.items)
            out.append(f"<details><summary>{esc(b.summary)}</summary>\n\n{items}\n\n"
                       f"</details>\n")
        elif isinstance(b, Figures):
            for fig in b.figures:
                out.append(f"![{md_escape(fig.alt)}]({fig.file})\n")
                if fig.caption:
                    out.append(f"_{md_escape(fig.caption)}_\n")
    return "\n".join(out)


# ---- HTML -------------------------------------------------------------------------------

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1a1a1a;
background:#fff;max-width:1320px;margin:1.5em auto;padding:0 1em;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:1.8em}h3{margin-top:1.4em}
nav ol{columns:2;font-size:.92em}
.scroll{overflow-x:auto;margin:.6em 0}
table{border-collapse:collapse;font-size:12.5px}
caption{caption-side:top;text-align:left;font-style:italic;padding:.2em 0}
td,th{border:1px solid #c8c8c8;padding:2px 7px;text-align:left;vertical-align:top}
thead th{background:#f1f3f5}tbody th{background:#fafafa;font-weight:normal}
.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:1em}
figure{margin:0;border:1px solid #e3e3e3;padding:.4em;background:#fff}
figure.wide{grid-column:1/-1}figure img{max-width:100%;height:auto;display:block}
figcaption{font-size:.85em;color:#333;margin-top:.3em}
code{background:#f3f3f3;padding:0 .2em}
details{margin:.6em 0;color:#444}summary{cursor:pointer}
"""


def _html_inline(parts: list[Inline]) -> str:
    out = []
    for p in parts:
        if isinstance(p, Bold):
            out.append(f"<strong>{esc(p.text)}</strong>")
        elif isinstance(p, Link):
            out.append(f'<a href="{esc(p.href)}">{esc(p.text)}</a>')
        else:
            out.append(esc(p))
    return "".join(out)


def _spans(index: list[tuple]) -> list[list[int]]:
    """Per row and index level, how many rows its header cell spans: 0 where the cell above
    covers it (the same value, under the same values of the levels to its left)."""
    spans = [[0] * len(row) for row in index]
    for level in range(len(index[0]) if index else 0):
        start = 0
        for i, row in enumerate(index):
            if i == 0 or row[:level + 1] != index[i - 1][:level + 1]:
                start = i
            spans[start][level] += 1
    return spans


def _html_table(t: Table) -> str:
    """A table as small as HTML allows: repeated row headers merged (rowspan), and the end
    tags of cells and rows left out, which HTML makes optional."""
    frame = t.frame
    if frame.empty:
        return "<p>(none)</p>"
    has_index = not (isinstance(frame.index, pd.RangeIndex) and frame.index.name is None)
    index_names = [n or "" for n in frame.index.names] if has_index else []
    head = "".join(f"<th>{esc(c)}" for c in [*index_names, *frame.columns])
    index = [tuple(_cell(v) for v in (i if isinstance(i, tuple) else (i,))) if has_index
             else () for i in frame.index]
    spans = _spans(index)
    body = []
    for idx, span, row in zip(index, spans, frame.itertuples(index=False)):
        cells = "".join(f"<th{f' rowspan={n}' if n > 1 else ''}>{esc(i)}"
                        for i, n in zip(idx, span) if n)
        cells += "".join(f"<td>{_html_cell(v)}" for v in row)
        body.append(f"<tr>{cells}")
    caption = f"<caption>{esc(t.caption)}</caption>" if t.caption else ""
    return (f'<div class="scroll"><table>{caption}<thead><tr>{head}</thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


SVG_SIZE = re.compile(rb'<svg[^>]*?\swidth="([\d.]+)pt"[^>]*?\sheight="([\d.]+)pt"', re.S)


def svg_size(data: bytes) -> tuple[int, int] | None:
    """Width and height in CSS pixels from an SVG's header (matplotlib writes points)."""
    m = SVG_SIZE.search(data[:2000])
    if not m:
        return None
    return round(float(m.group(1)) * 4 / 3), round(float(m.group(2)) * 4 / 3)


def _html_figures(figs: Figures, folder: Path) -> str:
    out = []
    for fig in figs.figures:
        path = folder / fig.file
        size = svg_size(path.read_bytes()) if path.is_file() else None
        dims = f' width="{size[0]}" height="{size[1]}"' if size else ""
        caption = f"<figcaption>{esc(fig.caption)}</figcaption>" if fig.caption else ""
        wide = ' class="wide"' if size and size[0] > 900 else ""  # a row of its own
        out.append(f'<figure id="{esc(slug(fig.file))}"{wide}><img src="{esc(fig.file)}" '
                   f'alt="{esc(fig.alt)}"{dims}>{caption}</figure>')
    return f'<div class="figs">{"".join(out)}</div>'


def _toc(blocks: list[Block]) -> str:
    items = [f'<li><a href="#{esc(b.anchor)}">{esc(b.text)}</a></li>'
             for b in blocks if isinstance(b, Heading) and b.level == 2]
    return f'<nav aria-label="Contents"><ol>{"".join(items)}</ol></nav>' if items else ""


def to_html(blocks: list[Block], folder: Path, title: str) -> str:
    """One page: its charts are the files beside it, no script, no remote asset."""
    anchors(blocks)
    body = []
    for i, b in enumerate(blocks):
        if isinstance(b, Heading):
            body.append(f'<h{b.level} id="{esc(b.anchor)}">{esc(b.text)}</h{b.level}>')
            if b.level == 1 and i == 0:
                body.append(_toc(blocks))
        elif isinstance(b, Para):
            body.append(f"<p>{_html_inline(b.parts)}</p>")
        elif isinstance(b, Bullets):
            items = "".join(f"<li>{_html_inline(item)}</li>" for item in b.items)
            body.append(f"<ul>{items}</ul>")
        elif isinstance(b, Table):
            body.append(_html_table(b))
        elif isinstance(b, Figures):
            body.append(_html_figures(b, folder))
        elif isinstance(b, Details):
            items = "".join(f"<li>{_html_inline(item)}</li>" for item in b.items)
            body.append(f"<details><summary>{esc(b.summary)}</summary><ul>{items}</ul>"
                        f"</details>")
    text = "\n".join(body)
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head>\n"
            f"<body><main>\n{text}\n</main></body></html>\n")


def write(blocks: list[Block], folder: Path, title: str, stem: str = "index") -> None:
    """``<stem>.md`` and ``<stem>.html`` in ``folder``."""
    anchors(blocks)
    write_atomic(folder / f"{stem}.md", to_markdown(blocks))
    write_atomic(folder / f"{stem}.html", to_html(blocks, folder, title))
