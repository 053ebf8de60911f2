"""The torch engine's step loop: one thread on rank 0 that takes new sequences from an inbox,
asks the scheduler for the next step, runs it through the runner (on every rank alike), picks
each row's token, and records the step in the ledger as it lands (nano-vllm's engine step, on a
thread of its own so that requests from many threads share one batch).
"""

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from openjarvis.errors import UserError
from openjarvis.runtime.torch.paged import BLOCK_SIZE
from openjarvis.runtime.torch.runner import Runner
from openjarvis.runtime.torch.scheduler import Pieces, Scheduler, Sequence, Step
from openjarvis.runtime.torch.step_inputs import StepInputs
from openjarvis.runtime.types import StepLedger

__all__ = ["SWITCH_INTERVAL_S", "Publish", "StepCounts", "StepLoop", "switch_interval"]

# The step loop shares the interpreter with the threads that consume its tokens (a server's
# requests, ipw measure's tasks). CPython lets a thread that holds the interpreter keep it for
# the switch interval (5 ms by default) before it must hand it to one that asks, so the step
# loop, back from a GPU step of about a millisecond, could wait five for the next launch.
# While an engine runs on a GPU, the process's interval is this (docs/benchmarks.md measures
# both). On the CPU a step is the host's own computing, and more switches only add overhead
# (the torch engine's tests ran 18 % slower, 99 against 84 s, means of two runs): the interval
# is left alone there.
SWITCH_INTERVAL_S = 0.0005

STEP_KINDS = ("prefill", "decode", "mixed")


@dataclass(slots=True)
class StepCounts:
    """Steps that landed, by kind: how many, their time on the device and the live rows they
    carried (a benchmark reads the difference over its load). "mixed": decode steps that new
    prompts joined as rows (Scheduler's `prompt_rows`), apart from the decode steps without."""

    steps: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STEP_KINDS, 0))
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEP_KINDS, 0.0))
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STEP_KINDS, 0))

    def copy(self) -> "StepCounts":
        return StepCounts(dict(self.steps), dict(self.seconds), dict(self.rows))

    def since(self, before: "StepCounts") -> "StepCounts":
        """The steps that landed between `before` and these counts."""
        return StepCounts(
            {kind: n - before.steps[kind] for kind, n in self.steps.items()},
            {kind: s - before.seconds[kind] for kind, s in self.seconds.items()},
            {kind: n - before.rows[kind] for kind, n in self.rows.items()},
        )

    def text(self, wall_s: float) -> str:
        """Per kind: steps, their mean time and live sequences; the share of `wall_s` (the
        stretch they were counted over) spent in steps."""
        parts = [
            f"{kind} {count} x {1e3 * self.seconds[kind] / count:.2f} ms, "
            f"{self.rows[kind] / count:.1f} rows"
            for kind, count in self.steps.items()
            if count
        ]
        busy = sum(self.seconds.values()) / wall_s
        return "; ".join(parts) + f"; in steps {100 * busy:.0f} % of the time"


class Publish(Protocol):
    """Where the loop says what it does, for the meter: a StepLedger in this process
    (`ToLedger`), or the pipe to the process that owns the meter (core_process.py)."""

    def busy(self) -> None:
        """Steps start from now on."""

    def landed(self, end_s: float, pieces: Pieces) -> None:
        """A step ended at `end_s`; its pieces are in its sequences' work lists."""

    def idle(self, taken: int) -> None:
        """Nothing runs and nothing waits: the `taken` sequences the loop took in are done."""

    def failed(self, error: BaseException) -> None:
        """The loop ended on `error` (every sequence has it): no step will land again."""


class ToLedger:
    """Publishes to a StepLedger in this process (the sequences' work lists are its own)."""

    def __init__(self, ledger: StepLedger) -> None:
        self._ledger = ledger

    def busy(self) -> None:
        self._ledger.busy()

    def landed(self, end_s: float, pieces: Pieces) -> None:
        start_s, followed = end_s, 0.0
        for piece, sequences in pieces:
            start_s = piece.start_s  # a step's pieces share its time
            followed += piece.share * sum([sequence.followed for sequence in sequences])
        self._ledger.landed(start_s, end_s, followed)

    def idle(self, taken: int) -> None:
        self._ledger.idle()

    def failed(self, error: BaseException) -> None:
        self._ledger.idle()


