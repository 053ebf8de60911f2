"""The torch engine: model.py on a GPU (or the CPU), many sequences decoded together from a
paged KV cache, and tensor parallelism over N GPUs with one process per GPU.

This module is the engine's API (nano-vllm's llm_engine): requests in, token streams out. The
core (core.py), in a process of its own on a GPU (core_process.py), runs the steps on rank 0
(loop.py; scheduler.py picks them, runner.py runs them on every rank alike); each request's
stream reads its tokens from a queue, so requests from many threads share the running batch.
The settings are config.py's; the bytes a decode step reads and the GPU's bandwidth,
decode_roofline.py's (gpt-fast's model and TP pass).
"""

import bisect
import json
import operator
import os
import socket
import time
from collections.abc import Generator
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import torch

from openjarvis.errors import UserError
from openjarvis.runtime.gguf import read_gguf_header
from openjarvis.runtime.streaming import Outcome, stream_text
from openjarvis.runtime.torch.config import TorchSettings
from openjarvis.runtime.torch.core import EngineCore
from openjarvis.runtime.torch.core_process import CoreProcess
from openjarvis.runtime.torch.decode_roofline import DecodeRoofline
from openjarvis.runtime.torch.loop import StepCounts
from openjarvis.runtime.torch.model import config_for
from openjarvis.runtime.torch.paged import BLOCK_SIZE
from openjarvis.runtime.torch.parallel import SplitSizes, check_divisible
from openjarvis.runtime.torch.runner import Spec
from openjarvis.runtime.torch.scheduler import Sequence
from openjarvis.runtime.torch.tokenizer import GgufTokenizer
from openjarvis.runtime.types import (
    ChatRequest,
    Completion,
    Request,
    StreamChunk,
    WorkPiece,
    final_completion,
)

__all__ = ["TorchEngine", "TorchSettings"]


