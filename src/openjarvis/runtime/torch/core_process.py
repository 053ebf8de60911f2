"""The engine's core in a process of its own (vLLM V1's EngineCore split), so that the step loop
has an interpreter to itself: in one process it shares the interpreter with a server's event
loop and request threads or `ipw measure`'s tasks, and on a small model those set the pace of
the GPU (docs/benchmarks.md measured the steps twice as long under a server's load as alone).

One pipe each way carries pickled lists of messages. To the core: a sequence to add, a
cancellation, a request for the step counts, close. From the core, in the order they happened:
each step's pieces of work as it lands (the meter's ledger is rebuilt here from them), each
sequence's tokens and end (or error), when it is idle, and the counts asked for. The step loop
only queues its messages; a thread of the core sends them, a thread here reads them.

The clock is shared: both processes stamp times with time.monotonic() (one clock per machine).
"""

import atexit
import faulthandler
import itertools
import os
import queue
import signal
import threading
import traceback
import weakref
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.multiprocessing as multiprocessing

from openjarvis.errors import UserError
from openjarvis.runtime.heap import frozen_heap
from openjarvis.runtime.torch.core import CoreInfo, EngineCore
from openjarvis.runtime.torch.loop import StepCounts, switch_interval
from openjarvis.runtime.torch.runner import Spec
from openjarvis.runtime.torch.scheduler import Delivery, Pieces, Sequence
from openjarvis.runtime.types import StepLedger, WorkPiece

__all__ = ["CoreProcess"]

# How long close() waits for the core to finish its sequences and tear down.
_CLOSE_TIMEOUT_S = 120.0
# The core's exit status when a message could not be sent (EX_SOFTWARE): the caller reports it.
_SEND_FAILED = 70