class StepLoop:
    """Runs steps while there is work, sleeps while there is none, and ends on `close()`.

    A failure ends the loop: every sequence waiting or running gets the error, and `enqueue`
    refuses new ones with it."""

    def __init__(
        self, runner: Runner, scheduler: Scheduler, chains: bool, publish: Publish | None = None
    ) -> None:
        self._runner = runner
        self._scheduler = scheduler
        # Decode steps are chained (launched before the one before has landed) in one process.
        self._chains = chains
        self.ledger = StepLedger()  # each step as it lands, for the meter in this process
        self._publish = publish or ToLedger(self.ledger)
        self._taken = 0  # sequences taken from the inbox
        self._wake = threading.Condition()
        self._inbox: list[Sequence] = []
        self._closing = False
        self.failure: BaseException | None = None
        self._landed_s = 0.0  # when the last step's picks reached the host
        self.counts = StepCounts()
        self._shortened = runner.device.type == "cuda"
        if self._shortened:
            switch_interval.shorten()
        self._thread = threading.Thread(target=self._loop, name="torch-engine", daemon=True)
        self._thread.start()

    def enqueue(self, sequence: Sequence) -> None:
        with self._wake:
            if self.failure is not None:
                raise RuntimeError("the torch engine stopped after an error") from self.failure
            if self._closing:
                raise RuntimeError("the torch engine is closed")
            self._inbox.append(sequence)
            self._wake.notify()

    def close(self) -> None:
        """Finish the steps of the sequences already in, then end the thread."""
        with self._wake:
            closed, self._closing = self._closing, True
            self._wake.notify()
        self._thread.join()
        if not closed and self._shortened:
            switch_interval.restore()

    def _loop(self) -> None:
        runner, scheduler = self._runner, self._scheduler
        if runner.device.type == "cuda":
            torch.cuda.set_device(runner.device)
        try:
            while True:
                with self._wake:
                    if not self._inbox and scheduler.idle:
                        scheduler.deliver()
                        self._publish.idle(self._taken)
                    while not self._inbox and scheduler.idle and not self._closing:
                        self._wake.wait()
                    if self._closing and scheduler.idle and not self._inbox:
                        return
                self._publish.busy()  # before any step starts: their times follow this
                self._take_arrivals()
                step = scheduler.next_step()
                if step is None:
                    scheduler.deliver()
                else:
                    self._run(step)
        except BaseException as error:
            with self._wake:
                self.failure = error
                # Said before any sequence hears of it, so that none can send another first.
                self._publish.failed(error)  # no step will land: the meter must not wait
                for sequence in self._inbox:
                    sequence.hand(error)
                self._taken += len(self._inbox)
                self._inbox = []
            scheduler.fail(error)

    def _take_arrivals(self) -> None:
        """Move the sequences enqueued since the last look to the scheduler."""
        with self._wake:
            arrived, self._inbox = self._inbox, []
            self._taken += len(arrived)
        for sequence in arrived:
            try:
                self._scheduler.add(sequence)
            except ValueError as error:
                sequence.hand(UserError(str(error)))

    def _run(self, step: Step) -> None:
        """Run a step. A decode step is followed by its continuations (Scheduler.continued,
        which takes in new prompts as rows where they join decode steps, and else ends the
        chain when one could start): each is launched before the step before it has landed,
        its tokens taken from that step's picks on the device, so the GPU runs one step while
        the host records the last and wakes its consumers (the overlap of SGLang's and vLLM's
        asynchronous schedulers). With tensor parallelism each step waits for the one before:
        the followers receive its tokens in rank 0's broadcast."""
        scheduler = self._scheduler
        flight = self._launch(step)
        while True:
            following = None
            if flight.step.kind == "decode" and self._chains:
                if self._inbox:
                    self._take_arrivals()
                scheduler.drop_cancelled()
                continued = scheduler.continued(flight.step)
                if continued is not None:
                    after, kept = continued  # kept: none where only new prompts' rows follow
                    following = self._launch(after, flight.picks_of(kept) if kept else None)
            self._land(flight)
            scheduler.deliver(time.monotonic())
            if following is None:
                return
            flight = following

    def _launch(self, step: Step, tokens: torch.Tensor | None = None) -> "_Flight":
        """Start the step on the device and the copy of its picks to the host."""
        launched_s = time.monotonic()
        inputs = self._runner.share(StepInputs.of(step, BLOCK_SIZE, tokens))
        assert inputs is not None
        logits = self._runner.run(inputs)
        scoring = step.rows[0].sequence  # a scoring prompt runs alone in its step
        if scoring.all_logits:
            scoring.logits = logits[0].cpu()
            return _Flight(step, launched_s, None, None, None)
        picks = _pick(step, logits)
        if picks.device.type != "cuda":
            return _Flight(step, launched_s, picks, picks, None)
        landed = torch.cuda.Event()
        host = picks.to("cpu", non_blocking=True)  # into pinned memory
        landed.record()
        return _Flight(step, launched_s, picks, host, landed)

    def _land(self, flight: "_Flight") -> None:
        """Wait for the step's picks and record it. Its time on the device runs from its
        launch, or from the landing of the step before it if that came later."""
        if flight.landed is not None:
            flight.landed.synchronize()
        picked: list[int | None] = [None] * len(flight.step.rows)
        if flight.host is not None:  # the rows that may sample come first (Runner.run)
            picked[: flight.host.size(0)] = flight.host.tolist()
        end_s = time.monotonic()
        start_s = max(flight.launched_s, self._landed_s)
        pieces = self._scheduler.finish_step(flight.step, picked, start_s, end_s)
        self._publish.landed(end_s, pieces)
        live = sum(len(sequences) for _, sequences in pieces)
        self._landed_s = end_s
        counts, step = self.counts, flight.step
        kind: str = step.kind
        last = step.rows[-1]  # prompt rows come after a decode step's decode rows
        if kind == "decode" and last.start < len(last.sequence.prompt):
            kind = "mixed"
        counts.steps[kind] += 1
        counts.seconds[kind] += end_s - start_s
        counts.rows[kind] += live


