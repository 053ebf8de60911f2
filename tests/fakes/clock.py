"""A clock that tests move by hand, standing in for time.monotonic and time.sleep.

Hooks run at every step, so fake counters can follow time (e.g. 80 W: energy = 80 * t).
"""

from collections.abc import Callable

__all__ = ["FakeClock"]


class FakeClock:
    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s
        self.hooks: list[Callable[[float], None]] = []

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds
        for hook in self.hooks:
            hook(self.now_s)

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)
