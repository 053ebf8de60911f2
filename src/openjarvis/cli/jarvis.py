"""The `jarvis` command: the coding assistant (bare `jarvis`), `jarvis serve`, `jarvis models`.

Every UserError becomes one line on stderr and exit code 2, with no traceback.
"""

import faulthandler
import sys

import typer

from openjarvis.cli.assistant import assistant_callback
from openjarvis.cli.models import models_command
from openjarvis.cli.serve import serve_command
from openjarvis.errors import UserError

__all__ = ["app", "main"]

app = typer.Typer(
    help="OpenJarvis: local models with the joules of every reply.",
    pretty_exceptions_enable=False,
    add_completion=False,
    # Plain help: typer's rich help shows every flag as `--resume <bool>`, as if it took a value.
    rich_markup_mode=None,
)
app.callback(invoke_without_command=True)(assistant_callback)
app.command("serve")(serve_command)
app.command("models")(models_command)


def main() -> None:
    # A native library that faults mid-run (llama.cpp, CUDA) still says where, instead of a
    # silent exit 132/139; finished tasks are already saved and `--resume` continues the run.
    faulthandler.enable()
    try:
        app()
    except UserError as error:
        sys.stderr.write(f"error: {error}\n")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
