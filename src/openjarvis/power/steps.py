"""The engine steps that most windows of a batch share, held once with running sums, so that a
window published from them costs the same however many steps it took.

A batching engine hands every decode row of a step the same piece (the rows' shares are
equal), so the windows running at once have the same pieces once their prompt is in: its steps
(a prompt joins decode steps as rows, in chunks under a token budget) are the window's own. The
accountant keeps the shared pieces in one list, extended each pass from the window that has run
longest, and finds a window's pieces in it by the identity of its first piece there (after at
most `MAX_OWN` of its own), the rest checked whole at C speed. A window whose pieces are not
found there (it waited a step, or its steps are several sequences') is summed piece by piece.
"""

import bisect
import math
from collections.abc import Sequence

from openjarvis.power.edges import WorkStep, _end_s, mean_batch

__all__ = ["MAX_OWN", "Run", "SharedSteps"]

# A window's own pieces before its shared ones looked past: its prompt's chunks.
MAX_OWN = 8


class SharedSteps:
    """The shared pieces in time order, with running sums of their claims, times and
    batch * times."""

    def __init__(self) -> None:
        self._steps: list[WorkStep] = []
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._claims_s = [0.0]  # the claims of the first i steps, for each i
        self._lengths_s = [0.0]
        self._batches_s = [0.0]
        self._at: dict[int, int] = {}  # id(step): its place + self._base
        self._base = 0  # steps forgotten so far
        self.found = 0  # windows found here (`find`), and not
        self.missed = 0

    @property
    def last_s(self) -> float:
        """The end of the last piece held."""
        return self._ends[-1] if self._ends else -float("inf")

    def extend(self, work: Sequence[WorkStep]) -> None:
        """Add the pieces of `work` (one window's, in time order) after its first (its own,
        most often: a prompt) that end after the last one held."""
        last_s = self.last_s
        first = max(1, bisect.bisect_right(work, last_s, key=_end_s))
        for step in work[first:]:
            if step.start_s < last_s:  # not one engine's steps one after another: not shared
                return
            self._at[id(step)] = len(self._steps) + self._base
            self._steps.append(step)
            self._starts.append(step.start_s)
            self._ends.append(step.end_s)
            self._claims_s.append(self._claims_s[-1] + step.claim_s)
            self._lengths_s.append(self._lengths_s[-1] + step.length_s)
            self._batches_s.append(self._batches_s[-1] + step.batch_s)
            last_s = step.end_s

    def forget(self, before_s: float) -> None:
        """Drop the pieces ending by `before_s` (no unpublished window starts before it), once
        they are most of the list."""
        done = bisect.bisect_right(self._ends, before_s)
        if done * 2 < len(self._steps):
            return
        for step in self._steps[:done]:
            del self._at[id(step)]
        self._base += done
        del self._steps[:done], self._starts[:done], self._ends[:done]
        # From 0 again, so that the sums stay small and their differences exact.
        for sums in (self._claims_s, self._lengths_s, self._batches_s):
            base = sums[done]
            sums[:] = [sum_s - base for sum_s in sums[done:]]

    def find(self, work: Sequence[WorkStep]) -> "Run | None":
        """Where `work` lies in the shared pieces, past at most `MAX_OWN` of its own (None:
        not there). Its pieces past the last held are added first (no window ran after it)."""
        if work and work[-1].end_s > self.last_s:
            self.extend(work)
        for own in range(min(MAX_OWN + 1, len(work))):
            at = self._at.get(id(work[own]))
            if at is not None:
                place = at - self._base
                end = place + len(work) - own
                if self._steps[place:end] == work[own:]:  # the same objects: C speed
                    self.found += 1
                    return Run(self, tuple(work[:own]), place, end)
                break
        self.missed += 1
        return None


class Run:
    """One window's pieces: `head` (its own, first) and the shared ones from `place` to
    `end`."""

    def __init__(
        self, shared: SharedSteps, head: tuple[WorkStep, ...], place: int, end: int
    ) -> None:
        self._shared, self.head, self.place, self.end = shared, head, place, end
        # Its own pieces end by `own_end_s` (pieces are in end order); its shared ones run
        # through [from_s, to_s] (empty: none).
        self.own_end_s = head[-1].end_s if head else -math.inf
        self.from_s, self.to_s = math.inf, -math.inf
        if place < end:
            self.from_s = max(shared._starts[place], self.own_end_s)
            self.to_s = shared._ends[end - 1]

    def claim_s(self, low_s: float, high_s: float) -> float:
        """Its claim on [low_s, high_s] (`edges.claim_in_s` of its pieces), from the running
        sums."""
        shared = self._shared
        first = bisect.bisect_right(shared._ends, low_s, self.place, self.end)
        last = bisect.bisect_left(shared._starts, high_s, first, self.end)
        claim_s = 0.0
        # A few steps of its own, each cut to the interval, written out: every window's first
        # interval and first token come here, and `claim_in_s` on them cost the accountant ~7 %.
        if low_s < self.own_end_s:
            for step in self.head:
                inside_s = min(step.end_s, high_s) - max(step.start_s, low_s)
                if inside_s > 0:
                    claim_s += step.share * inside_s
        if first >= last:
            return claim_s
        steps = shared._steps
        claim_s += shared._claims_s[last] - shared._claims_s[first]
        head, tail = steps[first], steps[last - 1]
        if head.start_s < low_s:  # one engine's steps: only the first and last can be cut
            claim_s -= head.share * (low_s - head.start_s)
        if tail.end_s > high_s:
            claim_s -= tail.share * (tail.end_s - high_s)
        return max(claim_s, 0.0)

    def mean_batch(self) -> float | None:
        """`edges.mean_batch` of its pieces, from the running sums."""
        shared, head = self._shared, self.head
        length_s = shared._lengths_s[self.end] - shared._lengths_s[self.place]
        batch_s = shared._batches_s[self.end] - shared._batches_s[self.place]
        for step in head:
            length_s += step.length_s
            batch_s += step.batch_s
        if length_s <= 0:  # steps too short for the clock: mean_batch counts them alike
            return mean_batch([*head, *shared._steps[self.place : self.end]])
        return batch_s / length_s
