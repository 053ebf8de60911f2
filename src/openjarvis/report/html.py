"""The report as one self-contained HTML page: inline SVG plots, inline CSS, no script, no fetches.

A Content-Security-Policy forbids every network load, so the page shows the same offline.
"""

import json
from collections.abc import Mapping, Sequence
from html import escape

from openjarvis.report.accounting import (
    ACCOUNTING_HEADINGS,
    ACCOUNTING_NOTE,
    Accounting,
    accounting_cells,
)
from openjarvis.report.content import Block, TextTable
from openjarvis.report.plot import Plot
from openjarvis.report.runs import (
    FIGURE_COLUMNS,
    energy_label,
    host_label,
    run_tasks_text,
    short_label,
)
from openjarvis.report.uncertainty import run_figure_text
from openjarvis.store import RunRecord

__all__ = ["render_html"]

# No default-src: nothing may load; inline styles only; images only as data: URLs.
CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 1100px;
       padding: 0 1rem; color: #1d1d1f; }
h1 { margin-bottom: 0.2rem; } .meta { color: #555; margin-top: 0; }
figure.plot { margin: 1rem 0 2rem; } figure.plot svg { max-width: 100%; height: auto; }
figcaption { color: #444; font-size: 13px; max-width: 60rem; }
table { border-collapse: collapse; font-size: 12px; margin: 0.5rem 0 2rem; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
td.text { text-align: left; } .estimate { color: #9a5b00; }
p.explain { color: #444; font-size: 13px; max-width: 60rem; }
#headline { border: 2px solid #1d1d1f; border-radius: 6px; padding: 0.2rem 1rem 0.6rem;
            margin: 1rem 0; }
#headline p:first-of-type { font-size: 17px; font-weight: 600; }
p.limits { color: #7a4a00; font-size: 13px; max-width: 60rem; }
ul.legend { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 0.4rem 1.2rem;
            font-size: 13px; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.35em;
          vertical-align: -0.1em; border-radius: 50%; }
.swatch.hollow { border: 2px solid #555; width: 0.6em; height: 0.6em; }
table { display: block; overflow-x: auto; max-width: 100%; }
@media (max-width: 700px) { body { font-size: 13px; margin: 1rem auto; }
  table { font-size: 11px; } }
@media print { body { max-width: none; } figure.plot { break-inside: avoid; }
  table { display: table; } }
"""

RUN_TABLE_COLUMNS = ("accuracy", "mean_energy_j", "accuracy_per_joule", "joules_per_output_token")


def _run_table(runs: Sequence[RunRecord]) -> str:
    headings = ["run", "model · hardware · engine", "host", "suite", "state", "energy", "tasks"]
    headings += [
        "passes per kJ" if name == "accuracy_per_joule" else FIGURE_COLUMNS[name]
        for name in RUN_TABLE_COLUMNS
    ]
    lines = ["<table><thead><tr>", *(f"<th>{escape(h)}</th>" for h in headings), "</tr></thead>"]
    lines.append("<tbody>")
    for run in runs:
        cells = [
            (run.id or "")[:8],
            short_label(run),
            host_label(run),
            run.suite,
            run.state,
            energy_label(run),
            run_tasks_text(run),
        ]
        row = "".join(f'<td class="text">{escape(cell)}</td>' for cell in cells)
        for name in RUN_TABLE_COLUMNS:
            scale = 1000.0 if name == "accuracy_per_joule" else 1.0  # passes per kJ
            text = run_figure_text(run, name, scale)
            css = ' class="estimate"' if text.endswith(" est.") else ""
            row += f"<td{css}>{escape(text)}</td>"
        lines.append(f"<tr>{row}</tr>")
    lines.append("</tbody></table>")
    return "\n".join(lines)


def _accounting_table(runs: Sequence[RunRecord], accounts: Sequence[Accounting]) -> str:
    """The meter's accounting per run, apart from the runs table, which is already wide."""
    headings = ["run", "model · hardware · engine", *ACCOUNTING_HEADINGS]
    lines = ["<table><thead><tr>", *(f"<th>{escape(h)}</th>" for h in headings), "</tr></thead>"]
    lines.append("<tbody>")
    for run, figures in zip(runs, accounts, strict=True):
        row = "".join(
            f'<td class="text">{escape(cell)}</td>'
            for cell in ((run.id or "")[:8], short_label(run))
        )
        for cell in accounting_cells(run, figures):
            css = ' class="estimate"' if cell.endswith(" est.") else ""
            row += f"<td{css}>{escape(cell)}</td>"
        lines.append(f"<tr>{row}</tr>")
    lines.append("</tbody></table>")
    return "\n".join(lines)


def _cloud_constants(runs: Sequence[RunRecord]) -> str:
    rows = "".join(
        f'<tr><td class="text">{escape((run.id or "")[:8])}</td>'
        f'<td class="text">{escape(run.engine)}</td><td class="text">{escape(run.model_name)}</td>'
        f'<td class="text"><code>{escape(json.dumps(run.engine_settings, sort_keys=True))}'
        "</code></td></tr>"
        for run in runs
    )
    return (
        "<h3>Constants of the cloud estimates</h3><table><thead><tr><th>run</th><th>engine</th>"
        f"<th>model</th><th>settings</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _table(table: TextTable) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in table.headings)
    body = []
    for row in table.rows:
        cells = []
        for index, cell in enumerate(row):
            css = ["text"] if index == 0 or not _numeric(cell) else []
            if " est." in cell:
                css.append("estimate")
            attribute = f' class="{" ".join(css)}"' if css else ""
            cells.append(f"<td{attribute}>{escape(cell)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _numeric(cell: str) -> bool:
    return bool(cell) and (cell[0].isdigit() or cell[0] in "—-+")


def _block(block: Block) -> str:
    level = block.level
    parts = [f'<section id="{escape(block.id)}"><h{level}>{escape(block.title)}</h{level}>']
    parts += [
        f'<p class="limits">{escape(line.text)}</p>'
        if line.limit
        else f"<p>{escape(line.text)}</p>"
        for line in block.lines
    ]
    parts += [_table(table) for table in block.tables]
    return "".join(parts) + "</section>"


def _plot(plot: Plot, cloud_runs: Sequence[RunRecord]) -> str:
    extra = _cloud_constants(cloud_runs) if plot.name == "local-vs-cloud" else ""
    return (
        f'<section id="{plot.name}"><h2>{escape(plot.title)}</h2>'
        f'<figure class="plot" data-plot="{plot.name}">{plot.svg}'
        f"<figcaption>{escape(plot.caption)}</figcaption></figure>{extra}</section>"
    )


def _legend(colours: Mapping[str, str]) -> str:
    """The one legend of every chart: colours are the hardware's everywhere on the page."""
    items = "".join(
        f'<li><span class="swatch" style="background:{colour}"></span>{escape(label)}</li>'
        for label, colour in colours.items()
    )
    return (
        f'<ul class="legend" id="legend">{items}<li><span class="swatch hollow"></span>'
        "hollow or hatched: energy estimated</li><li>◆ cloud run</li></ul>"
    )


def render_html(
    title: str,
    meta: str,
    parts: Sequence[Block | Plot],
    colours: Mapping[str, str],
    runs: Sequence[RunRecord],
    accounts: Sequence[Accounting],
    cloud_runs: Sequence[RunRecord],
    notes: Sequence[str],
) -> str:
    """The whole page: the first part (the verdict) first, the hardware legend, the notes, the
    other parts in order, then the runs. Every plot is a <figure class="plot"
    data-plot=NAME> holding one <svg>. `accounts` are in the order of `runs`."""
    rendered = [_block(p) if isinstance(p, Block) else _plot(p, cloud_runs) for p in parts]
    note_items = "".join(f"<li>{escape(note)}</li>" for note in notes)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>{escape(title)}</h1>
<p class="meta">{escape(meta)}</p>
{rendered[0] if rendered else ""}
{_legend(colours)}
{f"<ul>{note_items}</ul>" if note_items else ""}
{"".join(rendered[1:])}
<section id="runs"><h2>Runs</h2>
<p class="explain">Each run on all its own tasks; compare runs in the sections above, on the
tasks they share.</p>
{_run_table(runs)}
<h3 id="energy-accounting">Energy accounting</h3>
{_accounting_table(runs, accounts)}
<p class="explain">{escape(ACCOUNTING_NOTE)}</p>
</section>
</body>
</html>
"""
