"""The torch engine: model.py on a GPU (or the CPU), many sequences decoded together from a
paged KV cache, and tensor parallelism over N GPUs with one process per GPU.

A scheduler thread on rank 0 runs the steps (scheduler.py picks them, runner.py runs them on
every rank alike); each request's stream reads its tokens from a queue, so requests from many
threads share the running batch (nano-vllm's engine loop; gpt-fast's model and TP pass).
"""

import json
import os
import socket
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import asdict, dataclass, replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Literal

import torch
import torch.multiprocessing as multiprocessing

from openjarvis.errors import UserError
from openjarvis.runtime.gguf import read_gguf_header
from openjarvis.runtime.streaming import Outcome, stream_text
from openjarvis.runtime.torch.model import config_for
from openjarvis.runtime.torch.paged import BlockPool
from openjarvis.runtime.torch.parallel import SplitSizes, check_divisible
from openjarvis.runtime.torch.runner import BLOCK_SIZE, Runner, Spec, StepInputs
from openjarvis.runtime.torch.scheduler import Scheduler, Sequence, Step
from openjarvis.runtime.torch.tokenizer import GgufTokenizer
from openjarvis.runtime.types import (
    ChatRequest,
    Completion,
    Request,
    StepLedger,
    StreamChunk,
    WorkPiece,
    final_completion,
)

__all__ = ["TorchEngine", "TorchSettings"]

AllReduceChoice = Literal["auto", "nccl", "peer"]
FusedGemvChoice = Literal["auto", "on", "off"]


@dataclass(frozen=True, slots=True)
class TorchSettings:
    device: str = "auto"  # "auto": cuda when a GPU is visible, else cpu
    dtype: str = "auto"  # "auto": bfloat16 on cuda, float32 on cpu
    tp: int = 1  # tensor-parallel processes, one per GPU (gloo processes on the CPU)
    max_seq_len: int = 4096
    # Sequences decoded together at most (the engine's concurrency); the KV cache holds this
    # many full-length sequences where memory allows.
    max_batch: int = 64
    prefill_tokens: int = 2048  # prompt tokens per prefill step (longer prompts: in chunks)
    # Keep the KV blocks of prompts by content and reuse a shared prefix (chat turns, a system
    # prompt); a benchmark measures every request from a cold cache instead (off).
    reuse_prompt_cache: bool = True
    cuda_graphs: bool = True  # replay decode steps from CUDA graphs, one per batch bucket (GPU)
    # torch.compile the decode step (fusing norms, RoPE, residuals: fewer, larger kernels).
    # None: on the GPU, off on the CPU (where inductor's C++ build costs more than it saves).
    compile: bool | None = None
    # torch.compile's mode for that step: "max-autotune-no-cudagraphs" also tunes the matmuls
    # (minutes longer to start); never a mode with CUDA graphs: the engine captures its own.
    compile_mode: str = "default"
    # "auto": our peer all-reduce where the size table says it beats NCCL, else NCCL.
    all_reduce: AllReduceChoice = "auto"
    # One token's attention-out and MLP-down products fused with their all-reduce (our peer
    # kernel): "auto" where timed faster at start-up, per shape; needs the peer all-reduce.
    fused_gemv: FusedGemvChoice = "auto"
    seed: int = 0  # random-weights mode only

    def resolved(self) -> "TorchSettings":
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = self.dtype
        if dtype == "auto":
            dtype = "bfloat16" if device == "cuda" else "float32"
        compile = device == "cuda" if self.compile is None else self.compile
        return replace(self, device=device, dtype=dtype, compile=compile)