class _SwitchInterval:
    """The process's switch interval while any step loop (or a GPU engine's core elsewhere)
    runs; the last to stop restores it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loops = 0
        self._before_s = sys.getswitchinterval()

    def shorten(self) -> None:
        with self._lock:
            if self._loops == 0:
                self._before_s = sys.getswitchinterval()
                sys.setswitchinterval(min(SWITCH_INTERVAL_S, self._before_s))
            self._loops += 1

    def restore(self) -> None:
        with self._lock:
            self._loops -= 1
            if self._loops == 0:
                sys.setswitchinterval(self._before_s)


switch_interval = _SwitchInterval()


def _pick(step: Step, logits: torch.Tensor) -> torch.Tensor:
    """Each row's next token, on the logits' device (nothing waits for the step): greedy at
    temperature 0, else drawn from softmax(logits / temperature) with the sequence's own
    seeded generator. Rows that sample nothing get a pick that is ignored; rows past the
    logits' (a decode step's prompt rows that do not end their prompt) get none."""
    picks = logits.argmax(dim=-1)
    for i, row in enumerate(step.rows[: logits.size(0)]):
        sequence = row.sequence
        if row.sample and sequence.temperature > 0:
            if sequence.generator is None:
                sequence.generator = torch.Generator(logits.device)
                sequence.generator.manual_seed(sequence.seed)
            probabilities = torch.softmax(logits[i] / sequence.temperature, dim=-1)
            picks[i] = torch.multinomial(probabilities, 1, generator=sequence.generator)[0]
    return picks


@dataclass(frozen=True, slots=True)
class _Flight:
    """A launched step: its picks on the device, their copy on the host once `landed` has
    passed (None on the CPU, where the copy is the picks), None for a scoring step."""

    step: Step
    launched_s: float
    picks: torch.Tensor | None
    host: torch.Tensor | None
    landed: torch.cuda.Event | None

    def picks_of(self, rows: list[int]) -> torch.Tensor:
        """The picks of the given rows as a continued step's tokens, [len(rows), 1], without
        waiting for them."""
        assert self.picks is not None, "a scoring step is never continued"
        picks = self.picks
        if len(rows) < picks.size(0):
            index = torch.tensor(rows, dtype=torch.long)
            if picks.is_cuda:
                index = index.pin_memory().to(picks.device, non_blocking=True)
            picks = picks[index]
        return picks[:, None]
