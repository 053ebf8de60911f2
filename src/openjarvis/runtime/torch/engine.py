"""The torch engine: model.py on a GPU (or the CPU), batch-1 decode replayed from a CUDA graph,
and tensor parallelism over N GPUs with one process per GPU that the engine starts itself.
"""

import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
import torch.distributed as dist
import torch.multiprocessing as multiprocessing

from openjarvis.errors import UserError
from openjarvis.runtime.gguf import read_gguf_header
from openjarvis.runtime.torch.loading import build_model, load_checkpoint
from openjarvis.runtime.torch.model import Transformer, config_for
from openjarvis.runtime.torch.parallel import (
    Cut,
    SplitSizes,
    all_gather_last_dim,
    check_divisible,
    tensor_parallel,
)
from openjarvis.runtime.torch.tokenizer import GgufTokenizer
from openjarvis.runtime.types import (
    ChatRequest,
    Completion,
    Request,
    StreamChunk,
    final_completion,
    held_back,
)

if TYPE_CHECKING:  # the kernels need Triton, imported only when tensor parallelism runs
    from openjarvis.kernels.gemv_all_reduce import DecodeGemvs

__all__ = ["TorchEngine", "TorchSettings"]

AllReduceChoice = Literal["auto", "nccl", "peer"]
FusedGemvChoice = Literal["auto", "on", "off"]


@dataclass(frozen=True, slots=True)
class TorchSettings:
    device: str = "auto"  # "auto": cuda when a GPU is visible, else cpu
    dtype: str = "auto"  # "auto": bfloat16 on cuda, float32 on cpu
    tp: int = 1  # tensor-parallel processes, one per GPU (gloo processes on the CPU)
    max_seq_len: int = 4096
    cuda_graphs: bool = True  # replay batch-1 decode from a CUDA graph (GPU only)
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


@dataclass(frozen=True, slots=True)
class _Spec:
    """What every process needs to build its piece of the same model (picklable for spawn)."""

    source: str  # a .gguf path, a Hugging Face folder, or a preset name (random weights)
    settings: TorchSettings
    port: int


_PREFILL, _DECODE, _LOGITS, _STOP = 1, 2, 3, 4
# Decode steps per command under tensor parallelism: the followers run them on their own, so a
# command (a gloo broadcast, ~0.7 ms on two H200s) is paid once per run rather than per token;
# a consumer that stops early costs at most this many steps less one.
DECODE_RUN = 16


@dataclass(frozen=True, slots=True)
class _Command:
    """What rank 0 tells every rank to do. PREFILL: the prompt's tokens, then the first token
    picked with (temperature, seed), which the following runs keep sampling with. DECODE:
    `steps` steps from tokens[0] at `position`, ending early after any of tokens[1:]."""

    op: int
    tokens: list[int]
    position: int
    steps: int = 0
    temperature: float = 0.0
    seed: int = 0

    def header(self) -> torch.Tensor:
        temperature = struct.unpack("<q", struct.pack("<d", self.temperature))[0]
        fields = [self.op, len(self.tokens), self.position, self.steps, temperature, self.seed]
        return torch.tensor(fields, dtype=torch.long)

    @classmethod
    def from_header(cls, header: torch.Tensor, tokens: list[int]) -> "_Command":
        op, _, position, steps, temperature, seed = (int(v) for v in header)
        temperature_f = struct.unpack("<d", struct.pack("<q", temperature))[0]
        return cls(op, tokens, position, steps, temperature_f, seed)


