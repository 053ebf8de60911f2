"""Child processes that must answer Ctrl-C as they would in a terminal."""

import signal

__all__ = ["default_sigint"]


def default_sigint() -> None:
    """Run in the child before exec: a process started from a background job (as CI may run
    the tests) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
