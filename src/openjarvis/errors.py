"""The small hierarchy of errors OpenJarvis raises on purpose.

A `UserError` is something the user can fix: the CLI prints its message on one line
and exits with code 2. Everything else is a bug and keeps its traceback.
"""

__all__ = ["RunInterrupted", "UserError"]


class UserError(Exception):
    """A problem with the user's input or machine, with the fix in the message."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped a run: it is marked interrupted, its finished tasks saved."""

    def __init__(self, run_id: str, tasks_saved: int) -> None:
        super().__init__(run_id, tasks_saved)
        self.run_id = run_id
        self.tasks_saved = tasks_saved

    def __str__(self) -> str:
        return (
            f"run {self.run_id} interrupted with {self.tasks_saved} task(s) saved; "
            f"continue it with `ipw measure --resume {self.run_id}`"
        )