class CoreProcess:
    """The core in a spawned process, used like EngineCore: `enqueue` a Sequence here and read
    its outbox; `ledger` is the meter's record of the steps, rebuilt from the core's."""

    def __init__(self, spec: Spec) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, theirs = context.Pipe()
        # Not a daemon: the core starts the followers of tensor parallelism (a daemon process may
        # not have children). It ends when this process closes it, or leaves (the pipe's end).
        self._process = context.Process(
            target=_serve_core, args=(spec, theirs), name="openjarvis-torch-core"
        )
        self._process.start()
        theirs.close()
        self.info = self._started()
        self.ledger = StepLedger()
        self.failure: BaseException | None = None
        self._sequences: dict[int, Sequence] = {}  # by key, until their end arrives
        self._key_of: dict[int, int] = {}  # id(sequence): its key, until its end arrives
        self._keys = itertools.count()
        self._lock = threading.Lock()  # the submitted count, the ledger's busy/idle, closing
        self._send_lock = threading.Lock()
        self._submitted = 0
        self._closing = False
        self._counts: queue.SimpleQueue[StepCounts] = queue.SimpleQueue()
        self._counts_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="torch-core-reader", daemon=True)
        self._reader.start()
        # This process's threads pass the core's tokens and steps on (a server's requests and
        # event loop, the meter's sampler, the reader): with a GPU's pace, each should wait
        # for the interpreter a short switch interval, not 5 ms (docs/benchmarks.md).
        self._shortened = spec.settings.device == "cuda"
        if self._shortened:
            switch_interval.shorten()
        _open_cores.add(self)

    def _started(self) -> CoreInfo:
        try:
            message = self._conn.recv()
        except (EOFError, OSError):
            self._process.join()
            raise RuntimeError(
                f"the torch engine's process ended while starting ({_exit(self._process)})"
            ) from None
        kind, value = message
        if kind == "ready":
            assert isinstance(value, CoreInfo)
            return value
        self._process.join()
        user, text = value
        if user:
            raise UserError(text)
        raise RuntimeError(f"the torch engine failed to start:\n{text}")

    def enqueue(self, sequence: Sequence) -> None:
        key = next(self._keys)
        with self._lock:
            if self.failure is not None:
                raise RuntimeError("the torch engine stopped after an error") from self.failure
            if self._closing:
                raise RuntimeError("the torch engine is closed")
            self._sequences[key] = sequence
            self._key_of[id(sequence)] = key
            self._submitted += 1
            self.ledger.busy()  # before the core can start a step of it
        message = (
            "add",
            key,
            sequence.prompt,
            sequence.max_tokens,
            sequence.end_tokens,
            sequence.temperature,
            sequence.seed,
            sequence.all_logits,
        )
        try:
            self._send(message)
        except OSError as error:  # the core has gone: the reader fails the sequence too
            raise RuntimeError("the torch engine's process has ended") from error

    def cancel(self, sequence: Sequence) -> None:
        sequence.cancelled = True
        key = self._key_of.get(id(sequence))
        if key is not None:  # not ended yet
            with suppress(OSError):  # the core has gone: the reader ends the sequence
                self._send(("cancel", key))

    def counts(self) -> StepCounts:
        with self._counts_lock:
            self._send(("counts",))
            while True:
                try:
                    return self._counts.get(timeout=1.0)
                except queue.Empty:
                    if self.failure is not None:
                        raise RuntimeError("the torch engine stopped") from self.failure

    def close(self) -> None:
        with self._lock:
            closed, self._closing = self._closing, True
        if closed:
            return
        _open_cores.discard(self)
        with suppress(OSError):  # the core has gone already
            self._send(("close",))
        self._process.join(timeout=_CLOSE_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._reader.join()
        self._conn.close()
        if self._shortened:
            switch_interval.restore()

    def _send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self._conn.send(message)

    def _read(self) -> None:
        error: RuntimeError | None = None
        try:
            while True:
                try:
                    messages = self._conn.recv()
                except (EOFError, OSError):
                    break
                for message in messages:
                    self._take(message)
        except Exception as failure:  # a message this side cannot take: nobody gets tokens now
            error = RuntimeError(f"the torch engine's messages could not be read: {failure!r}")
            error.__cause__ = failure
            self._process.kill()
        with self._lock:
            closing = self._closing
        if error is None and closing and not self._sequences:
            return
        if error is None:
            self._process.join(timeout=5)
            error = RuntimeError(f"the torch engine's process ended ({_exit(self._process)})")
        with self._lock:
            self.failure = self.failure or error
            ended, self._sequences, self._key_of = self._sequences, {}, {}
            self.ledger.idle()  # no step will land
        for sequence in ended.values():
            sequence.hand(error)

    def _take(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "step":
            _, end_s, pieces = message
            start_s, followed = end_s, 0.0
            for fields, keys in pieces:
                piece = WorkPiece(*fields)
                start_s = piece.start_s  # a step's pieces share its time
                for key in keys:
                    sequence = self._sequences.get(key)
                    if sequence is not None:
                        sequence.work.append(piece)
                        if sequence.followed:
                            followed += piece.share
            self.ledger.landed(start_s, end_s, followed)
        elif kind == "out":
            _, key, item, reused, logits = message
            sequence = self._sequences[key]
            sequence.reused = reused
            if logits is not None:
                sequence.logits = torch.from_numpy(logits)
            if isinstance(item, _Failure):
                item = item.error()
            if isinstance(item, BaseException) or item[-1] is None:
                sequence.finished = True
                del self._sequences[key]
                self._key_of.pop(id(sequence), None)
            sequence.hand(item)
        elif kind == "idle":
            with self._lock:
                if message[1] == self._submitted:  # nothing sent since: truly idle
                    self.ledger.idle()
        elif kind == "counts":
            self._counts.put(message[1])
        elif kind == "failed":  # the core's step loop ended: its sequences have the error
            with self._lock:
                self.failure = self.failure or message[1].error()
                self.ledger.idle()  # no step will land


def _exit(process: Any) -> str:
    code = process.exitcode
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


# Cores this process has not closed: closed at exit, before multiprocessing joins its children
# (atexit runs the later registration first), or the exit would wait for a core that waits for
# this process's messages.
_open_cores: "weakref.WeakSet[CoreProcess]" = weakref.WeakSet()


@atexit.register
def _close_open_cores() -> None:
    for core in list(_open_cores):
        core.close()


@dataclass(frozen=True, slots=True)
class _Failure:
    """An error as it crosses the pipe (any exception may not pickle): a UserError stays one."""

    user: bool
    text: str

    @classmethod
    def of(cls, error: BaseException) -> "_Failure":
        if isinstance(error, UserError):
            return cls(True, str(error))
        return cls(False, f"{type(error).__name__}: {error}")

    def error(self) -> BaseException:
        return UserError(self.text) if self.user else RuntimeError(self.text)


# ---- the core's process -------------------------------------------------------------------


@dataclass(eq=False)
class _Remote(Sequence):
    """A sequence in the core's process: what it hands its consumer goes down the pipe."""

    key: int = -1
    wire: "_Wire | None" = None

    def hand(self, item: Delivery) -> None:
        assert self.wire is not None
        logits, self.logits = self.logits, None
        sent: object = _Failure.of(item) if isinstance(item, BaseException) else item
        array = None if logits is None else logits.numpy()
        self.wire.put(("out", self.key, sent, self.reused, array))
        if isinstance(item, BaseException) or item[-1] is None:
            self.wire.sequences.pop(self.key, None)


class _Wire:
    """The core's side: the step loop publishes here, and a thread sends what is queued."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._out: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self.sequences: dict[int, _Remote] = {}  # by key, until their end is handed
        self._sender = threading.Thread(target=self._send_all, name="torch-core-sender")

    def start(self) -> None:
        """Send from now on (the first message, the core's info, has gone before)."""
        self._sender.start()

    def put(self, message: tuple[Any, ...]) -> None:
        self._out.put(message)

    def busy(self) -> None:
        pass  # the other side marks its ledger busy as it sends a sequence

    def landed(self, end_s: float, pieces: Pieces) -> None:
        # A piece travels as its fields: pickling the dataclass cost as much as all the rest.
        keys = [
            ((p.start_s, p.end_s, p.share, p.batch), [_key(s) for s in sequences])
            for p, sequences in pieces
        ]
        self._out.put(("step", end_s, keys))

    def idle(self, taken: int) -> None:
        self._out.put(("idle", taken))

    def failed(self, error: BaseException) -> None:
        self._out.put(("failed", _Failure.of(error)))

    def stop(self) -> None:
        self._out.put(None)
        self._sender.join()

    def _send_all(self) -> None:
        """Everything queued since the last send goes as one message list."""
        while True:
            first = self._out.get()
            batch = [first]
            while True:
                try:
                    batch.append(self._out.get_nowait())
                except queue.Empty:
                    break
            messages = [m for m in batch if m is not None]
            try:
                if messages:
                    self._conn.send(messages)
            except OSError:
                return  # the other side has gone
            except Exception:  # a message that cannot be sent: end, so the other side hears it
                traceback.print_exc()
                os._exit(_SEND_FAILED)
            if len(messages) < len(batch):
                return


def _key(sequence: Sequence) -> int:
    assert isinstance(sequence, _Remote)
    return sequence.key


def _serve_core(spec: Spec, conn: Connection) -> None:
    """The core process's main: build the core, then take messages until close or the other
    side's end. Ctrl-C is for the other side, which closes the core."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable()  # a native crash prints where, on the inherited stderr
    wire = _Wire(conn)
    try:
        core = EngineCore(spec, publish=wire)
    except BaseException as error:
        user = isinstance(error, UserError)
        conn.send(("failed", (user, str(error) if user else traceback.format_exc())))
        return
    conn.send(("ready", core.info))
    wire.start()
    with frozen_heap():  # what start-up built lives as long as the process
        _serve_messages(core, wire, conn)


def _serve_messages(core: EngineCore, wire: _Wire, conn: Connection) -> None:
    """Take messages until close or the other side's end."""
    left = False
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                left = True
                break
            kind = message[0]
            if kind == "add":
                _, key, prompt, max_tokens, end_tokens, temperature, seed, all_logits = message
                sequence = _Remote(
                    prompt,
                    max_tokens,
                    end_tokens,
                    temperature,
                    seed,
                    all_logits=all_logits,
                    key=key,
                    wire=wire,
                )
                wire.sequences[key] = sequence
                try:
                    core.enqueue(sequence)
                except RuntimeError as error:
                    sequence.hand(error)
            elif kind == "cancel":
                cancelled = wire.sequences.get(message[1])
                if cancelled is not None:
                    cancelled.cancelled = True
            elif kind == "counts":
                wire.put(("counts", core.counts()))
            elif kind == "close":
                break
    finally:
        if left:  # nobody reads the tokens: stop every sequence now
            for sequence in list(wire.sequences.values()):
                sequence.cancelled = True
        core.close()
        wire.stop()
