"""A stand-in for llama-cpp-python whose native code faults: loading a model dies of SIGILL, as a
build for instructions the CPU reports but cannot run does. Put its folder first on PYTHONPATH.
"""

import os
import signal


class Llama:
    def __init__(self, **settings: object) -> None:
        os.kill(os.getpid(), signal.SIGILL)
