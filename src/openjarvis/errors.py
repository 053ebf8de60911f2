"""The small hierarchy of errors OpenJarvis raises on purpose.

A `UserError` is something the user can fix: the CLI prints its message on one line
and exits with code 2. Everything else is a bug and keeps its traceback.
"""

__all__ = ["UserError"]


class UserError(Exception):
    """A problem with the user's input or machine, with the fix in the message."""
