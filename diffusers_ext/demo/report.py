"""A self-contained HTML report: one folder with `index.html` and the PNG files it shows."""

import html
import os
from dataclasses import dataclass, field

from .plots import DISPLAY_WIDTH


@dataclass
class Figure:
    """A PNG file inside the report folder, with a caption."""

    filename: str
    caption: str


@dataclass
class Section:
    """One method's part of the report.

    Args:
        title: heading of the section.
        summary: one paragraph (plain text) saying what was run and what it shows.
        figures: PNG files written into the report folder.
        table: optional rows of `{column: value}` shown as an HTML table (the columns of every row; a cell a row
            lacks is empty).
        notes: optional plain-text lines shown under the figures (settings, commands, limits).
        error: the one-line error of a section whose builder raised (`None` when it ran); the page marks it failed.
    """

    title: str
    summary: str
    figures: list[Figure] = field(default_factory=list)
    table: list[dict[str, object]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { border-bottom: 2px solid #444; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
figure { display: inline-block; margin: 0.5em 1em 0.5em 0; vertical-align: top; }
figure img { image-rendering: pixelated; max-width: DISPLAY_WIDTHpx; border: 1px solid #ddd; }
figcaption { font-size: 0.9em; color: #555; max-width: 520px; }
table { border-collapse: collapse; margin: 1em 0; } td, th { border: 1px solid #ccc; padding: 0.3em 0.7em; }
th { background: #f3f3f3; } .note { font-family: monospace; font-size: 0.85em; color: #444; }
.error { font-family: monospace; color: #a00; background: #fee; padding: 0.5em; border-left: 4px solid #a00; }
""".replace("DISPLAY_WIDTH", str(DISPLAY_WIDTH))


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_report(title: str, intro: str, sections: list[Section]) -> str:
    """Render the sections as one HTML page (no external resources)."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><p>{html.escape(intro)}</p>",
    ]
    for section in sections:
        css = "demo-section failed" if section.error is not None else "demo-section"
        parts.append(f'<section class="{css}"><h2>{html.escape(section.title)}</h2>')
        if section.error is not None:
            parts.append(f'<p class="error">This section failed: {html.escape(section.error)}</p>')
        parts.append(f"<p>{html.escape(section.summary)}</p>")
        for fig in section.figures:
            parts.append(
                f'<figure><img src="{html.escape(fig.filename)}" alt="{html.escape(fig.caption)}">'
                f"<figcaption>{html.escape(fig.caption)}</figcaption></figure>"
            )
        if section.table:
            columns = list(dict.fromkeys(c for row in section.table for c in row))  # every row's columns, in order
            parts.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + "</tr>")
            for row in section.table:
                cells = "".join(f"<td>{html.escape(_format(row.get(c, '')))}</td>" for c in columns)
                parts.append(f"<tr>{cells}</tr>")
            parts.append("</table>")
        parts += [f'<p class="note">{html.escape(line)}</p>' for line in section.notes]
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(output_dir: str, title: str, intro: str, sections: list[Section]) -> str:
    """Write `index.html` into `output_dir` (where the sections' PNGs already are); return its path."""
    missing = [
        f.filename for s in sections for f in s.figures if not os.path.isfile(os.path.join(output_dir, f.filename))
    ]
    if missing:
        raise FileNotFoundError(f"the report references figures that were not written: {missing}")
    path = os.path.join(output_dir, "index.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_report(title, intro, sections))
    return path
