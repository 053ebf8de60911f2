"""Run a script or module with another interpreter switch interval (an experiment: how much of a
run's pace is threads waiting for the GIL). CPython makes a thread that holds the interpreter
hand it over after this interval (5 ms by default) when another thread asks for it.

Run: python3 benchmarks/switch.py SECONDS (-m MODULE | SCRIPT) [ARGS...]
"""

import runpy
import sys


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.setswitchinterval(float(sys.argv[1]))
    if sys.argv[2] == "-m":
        sys.argv = [sys.argv[3], *sys.argv[4:]]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[2:]
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