class TorchEngine:
    """Serves requests from rank 0 (this process); ranks 1..N-1 follow its commands."""

    kind = "torch"
    concurrency = 1

    def __init__(self, source: str | Path, settings: TorchSettings | None = None) -> None:
        self.settings = (settings or TorchSettings()).resolved()
        settings = self.settings
        if settings.tp < 1:
            raise UserError(f"--tp must be at least 1, not {settings.tp}")
        if settings.device == "cuda" and torch.cuda.device_count() < settings.tp:
            raise UserError(
                f"--tp {settings.tp} needs {settings.tp} GPUs; {torch.cuda.device_count()} visible"
            )
        self._source = str(source)
        if settings.tp > 1:
            check_divisible(_peek_config(self._source), settings.tp)  # before starting anyone
        self._lock = threading.Lock()
        self._workers: list[BaseProcess] = []
        self.tokenizer: GgufTokenizer | None = None
        if self._source.endswith(".gguf"):
            self.tokenizer = GgufTokenizer(Path(self._source))
        spec = _Spec(self._source, settings, _free_port() if settings.tp > 1 else 0)
        if settings.tp > 1:
            context = multiprocessing.get_context("spawn")
            for rank in range(1, settings.tp):
                worker = context.Process(target=_follow, args=(rank, spec), daemon=True)
                worker.start()
                self._workers.append(worker)
        try:
            self._rank = _Rank(0, spec)
        except BaseException:
            self._stop_workers()
            raise
        self.config = self._rank.model.config
        bandwidth = _device_bandwidth(self._rank.device)
        # None on the CPU: not measured, so the engine reports no MBU.
        self.bandwidth_bytes_per_s = bandwidth * settings.tp if bandwidth is not None else None

    @property
    def model_name(self) -> str:
        return Path(self._source).stem if os.sep in self._source else self._source

    @property
    def devices(self) -> tuple[int, ...]:
        """Rank r runs on cuda:r, so tensor parallelism over N GPUs uses the first N visible."""
        return tuple(range(self.settings.tp)) if self.settings.device == "cuda" else ()

    def settings_dict(self) -> dict[str, object]:
        return {
            **asdict(self.settings),
            "cuda_graph": self._rank.graph is not None,
            "all_reduce_table": self._rank.all_reduce_table,
            "fused_gemv_table": self._rank.fused_gemv_table,
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
        """Decode, greedily at temperature 0 (else sampled with `seed`): yields (token, arrival
        time on time.monotonic()) one by one."""
        if not prompt:
            raise UserError("the prompt is empty: nothing to continue")
        if len(prompt) + max_tokens > self.config.max_seq_len:
            raise UserError(
                f"prompt ({len(prompt)} tokens) plus max_tokens ({max_tokens}) exceeds the "
                f"context of {self.config.max_seq_len}; raise max_seq_len or lower max_tokens"
            )
        if max_tokens < 1:
            return
        rank = self._rank
        if seed is None:  # drawn here, so that every rank samples with the same generator
            seed = int.from_bytes(os.urandom(7), "little")
        end = len(prompt) + max_tokens  # the position after the last token
        token = next(rank.command(_Command(_PREFILL, prompt, 0, 0, temperature, seed)))
        position = len(prompt)  # where `token` goes in the KV cache
        yield token, time.monotonic()
        while token not in stop_tokens and position < end - 1:
            # Followers decode a run of steps on their own (each rank picks the same token
            # from the same logits): one command per run, not one per token.
            steps = min(DECODE_RUN, end - 1 - position)
            run = rank.command(_Command(_DECODE, [token, *stop_tokens], position, steps))
            try:
                for token in run:  # the run ends after a stop token
                    position += 1
                    yield token, time.monotonic()
            finally:
                if self.settings.tp > 1:  # a consumer that stops early: the peers finish the
                    for _ in run:  # run, and so must we (at most DECODE_RUN - 1 steps)
                        pass

    def logits(self, prompt: list[int]) -> torch.Tensor:
        """Float32 logits at every prompt position, [len(prompt), vocab], on the CPU: for
        scoring by log-likelihood, and for checking tensor parallelism against one process."""
        with self._lock:
            next(self._rank.command(_Command(_LOGITS, prompt, 0)))
            assert self._rank.last_logits is not None
            return self._rank.last_logits

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
        with self._lock:
            start_s = time.monotonic()
            if isinstance(request, ChatRequest):
                prompt = tokenizer.chat_prompt(request.messages)
            else:
                prompt = tokenizer.encode(request.prompt)
            text_bytes, text, emitted = b"", "", 0
            times: list[float] = []
            finish_reason = "length"
            longest_stop = max((len(stop) for stop in request.stop), default=0)
            # None runs to the end of the context, as in the llama.cpp engine.
            max_tokens = request.max_tokens
            if max_tokens is None:
                max_tokens = self.config.max_seq_len - len(prompt)
                if max_tokens < 1:
                    raise UserError(
                        f"prompt ({len(prompt)} tokens) fills the context of "
                        f"{self.config.max_seq_len} tokens; raise max_seq_len or shorten the prompt"
                    )
            for token, time_s in self.generate_tokens(
                prompt, max_tokens, tokenizer.end_tokens, request.temperature, request.seed
            ):
                if token in tokenizer.end_tokens:
                    finish_reason = "stop"
                    break
                times.append(time_s)
                searched_from = max(0, len(text) - longest_stop)
                text_bytes += tokenizer.piece(token)
                text = text_bytes.decode("utf-8", errors="ignore")
                cut = min(
                    (i for stop in request.stop if (i := text.find(stop, searched_from)) >= 0),
                    default=-1,
                )
                if cut >= 0:
                    text, finish_reason = text[:cut], "stop"
                safe = len(text) - held_back(text, request.stop)
                if safe > emitted:
                    yield StreamChunk(text[emitted:safe], time_s)
                    emitted = safe
                if finish_reason == "stop":
                    break
            end_s = time.monotonic()
            completion = self._completion(text, len(prompt), times, finish_reason, start_s, end_s)
            yield StreamChunk(text[emitted:], end_s, completion)

    def _completion(
        self,
        text: str,
        prompt_tokens: int,
        times: list[float],
        finish_reason: str,
        start_s: float,
        end_s: float,
    ) -> Completion:
        decode_s = times[-1] - times[0] if times else None
        bytes_per_token = self.decode_bytes_per_token()
        mbu = None
        if self.bandwidth_bytes_per_s is not None and decode_s and len(times) > 1:
            mbu = (len(times) - 1) / decode_s * bytes_per_token / self.bandwidth_bytes_per_s
        return Completion(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(times),
            finish_reason=finish_reason,
            wall_s=end_s - start_s,
            ttft_s=times[0] - start_s if times else None,
            decode_s=decode_s,
            decode_bytes_per_token=bytes_per_token,
            memory_bandwidth_utilisation=mbu,
        )

    def decode_bytes_per_token(self) -> float:
        """Bytes one decode step reads on all GPUs together: every weight but the embedding
        table (one row of it), plus the whole static KV cache, which attention reads in full."""
        config = self.config
        element = torch.finfo(getattr(torch, self.settings.dtype)).bits // 8
        weights = config.parameter_count - config.vocab_size * config.dim
        if config.tie_embeddings:
            weights += config.vocab_size * config.dim  # the head reads the shared table
        kv_cache = 2 * config.n_layers * config.n_kv_heads * config.head_dim * config.max_seq_len
        return float((weights + kv_cache) * element)

    def close(self) -> None:
        with self._lock:
            if self.settings.tp > 1 and dist.is_initialized():
                list(self._rank.command(_Command(_STOP, [], 0)))
            # Every rank tears its process group down at the same time: NCCL's teardown
            # waits for the peers, so joining the workers first would wait forever.
            self._rank.close()
            self._stop_workers()

    def _stop_workers(self) -> None:
        for worker in self._workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
        self._workers = []


class _Rank:
    """One process's model, its decode graph and its part in the command protocol."""

    def __init__(self, rank: int, spec: _Spec) -> None:
        settings = spec.settings
        self.rank = rank
        self.world_size = settings.tp
        cuda = settings.device == "cuda"
        self.device = torch.device(settings.device, rank) if cuda else torch.device(settings.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dtype = getattr(torch, settings.dtype)
        self.all_reduce_table: dict[str, str] | None = None
        self.fused_gemv_table: dict[str, str] | None = None
        shard = None
        # The fused decode products of every shape timed, owned here for the engine's lifetime.
        self.decode_gemvs: DecodeGemvs | None = None
        if self.world_size > 1:
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(
                backend,
                init_method=f"tcp://127.0.0.1:{spec.port}",
                rank=rank,
                world_size=self.world_size,
                timeout=timedelta(minutes=10),  # loading a large checkpoint takes minutes
                device_id=self.device if self.device.type == "cuda" else None,
            )
            # Commands travel on the CPU: a few integers, and no GPU stream to wait behind.
            self.commands = dist.new_group(backend="gloo") if backend == "nccl" else None
            from openjarvis.kernels import AllReduce

            world = dist.group.WORLD
            assert world is not None, "set by init_process_group"
            self.all_reduce = AllReduce(world, self.device, dtype, settings.all_reduce)
            self.all_reduce_table = self.all_reduce.table_summary()
            if self.all_reduce.peer is not None and settings.fused_gemv != "off":
                from openjarvis.kernels import gemv_all_reduce

                self.decode_gemvs = gemv_all_reduce.DecodeGemvs(
                    world, self.device, dtype, self.all_reduce.reduce,
                    settings.fused_gemv,
                )  # fmt: skip
            shard = tensor_parallel(
                rank,
                self.world_size,
                self.all_reduce,
                all_gather_last_dim(),
                self.decode_gemvs.for_shape if self.decode_gemvs else None,
            )
        self.model = _load(spec, self.device, dtype, shard)
        if self.decode_gemvs is not None:
            self.fused_gemv_table = self.decode_gemvs.summary()
        self.model.setup_caches(1, dtype)
        self.token = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)
        self.next_token = torch.zeros(1, dtype=torch.long, device=self.device)
        # The last position's logits of every step, for sampling on rank 0 (float32, [vocab]).
        self.step_logits = torch.zeros(
            self.model.config.vocab_size, dtype=torch.float32, device=self.device
        )
        self.last_logits: torch.Tensor | None = None
        self.pick: Callable[[int], int] = lambda greedy: greedy  # set by each PREFILL
        self.decode_step = self._decode_step
        if settings.compile:
            # One graph for the whole step (the collectives are registered operators); static
            # shapes: a decode step is always one token. Compiled on its first call.
            self.decode_step = torch.compile(
                self._decode_step, fullgraph=True, dynamic=False, mode=settings.compile_mode
            )
        self.graph: torch.cuda.CUDAGraph | None = None
        if self.device.type == "cuda" and settings.cuda_graphs:
            self._capture()

    def _decode_step(self) -> None:
        logits = self.model(self.token, self.position)[0, -1]  # [vocab]
        self.step_logits.copy_(logits)
        self.next_token.copy_(logits.argmax())

    @torch.inference_mode()
    def _capture(self) -> None:
        # Warm up on a side stream (kernels chosen, workspaces allocated), then capture. Every
        # rank captures the same sequence, so the collectives inside line up.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                self.decode_step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.decode_step()
        torch.cuda.synchronize()

    def command(self, command: _Command) -> Iterator[int]:
        """Rank 0: send a command to the followers, then run it here, yielding its tokens."""
        if self.world_size > 1:
            dist.broadcast(command.header(), src=0, group=self.commands)
            if command.tokens:
                tokens = torch.tensor(command.tokens, dtype=torch.long)
                dist.broadcast(tokens, src=0, group=self.commands)
        return self.run(command)

    @torch.inference_mode()
    def run(self, command: _Command) -> Iterator[int]:
        """The command's next tokens, one per step (none for STOP, the picked token for
        PREFILL and LOGITS). A generator: the steps run as they are asked for."""
        op = command.op
        if op == _STOP:
            return
        if op in (_PREFILL, _LOGITS):
            ids = torch.tensor([command.tokens], dtype=torch.long, device=self.device)
            start = command.position
            positions = torch.arange(start, start + len(command.tokens), device=self.device)
            logits = self.model(ids, positions, last_only=op == _PREFILL)
            if op == _LOGITS:
                self.last_logits = logits[0].float().cpu()
            self.step_logits.copy_(logits[0, -1])
            self.pick = _picker(command.temperature, command.seed, self.step_logits)
            yield self.pick(int(logits[0, -1].argmax()))
            return
        token, stop = command.tokens[0], frozenset(command.tokens[1:])
        for position in range(command.position, command.position + command.steps):
            self.token.fill_(token)
            self.position.fill_(position)
            if self.graph is not None:
                self.graph.replay()
            else:
                self.decode_step()
            token = self.pick(int(self.next_token))
            yield token
            if token in stop:
                return

    def follow(self) -> None:
        """Ranks 1..N-1: run rank 0's commands until it says stop."""
        while True:
            header = torch.empty(6, dtype=torch.long)
            dist.broadcast(header, src=0, group=self.commands)
            tokens = torch.empty(int(header[1]), dtype=torch.long)
            if len(tokens):
                dist.broadcast(tokens, src=0, group=self.commands)
            command = _Command.from_header(header, tokens.tolist())
            for _ in self.run(command):
                pass
            if command.op == _STOP:
                return

    def close(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            # A CUDA graph that captured an NCCL collective holds a reference on its
            # communicator, and NCCL's teardown waits for it forever: free the graph first.
            if self.graph is not None:
                self.graph.reset()
                self.graph = None
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            dist.destroy_process_group()


def _load(
    spec: _Spec,
    device: torch.device,
    dtype: torch.dtype,
    shard: Callable[[Transformer], Cut] | None,
) -> Transformer:
    settings = spec.settings
    path = Path(spec.source)
    if path.exists():
        config, state = load_checkpoint(path, settings.max_seq_len)
        if settings.tp > 1:
            check_divisible(config, settings.tp)
        return build_model(config, device=device, dtype=dtype, state_dict=state, shard=shard)
    if spec.source.endswith(".gguf") or os.sep in spec.source:
        raise UserError(f"model not found: {spec.source}; pass a .gguf file or a preset name")
    config = replace(config_for(spec.source), max_seq_len=settings.max_seq_len)
    if settings.tp > 1:
        check_divisible(config, settings.tp)
    return build_model(config, device=device, dtype=dtype, shard=shard, seed=settings.seed)


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


def _follow(rank: int, spec: _Spec) -> None:
    follower = _Rank(rank, spec)
    try:
        follower.follow()
    finally:
        follower.close()


def _picker(temperature: float, seed: int, logits: torch.Tensor) -> Callable[[int], int]:
    """How the next token is chosen from a step: the greedy token at temperature 0, else a draw
    from softmax(logits / temperature) with its own generator, seeded alike on every rank (the
    logits are the same on every rank, so all draw the same token)."""
    if temperature <= 0:
        return lambda greedy: greedy
    generator = torch.Generator(logits.device)
    generator.manual_seed(seed)

    def sample(greedy: int) -> int:
        probabilities = torch.softmax(logits / temperature, dim=-1)
        return int(torch.multinomial(probabilities, 1, generator=generator))

    return sample


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