class TorchEngine:
    """Serves requests from any thread. The core (runner, scheduler, step loop: core.py) runs in
    a process of its own on a GPU and in this one on the CPU (`engine_process`); with tensor
    parallelism, ranks 1..N-1 run in processes the core starts."""

    kind = "torch"

    def __init__(self, source: str | Path, settings: TorchSettings | None = None) -> None:
        self.settings = (settings or TorchSettings()).resolved()
        settings = self.settings
        if settings.tp < 1:
            raise UserError(f"--tp must be at least 1, not {settings.tp}")
        if settings.concurrency < 1:
            raise UserError(f"concurrency must be at least 1, not {settings.concurrency}")
        if settings.device == "cuda" and torch.cuda.device_count() < settings.tp:
            raise UserError(
                f"--tp {settings.tp} needs {settings.tp} GPUs; {torch.cuda.device_count()} visible"
            )
        self._source = str(source)
        if settings.tp > 1:
            check_divisible(_peek_config(self._source), settings.tp)  # before starting anyone
        self.tokenizer: GgufTokenizer | None = None
        if self._source.endswith(".gguf"):
            self.tokenizer = GgufTokenizer(Path(self._source))
        spec = Spec(self._source, settings, _free_port() if settings.tp > 1 else 0)
        self._core: EngineCore | CoreProcess = (
            CoreProcess(spec) if settings.engine_process else EngineCore(spec)
        )
        info = self._info = self._core.info
        self.config = info.config
        self.bandwidth = info.bandwidth
        self.bandwidth_bytes_per_s = (
            info.bandwidth.bytes_per_s * settings.tp if info.bandwidth is not None else None
        )
        self.roofline = DecodeRoofline(self.config, settings.dtype)
        self.ledger = self._core.ledger  # each step as it lands, for the meter

    @property
    def model_name(self) -> str:
        return Path(self._source).stem if os.sep in self._source else self._source

    @property
    def devices(self) -> tuple[int, ...]:
        """Rank r runs on cuda:r, so tensor parallelism over N GPUs uses the first N visible."""
        return tuple(range(self.settings.tp)) if self.settings.device == "cuda" else ()

    @property
    def concurrency(self) -> int:
        return self.settings.concurrency

    def settings_dict(self) -> dict[str, object]:
        return {
            **asdict(self.settings),
            "kv_cache_blocks": self._info.kv_cache_blocks,
            "kv_block_size": BLOCK_SIZE,
            "cuda_graph_buckets": self._info.cuda_graph_buckets,
            "prefill_graph_buckets": self._info.prefill_graph_buckets,
            "prefill_graphs": self._info.prefill_graphs,
            "all_reduce_table": self._info.all_reduce_table,
            "fused_gemv_table": self._info.fused_gemv_table,
            "one_row_kernel_state": self._info.one_row_kernel,
            "memory_bandwidth_gb_per_s": self.bandwidth_bytes_per_s / 1e9
            if self.bandwidth_bytes_per_s is not None
            else None,
            # From the device's cache file: when, and how, the bandwidth was measured.
            "memory_bandwidth_measured_at": self.bandwidth.measured_at if self.bandwidth else None,
            "memory_bandwidth_method": self.bandwidth.method if self.bandwidth else None,
        }

    # ---- token level (benchmarks use this directly) --------------------------------------

    def generate_tokens(
        self,
        prompt: list[int],
        max_tokens: int,
        stop_tokens: frozenset[int] = frozenset(),
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> Generator[tuple[int, float]]:
        """Decode, greedily at temperature 0 (else sampled with `seed`): (token, arrival time
        on time.monotonic()) one by one, ending after a stop token. Closing the generator early
        frees the sequence."""
        if max_tokens < 1:
            self._check_fits(prompt, 0)
            return _nothing()
        sequence = self._submit(prompt, max_tokens, stop_tokens, temperature, seed)
        return _one_by_one(self._deliveries(sequence))

    def logits(self, prompt: list[int]) -> torch.Tensor:
        """Float32 logits at every prompt position, [len(prompt), vocab], on the CPU: for
        scoring by log-likelihood, and for checking tensor parallelism against one process."""
        sequence = Sequence(prompt, 0, frozenset(), all_logits=True)
        self._check_fits(prompt, 0)
        self._core.enqueue(sequence)
        for _ in self._deliveries(sequence):
            pass
        assert sequence.logits is not None
        return sequence.logits

    def _check_fits(self, prompt: list[int], max_tokens: int) -> None:
        if not prompt:
            raise UserError("the prompt is empty: nothing to continue")
        if len(prompt) + max_tokens > self.config.max_seq_len:
            raise UserError(
                f"prompt ({len(prompt)} tokens) plus max_tokens ({max_tokens}) exceeds the "
                f"context of {self.config.max_seq_len}; raise max_seq_len or lower max_tokens"
            )

    def _submit(
        self,
        prompt: list[int],
        max_tokens: int,
        stop_tokens: frozenset[int],
        temperature: float,
        seed: int | None,
        ledger_key: int | None = None,
    ) -> Sequence:
        self._check_fits(prompt, max_tokens)
        if seed is None:
            seed = int.from_bytes(os.urandom(7), "little")
        sequence = Sequence(list(prompt), max_tokens, stop_tokens, temperature, seed)
        # Before any step of it can land.
        sequence.followed = self.ledger.attach(ledger_key, sequence.work)
        self._core.enqueue(sequence)
        return sequence

    def _deliveries(self, sequence: Sequence) -> Generator[list[tuple[int, float]]]:
        """The sequence's tokens, a batch per hand-over (its end, None, comes last)."""
        try:
            while True:
                batch = sequence.outbox.get()
                if isinstance(batch, UserError):
                    raise UserError(str(batch))
                if isinstance(batch, BaseException):
                    raise RuntimeError(f"the torch engine failed: {batch}") from batch
                if batch and batch[-1] is None:
                    if len(batch) > 1:
                        yield cast(list[tuple[int, float]], batch[:-1])
                    return
                yield cast(list[tuple[int, float]], batch)
        finally:
            self._core.cancel(sequence)  # a consumer that leaves early frees its sequence

    # ---- the Engine protocol -------------------------------------------------------------

    def generate(self, request: Request) -> Completion:
        return final_completion(self.stream(request))

    def stream(self, request: Request) -> Generator[StreamChunk]:
        if request.json_schema is not None:
            raise UserError("the torch engine has no JSON-schema grammar: use the llama.cpp engine")
        tokenizer = self.tokenizer
        if tokenizer is None:
            raise UserError(
                "this torch model has no tokenizer (random weights or a safetensors folder): "
                "serve a .gguf file, whose vocabulary the engine reads"
            )
        start_s = time.monotonic()
        if isinstance(request, ChatRequest):
            prompt = tokenizer.chat_prompt(request.messages)
        else:
            prompt = tokenizer.encode(request.prompt)
        # None runs to the end of the context, as in the llama.cpp engine.
        max_tokens = request.max_tokens
        if max_tokens is None:
            max_tokens = self.config.max_seq_len - len(prompt)
            if max_tokens < 1:
                raise UserError(
                    f"prompt ({len(prompt)} tokens) fills the context of "
                    f"{self.config.max_seq_len} tokens; raise max_seq_len or shorten the prompt"
                )
        end_tokens = tokenizer.end_tokens
        sequence = self._submit(
            prompt, max_tokens, end_tokens, request.temperature, request.seed, request.ledger_key
        )
        yield from stream_text(
            self._deliveries(sequence),
            piece=tokenizer.piece,
            is_end=end_tokens.__contains__,
            stop=request.stop,
            max_tokens=max_tokens,
            start_s=start_s,
            clock=time.monotonic,
            finish=lambda outcome: self._completion(outcome, len(prompt), sequence),
        )

    def _completion(self, outcome: Outcome, prompt_tokens: int, sequence: Sequence) -> Completion:
        work = tuple(sequence.work)
        times = outcome.token_times_s
        # The decode steps: those after the first token (the prompt's steps come before; the
        # steps are in time order).
        decoding = work[bisect.bisect_left(work, times[0], key=_start_s) :] if times else ()
        batch = _mean_batch(decoding) or 1.0
        context = prompt_tokens + len(times) / 2  # mean context over the decode
        bytes_per_token = self.roofline.bytes_per_token(context, batch)
        return outcome.completion(
            prompt_tokens,
            decode_bytes_per_token=bytes_per_token,
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
            work=work,
            batch=batch,
            cached_tokens=sequence.reused,
        )

    def step_counts(self) -> StepCounts:
        """The steps landed so far by kind (a copy): a benchmark's view of the engine's pace."""
        return self._core.counts()

    def weight_bytes(self) -> float:
        """Bytes of weights one decode step reads on all GPUs together (benchmarks' roofline)."""
        return self.roofline.weight_bytes()

    def kv_bytes(self, context: float) -> float:
        """Bytes of keys and values one sequence's attention reads at `context` tokens."""
        return self.roofline.kv_bytes(context)

    def close(self) -> None:
        self._core.close()


def _nothing() -> Generator[tuple[int, float]]:
    """No tokens (max_tokens < 1), as a generator like any other call's."""
    yield from ()


def _one_by_one(batches: Generator[list[tuple[int, float]]]) -> Generator[tuple[int, float]]:
    """The tokens of each hand-over in turn; closing it closes `batches` (frees the sequence)."""
    with closing(batches):
        for batch in batches:
            yield from batch


def _mean_batch(pieces: tuple[WorkPiece, ...]) -> float | None:
    """Time-weighted mean of the steps' batch sizes (from each piece's own time and batch *
    time; comprehensions: this runs for every completion, in the request's thread)."""
    total_s = sum([piece.length_s for piece in pieces])
    if total_s <= 0:
        return None
    return sum([piece.batch_s for piece in pieces]) / total_s


_start_s = operator.attrgetter("start_s")  # read at C speed (bisect calls it at every probe)


def _peek_config(source: str) -> SplitSizes:
    """The sizes tensor parallelism splits, read cheaply (no weights) from any source."""
    path = Path(source)
    if path.is_dir():
        from openjarvis.runtime.torch.loading import config_from_hf

        return config_from_hf(json.loads((path / "config.json").read_text()))
    if path.is_file():
        header = read_gguf_header(path)
        heads = header.arch_value("attention.head_count")
        kv_heads = header.arch_value("attention.head_count_kv") or heads
        width = header.arch_value("feed_forward_length")
        if not (isinstance(heads, int) and isinstance(kv_heads, int) and isinstance(width, int)):
            raise UserError(
                f"{path} has no single attention.head_count or feed_forward_length: "
                "not a text decoder the torch engine reads"
            )
        return _Sizes(n_heads=heads, n_kv_heads=kv_heads, intermediate_size=width)
    return config_for(source)


@dataclass(frozen=True, slots=True)
class _Sizes:
    n_heads: int
    n_kv_heads: int
    intermediate_size: int


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
