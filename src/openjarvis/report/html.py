"""The report as one self-contained HTML page: inline SVG plots, inline CSS, no script, no fetches.

A Content-Security-Policy forbids every network load, so the page shows the same offline.
"""

import json
from collections.abc import Sequence
from html import escape

from openjarvis.report.accounting import (
    ACCOUNTING_HEADINGS,
    ACCOUNTING_NOTE,
    Accounting,
    accounting_cells,
)
from openjarvis.report.plot import Plot
from openjarvis.report.runs import (
    FIGURE_COLUMNS,
    energy_label,
    figure,
    format_interval,
    host_label,
    mark_estimate,
)
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
"""

RUN_TABLE_COLUMNS = ("accuracy", "mean_energy_j", "accuracy_per_joule", "joules_per_output_token")


def _run_table(runs: Sequence[RunRecord]) -> str:
    headings = ["run", "model", "host", "suite", "state", "energy"]
    headings += [FIGURE_COLUMNS[name] for name in RUN_TABLE_COLUMNS]
    lines = ["<table><thead><tr>", *(f"<th>{escape(h)}</th>" for h in headings), "</tr></thead>"]
    lines.append("<tbody>")
    for run in runs:
        cells = [
            (run.id or "")[:8],
            run.model_name,
            host_label(run),
            run.suite,
            run.state,
            energy_label(run),
        ]
        row = "".join(f'<td class="text">{escape(cell)}</td>' for cell in cells)
        for name in RUN_TABLE_COLUMNS:
            text = format_interval(*figure(run, name))
            if name != "accuracy":
                text = mark_estimate(text, run)
            css = ' class="estimate"' if text.endswith(" est.") else ""
            row += f"<td{css}>{escape(text)}</td>"
        lines.append(f"<tr>{row}</tr>")
    lines.append("</tbody></table>")
    return "\n".join(lines)


def _accounting_table(runs: Sequence[RunRecord], accounts: Sequence[Accounting]) -> str:
    """The meter's accounting per run, apart from the runs table, which is already wide."""
    headings = ["run", "model", *ACCOUNTING_HEADINGS]
    lines = ["<table><thead><tr>", *(f"<th>{escape(h)}</th>" for h in headings), "</tr></thead>"]
    lines.append("<tbody>")
    for run, figures in zip(runs, accounts, strict=True):
        row = "".join(
            f'<td class="text">{escape(cell)}</td>' for cell in ((run.id or "")[:8], run.model_name)
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


def render_html(
    title: str,
    meta: str,
    plots: Sequence[Plot],
    runs: Sequence[RunRecord],
    accounts: Sequence[Accounting],
    cloud_runs: Sequence[RunRecord],
    notes: Sequence[str],
) -> str:
    """The whole page; every plot is a <figure class="plot" data-plot=NAME> holding one <svg>.

    `accounts` are the runs' energy accounting, in the order of `runs`.
    """
    sections = []
    for plot in plots:
        extra = _cloud_constants(cloud_runs) if plot.name == "local-vs-cloud" else ""
        sections.append(
            f'<section id="{plot.name}"><h2>{escape(plot.title)}</h2>'
            f'<figure class="plot" data-plot="{plot.name}">{plot.svg}'
            f"<figcaption>{escape(plot.caption)}</figcaption></figure>{extra}</section>"
        )
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
{f"<ul>{note_items}</ul>" if note_items else ""}
{"".join(sections)}
<section id="runs"><h2>Runs</h2>
{_run_table(runs)}
<h3 id="energy-accounting">Energy accounting</h3>
{_accounting_table(runs, accounts)}
<p class="explain">{escape(ACCOUNTING_NOTE)}</p>
</section>
</body>
</html>
"""