class TorchEngine:
    """Serves requests from any thread; rank 0 (this process) schedules, ranks 1..N-1 (spawned
    processes) run the same steps."""

    kind = "torch"

    def __init__(self, source: str | Path, settings: TorchSettings | None = None) -> None:
        self.settings = (settings or TorchSettings()).resolved()
        settings = self.settings
        if settings.tp < 1:
            raise UserError(f"--tp must be at least 1, not {settings.tp}")
        if settings.max_batch < 1:
            raise UserError(f"--max-batch must be at least 1, not {settings.max_batch}")
        if settings.device == "cuda" and torch.cuda.device_count() < settings.tp:
            raise UserError(
                f"--tp {settings.tp} needs {settings.tp} GPUs; {torch.cuda.device_count()} visible"
            )
        self._source = str(source)
        if settings.tp > 1:
            check_divisible(_peek_config(self._source), settings.tp)  # before starting anyone
        self._workers: list[BaseProcess] = []
        self.tokenizer: GgufTokenizer | None = None
        if self._source.endswith(".gguf"):
            self.tokenizer = GgufTokenizer(Path(self._source))
        spec = Spec(self._source, settings, _free_port() if settings.tp > 1 else 0)
        if settings.tp > 1:
            context = multiprocessing.get_context("spawn")
            for rank in range(1, settings.tp):
                worker = context.Process(target=_follow, args=(rank, spec), daemon=True)
                worker.start()
                self._workers.append(worker)
        try:
            self._runner = Runner(0, spec)
        except BaseException:
            self._stop_workers()
            raise
        self.config = self._runner.model.config
        pool = BlockPool(self._runner.blocks, BLOCK_SIZE, reuse=settings.reuse_prompt_cache)
        self._scheduler = Scheduler(
            pool, settings.max_batch, settings.prefill_tokens, self.config.max_seq_len
        )
        bandwidth = _device_bandwidth(self._runner.device)
        # None on the CPU: not measured, so the engine reports no MBU.
        self.bandwidth_bytes_per_s = bandwidth * settings.tp if bandwidth is not None else None
        self._wake = threading.Condition()
        self._inbox: list[Sequence] = []
        self._closing = False
        self._failure: BaseException | None = None
        # Decode steps are chained (launched before the one before has landed) in one process.
        self._chains = settings.tp == 1
        self._landed_s = 0.0  # when the last step's picks reached the host
        self.ledger = StepLedger()  # each step as it lands, for the meter
        self._loop_thread = threading.Thread(target=self._loop, name="torch-engine", daemon=True)
        self._loop_thread.start()

    @property
    def model_name(self) -> str:
        return Path(self._source).stem if os.sep in self._source else self._source

    @property
    def devices(self) -> tuple[int, ...]:
        """Rank r runs on cuda:r, so tensor parallelism over N GPUs uses the first N visible."""
        return tuple(range(self.settings.tp)) if self.settings.device == "cuda" else ()

    @property
    def concurrency(self) -> int:
        return self.settings.max_batch

    def settings_dict(self) -> dict[str, object]:
        return {
            **asdict(self.settings),
            "kv_cache_blocks": self._runner.blocks,
            "kv_block_size": BLOCK_SIZE,
            "cuda_graph_buckets": sorted(self._runner.graphs),
            "all_reduce_table": self._runner.all_reduce_table,
            "fused_gemv_table": self._runner.fused_gemv_table,
            "memory_bandwidth_gb_per_s": self.bandwidth_bytes_per_s / 1e9
            if self.bandwidth_bytes_per_s is not None
            else None,
        }

    # ---- token level (benchmarks use this directly) --------------------------------------

    def generate_tokens(
        self,
        prompt: list[int],
        max_tokens: int,
        stop_tokens: frozenset[int] = frozenset(),
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> Iterator[tuple[int, float]]:
        """Decode, greedily at temperature 0 (else sampled with `seed`): (token, arrival time
        on time.monotonic()) one by one, ending after a stop token. Closing the iterator early
        frees the sequence."""
        if max_tokens < 1:
            self._check_fits(prompt, 0)
            return iter(())
        return self._deliveries(self._submit(prompt, max_tokens, stop_tokens, temperature, seed))

    def logits(self, prompt: list[int]) -> torch.Tensor:
        """Float32 logits at every prompt position, [len(prompt), vocab], on the CPU: for
        scoring by log-likelihood, and for checking tensor parallelism against one process."""
        sequence = Sequence(prompt, 0, frozenset(), all_logits=True)
        self._check_fits(prompt, 0)
        self._enqueue(sequence)
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
        self.ledger.attach(ledger_key, sequence.work)  # before any step of it can land
        self._enqueue(sequence)
        return sequence

    def _enqueue(self, sequence: Sequence) -> None:
        with self._wake:
            if self._failure is not None:
                raise RuntimeError("the torch engine stopped after an error") from self._failure
            if self._closing:
                raise RuntimeError("the torch engine is closed")
            self._inbox.append(sequence)
            self._wake.notify()

    def _deliveries(self, sequence: Sequence) -> Generator[tuple[int, float]]:
        try:
            while (item := sequence.outbox.get()) is not None:
                if isinstance(item, UserError):
                    raise UserError(str(item))
                if isinstance(item, BaseException):
                    raise RuntimeError(f"the torch engine failed: {item}") from item
                yield item
        finally:
            sequence.cancelled = True  # a consumer that leaves early frees its sequence

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
            finish=lambda outcome: self._completion(outcome, len(prompt), tuple(sequence.work)),
        )

    def _completion(
        self, outcome: Outcome, prompt_tokens: int, work: tuple[WorkPiece, ...]
    ) -> Completion:
        times = outcome.token_times_s
        # The decode steps: those after the first token (the prompt's steps come before).
        decoding = [piece for piece in work if times and piece.start_s >= times[0]]
        batch = _mean_batch(decoding) or 1.0
        context = prompt_tokens + len(times) / 2  # mean context over the decode
        bytes_per_token = (self.weight_bytes() + batch * self.kv_bytes(context)) / batch
        return outcome.completion(
            prompt_tokens,
            decode_bytes_per_token=bytes_per_token,
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
            work=work,
            batch=batch,
        )

    def weight_bytes(self) -> float:
        """Bytes of weights one decode step reads on all GPUs together: every weight but the
        embedding table (one row of it per token)."""
        config = self.config
        weights = config.parameter_count - config.vocab_size * config.dim
        if config.tie_embeddings:
            weights += config.vocab_size * config.dim  # the head reads the shared table
        return float(weights * self._element_bytes())

    def kv_bytes(self, context: float) -> float:
        """Bytes of keys and values one sequence's attention reads at `context` tokens."""
        config = self.config
        per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim
        return per_token * context * self._element_bytes()

    def _element_bytes(self) -> int:
        return torch.finfo(getattr(torch, self.settings.dtype)).bits // 8

    # ---- the scheduler thread --------------------------------------------------------------

    def _loop(self) -> None:
        runner, scheduler = self._runner, self._scheduler
        if runner.device.type == "cuda":
            torch.cuda.set_device(runner.device)
        try:
            while True:
                with self._wake:
                    if not self._inbox and scheduler.idle:
                        scheduler.deliver()
                        self.ledger.idle()
                    while not self._inbox and scheduler.idle and not self._closing:
                        self._wake.wait()
                    arrived, self._inbox = self._inbox, []
                    if self._closing and scheduler.idle and not arrived:
                        return
                self.ledger.busy()  # before any step starts: their times follow this
                for sequence in arrived:
                    try:
                        scheduler.add(sequence)
                    except ValueError as error:
                        sequence.outbox.put(UserError(str(error)))
                step = scheduler.next_step()
                if step is None:
                    scheduler.deliver()
                else:
                    self._run(step)
        except BaseException as error:
            with self._wake:
                self._failure = error
                for sequence in self._inbox:
                    sequence.outbox.put(error)
                self._inbox = []
            scheduler.fail(error)

    def _run(self, step: Step) -> None:
        """Run a step. A decode step is followed by its continuations (Scheduler.continued)
        while no new sequence could start: each is launched before the step before it has
        landed, its tokens taken from that step's picks on the device, so the GPU runs one
        step while the host records the last and wakes its consumers (the overlap of
        SGLang's and vLLM's asynchronous schedulers). With tensor parallelism each step waits
        for the one before: the followers receive its tokens in rank 0's broadcast."""
        scheduler = self._scheduler
        flight = self._launch(step)
        while True:
            following = None
            if step.kind == "decode" and self._chains and not self._inbox:
                scheduler.drop_cancelled()
                continued = None if scheduler.can_admit else scheduler.continued(flight.step)
                if continued is not None:
                    following = self._launch(continued[0], flight.picks_of(continued[1]))
            self._land(flight)
            scheduler.deliver()
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
        picks = self._pick(step, logits)
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
        if flight.host is not None:
            picked = flight.host.tolist()
        end_s = time.monotonic()
        start_s = max(flight.launched_s, self._landed_s)
        self._scheduler.finish_step(flight.step, picked, start_s, end_s)
        self.ledger.landed(end_s)
        self._landed_s = end_s

    def _pick(self, step: Step, logits: torch.Tensor) -> torch.Tensor:
        """Each row's next token, on the logits' device (nothing waits for the step): greedy
        at temperature 0, else drawn from softmax(logits / temperature) with the sequence's
        own seeded generator. Rows that sample nothing get a pick that is ignored."""
        picks = logits.argmax(dim=-1)
        for i, row in enumerate(step.rows):
            sequence = row.sequence
            if row.sample and sequence.temperature > 0:
                if sequence.generator is None:
                    sequence.generator = torch.Generator(logits.device)
                    sequence.generator.manual_seed(sequence.seed)
                probabilities = torch.softmax(logits[i] / sequence.temperature, dim=-1)
                picks[i] = torch.multinomial(probabilities, 1, generator=sequence.generator)[0]
        return picks

    def close(self) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._loop_thread.join()
        if self.settings.tp > 1 and self._failure is None:
            self._runner.share(None)  # the followers leave their loops
        # Every rank tears its process group down at the same time: NCCL's teardown waits for
        # the peers, so joining the workers first would wait forever.
        self._runner.close()
        self._stop_workers()

    def _stop_workers(self) -> None:
        for worker in self._workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
        self._workers = []


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
            index = torch.tensor(rows)
            if picks.is_cuda:
                index = index.pin_memory().to(picks.device, non_blocking=True)
            picks = picks[index]
        return picks[:, None]


def _mean_batch(pieces: list[WorkPiece]) -> float | None:
    """Time-weighted mean of the steps' batch sizes."""
    total_s = sum(piece.end_s - piece.start_s for piece in pieces)
    if total_s <= 0:
        return None
    return sum(piece.batch * (piece.end_s - piece.start_s) for piece in pieces) / total_s


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


def _follow(rank: int, spec: Spec) -> None:
    follower = Runner(rank, spec)
    try:
        follower.follow()
    finally:
        follower.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _device_bandwidth(device: torch.device) -> float | None:
    """Copy bandwidth of one GPU (bytes read + written per second, best of 5 copies of 1 GiB);
    None on the CPU: not measured there, so the engine reports no MBU."""
    if device.type != "cuda":
        return None
    source = torch.empty(1 << 29, dtype=torch.float16, device=device).normal_()
    target = torch.empty_like(source)
    best_s = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        best_s = min(best_s, start.elapsed_time(end) / 1e3)
    return 2 * source.numel() * source.element_size() / best_s
