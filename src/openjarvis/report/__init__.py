"""Reports over stored runs: plots, HTML, Markdown, CSV and JSON (`report.write`), and run rows.

Nothing is imported here, so that `ipw --help` does not load matplotlib.
"""

__all__: list[str] = []
