"""The `ipw` command: measure accuracy per joule, inspect energy sources.

Every UserError becomes one line on stderr and exit code 2, with no traceback.
"""

import sys

import typer

from openjarvis.cli import results
from openjarvis.cli.compare import compare_command
from openjarvis.cli.db import db_app
from openjarvis.cli.evals import score_command, suites_command
from openjarvis.cli.measure import measure_command
from openjarvis.cli.power import power_command
from openjarvis.cli.report import report_command
from openjarvis.cli.requests import requests_command
from openjarvis.cli.supervise import enable_fault_report, is_supervised, run_supervised
from openjarvis.cli.version import VersionOption
from openjarvis.errors import UserError

__all__ = ["app", "main"]

app = typer.Typer(
    help="OpenJarvis benchmarks: how much useful work a model does per joule on this machine.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Plain help: typer's rich help shows every flag as `--json <bool>`, as if it took a value.
    rich_markup_mode=None,
)


@app.callback()
def _options(version: VersionOption = False) -> None:
    """OpenJarvis benchmarks: how much useful work a model does per joule on this machine."""


app.command("power")(power_command)
app.command("requests")(requests_command)
app.command("runs")(results.runs_command)
app.command("show")(results.show_command)
app.command("compare")(compare_command)
app.command("report")(report_command)
app.command("suites")(suites_command)
app.command("score")(score_command)
app.add_typer(db_app, name="db")


app.command("measure")(measure_command)


def main() -> None:
    arguments = sys.argv[1:]
    if arguments[:1] == ["measure"] and not is_supervised():
        # The engine runs in a child: a native fault mid-run becomes one line (supervise.py).
        sys.exit(run_supervised(arguments))
    # A native library that faults still says where, instead of a silent exit 132/139.
    enable_fault_report()
    try:
        app(prog_name="ipw")
    except UserError as error:
        sys.stderr.write(f"error: {error}\n")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: finished tasks are saved; the run is marked interrupted\n")
        sys.exit(130)
