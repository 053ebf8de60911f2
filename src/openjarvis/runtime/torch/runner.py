"""One process's part of the engine: its piece of the model, its paged KV cache, and the step
that every rank runs alike (SPMD). Rank 0 broadcasts each step's inputs once; the other ranks
loop on receiving them (nano-vllm's model runner, with a broadcast in place of shared memory).

Decode steps replay a CUDA graph, captured at start-up for each batch bucket, of the smallest
bucket that holds them (padding rows write to the scratch block); prefill steps run eagerly,
or (`prefill_graphs`, one process) one sequence at a time from a graph per prompt-length
bucket and block-table width, the prompt right-aligned in it and the padding before it writing
to the scratch block. The width matters: attention reads every key the table spans, and a
short prompt's step attending over the whole context cost twice its replay without it (the
H200, docs/benchmarks.md).
A step's host tensors go to the GPU through pinned memory, and a continued decode step's tokens
are already there (the engine's picks of the step before), so launching a step never waits for
the one before it.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import psutil
import torch
import torch.distributed as dist
from torch import Tensor

from openjarvis.errors import UserError
from openjarvis.runtime.torch.config import TorchSettings
from openjarvis.runtime.torch.loading import build_model, load_checkpoint
from openjarvis.runtime.torch.model import Transformer, config_for
from openjarvis.runtime.torch.paged import BLOCK_SIZE, SCRATCH_BLOCK, Layout, slots_of
from openjarvis.runtime.torch.parallel import (
    Cut,
    all_gather_last_dim,
    check_divisible,
    tensor_parallel,
)
from openjarvis.runtime.torch.step_inputs import (
    STOP,
    StepInputs,
    batch_buckets,
    pad_prefill,
    prefill_buckets,
    prefill_graph_key,
    prefill_widths,
)

if TYPE_CHECKING:  # types only; the kernels need Triton, imported when tensor parallelism runs
    from torch.cuda import _POOL_HANDLE

    from openjarvis.kernels.gemv_all_reduce import DecodeGemvs
    from openjarvis.runtime.torch.one_row import OneRowStep

__all__ = ["Runner", "Spec", "pdl_choice"]

# How far the one-row kernels' hidden state may stray from the model's step's at start-up (L2
# norm of the difference over the step's). Both are bf16 summed in other orders over the same
# cache; the embedded model's whole 100-token sequence in bf16 against float32 (each with its
# own cache, on the CPU) differs by 3.1 %, one step over one cache by less. A kernel built wrong
# differs by more: the tiny Gemma 3 config's step with a norm's weight offset, the q rotation,
# the embedding scale or a post norm left out differed by 29, 15, 103 and 14 % (interpreted).
_ONE_ROW_TOLERANCE = 0.1
# Keys the one-row kernels and the compiled step attend over when "auto" times them at start:
# attention is the kernels' longest phase, and 400 the context they were measured at on the H200.
_TIMED_POSITIONS = 400
# The KV cache takes this share of the GPU memory left free after loading the weights.
_KV_MEMORY_SHARE = 0.8


@dataclass(frozen=True, slots=True)
class Spec:
    """What every process needs to build its piece of the same model (picklable for spawn)."""

    source: str  # a .gguf path, a Hugging Face folder, or a preset name (random weights)
    settings: TorchSettings
    port: int


class Runner:
    """Rank r runs on cuda:r (or the CPU, with gloo between processes)."""

    def __init__(self, rank: int, spec: Spec) -> None:
        settings = spec.settings
        self.rank = rank
        self.world_size = settings.tp
        cuda = settings.device == "cuda"
        self.device = torch.device(settings.device, rank) if cuda else torch.device(settings.device)
        if cuda:
            torch.cuda.set_device(self.device)
            # cuBLASLt's kernels for the decode step's few-row products: at 64 rows on the
            # 8B shape (H200) the down product at 0.91 of the copy bandwidth against cuBLAS's
            # split-K 0.80, gate and up 0.97 against 0.93; decode steps 6.22 against 6.40 ms,
            # mixed steps 50.9 against 52.2 ms (benchmarks/skinny_products.py, docs). A
            # process-wide setting: the engine's core has its process to itself on a GPU.
            torch.backends.cuda.preferred_blas_library("cublaslt")
        dtype = getattr(torch, settings.dtype)
        self.all_reduce_table: dict[str, str] | None = None
        self.fused_gemv_table: dict[str, str] | None = None
        self.decode_gemvs: DecodeGemvs | None = None  # owned here for the engine's lifetime
        shard = None
        if self.world_size > 1:
            shard = self._join_group(spec, dtype)
        self.model = _load(spec, self.device, dtype, shard)
        if self.decode_gemvs is not None:
            self.fused_gemv_table = self.decode_gemvs.summary()
        config = self.model.config
        self.concurrency = settings.concurrency
        # Rows a decode step holds at most: a row per running sequence, and new prompts'
        # tokens as rows of one query. Only the first `concurrency` rows get logits (the
        # scheduler puts the rows that sample first): the output head of a step with 2,048
        # prompt rows would otherwise compute 2,048 rows of logits to use a few. The head
        # runs outside the compiled body, so one compiled graph still serves every bucket.
        assert settings.decode_prompt_rows is not None, "set by TorchSettings.resolved()"
        self.prompt_rows = settings.decode_prompt_rows
        self.decode_rows = settings.concurrency + self.prompt_rows
        self.buckets = batch_buckets(self.decode_rows, settings.concurrency)
        self.blocks = self._cache_blocks(settings.concurrency, config.max_seq_len, dtype)
        self.model.setup_caches(self.blocks, BLOCK_SIZE, dtype)
        self.table_width = -(-config.max_seq_len // BLOCK_SIZE)
        # One-row decode steps: the fused layer kernel where the model fits it.
        self.one_row: OneRowStep | None = None
        self.one_row_note = self._one_row_step(settings)
        # A decode step's body: the layers and the final norm, compiled on the GPU.
        self.body: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor] = self._last_hidden
        if settings.compile:
            limit = max(64, 2 * len(self.buckets))
            torch._dynamo.config.cache_size_limit = limit
            self.body = torch.compile(
                self._last_hidden, fullgraph=True, dynamic=False, mode=settings.compile_mode
            )
        self.use_graphs = cuda and settings.cuda_graphs
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        if self.use_graphs:
            width = self.table_width
            self.static = StepInputs(
                True,
                True,
                torch.zeros(self.decode_rows, 1, dtype=torch.long, device=self.device),
                torch.zeros(self.decode_rows, 1, dtype=torch.long, device=self.device),
                torch.zeros(self.decode_rows, 1, dtype=torch.long, device=self.device),
                torch.zeros(self.decode_rows, width, dtype=torch.int32, device=self.device),
            )
            # Every bucket is compiled and captured now, largest first (as nano-vllm does):
            # done lazily, the first batch of each size paid seconds of compilation inside
            # its requests' time and energy (measured on the H200 with the embedded model).
            # The scratch block is all the capture writes.
            for bucket in reversed(self.buckets):
                self.graphs[bucket] = self._capture(bucket)
            if self.one_row is not None and settings.one_row_kernel == "auto":
                self.one_row_note = self._time_one_row(self.one_row_note)
        # Prefill graphs replay the eager model (a compiled one would build a graph per bucket).
        self.prefill_graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.prefill_lengths: tuple[int, ...] = ()
        if self.use_graphs and settings.prefill_graphs and self.world_size == 1:
            top = min(settings.prefill_tokens, config.max_seq_len)
            # The capture writes the scratch block only: every slot and table entry points there.
            scratch_slot = SCRATCH_BLOCK * BLOCK_SIZE
            self.prefill_static = StepInputs(
                False,
                True,
                torch.zeros(1, top, dtype=torch.long, device=self.device),
                torch.zeros(1, top, dtype=torch.long, device=self.device),
                torch.full((1, top), scratch_slot, dtype=torch.long, device=self.device),
                torch.full(
                    (1, self.table_width), SCRATCH_BLOCK, dtype=torch.int32, device=self.device
                ),
            )
            # One memory pool for them all, captured largest first (nano-vllm's order): they
            # run one at a time, and each keeps only its logits.
            pool = torch.cuda.graph_pool_handle()
            self.prefill_lengths = prefill_buckets(top)
            for bucket in reversed(self.prefill_lengths):
                for width in reversed(prefill_widths(bucket, self.table_width)):
                    graph = self._capture_prefill(bucket, width, pool)
                    self.prefill_graphs[bucket, width] = graph

    def _join_group(self, spec: Spec, dtype: torch.dtype) -> Callable[[Transformer], Cut]:
        settings = spec.settings
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{spec.port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(minutes=10),  # loading a large checkpoint takes minutes
            device_id=self.device if self.device.type == "cuda" else None,
        )
        from openjarvis.kernels import AllReduce

        world = dist.group.WORLD
        assert world is not None, "set by init_process_group"
        self.all_reduce = AllReduce(world, self.device, dtype, settings.all_reduce)
        self.all_reduce_table = self.all_reduce.table_summary()
        if self.all_reduce.peer is not None and settings.fused_gemv != "off":
            from openjarvis.kernels import gemv_all_reduce

            self.decode_gemvs = gemv_all_reduce.DecodeGemvs(
                world, self.device, dtype, self.all_reduce.reduce, settings.fused_gemv
            )
        return tensor_parallel(
            self.rank,
            self.world_size,
            self.all_reduce,
            all_gather_last_dim(),
            self.decode_gemvs.for_shape if self.decode_gemvs else None,
        )

    def _one_row_step(self, settings: TorchSettings) -> str:
        """Set up the one-row kernels where asked for and the model fits them; what was done."""
        if settings.one_row_kernel == "off":
            return "off: not asked for"
        if self.device.type != "cuda":
            return "off: not on a GPU"
        if not settings.cuda_graphs:  # each of a step's ~90 launches would pay Python's cost
            return "off: without CUDA graphs"
        if self.world_size > 1:  # the kernel holds whole layers
            return "off: tensor parallelism"
        from openjarvis.kernels.decode_layer import gdc_wait  # needs Triton
        from openjarvis.runtime.torch.one_row import OneRowStep, supported

        reason = supported(self.model)
        if reason is not None:
            return f"off: {reason}"
        programs = torch.cuda.get_device_properties(self.device).multi_processor_count
        capability = torch.cuda.get_device_capability(self.device)
        pdl, pdl_note = pdl_choice(settings.one_row_pdl, gdc_wait is not None, capability)
        step = OneRowStep(self.model, programs, pdl=pdl)
        # One step first, where its kernels compile, against the model's own step on the same
        # inputs: a Triton that cannot build them, or builds them wrong, leaves the compiled
        # step in place, said in the engine's settings.
        try:
            with torch.inference_mode():
                difference = self._one_row_difference(step)
        except Exception as error:  # a build or launch failure: the compiled step instead
            lines = str(error).strip().splitlines() or [""]
            return f"off: its kernels failed to start ({type(error).__name__}: {lines[0]})"
        if not difference <= _ONE_ROW_TOLERANCE:  # NaN too
            return f"off: its output differs from the model's step ({difference:.3g} of it)"
        self.one_row = step
        within = f"within {difference:.2g} of the model's step"
        return f"on: {programs} programs a launch, {within}{pdl_note}"

    def _time_one_row(self, note: str) -> str:
        """The one-row kernels' graph against the compiled step's two-row graph, replayed in
        turns over `_TIMED_POSITIONS` keys (of the scratch block: only it is written). The
        slower goes: the kernels, or bucket 1's graph, a row then running in bucket 2's."""
        if 2 not in self.graphs:
            return f"{note}; not timed (no two-row graph to time it against)"
        from openjarvis.kernels.all_reduce import timed_us

        positions = self.static.positions
        positions[:2] = min(_TIMED_POSITIONS, self.model.config.max_seq_len) - 1
        kernel, compiled = self.graphs[1][0], self.graphs[2][0]
        rounds = [
            [timed_us(partial(_replays, graph, 10)) / 10 for graph in (kernel, compiled)]
            for _ in range(7)
        ]
        positions[:2] = 0
        kernel_us, compiled_us = (sorted(column)[3] for column in zip(*rounds, strict=True))
        timing = f"{kernel_us / 1e3:.3f} ms a step against {compiled_us / 1e3:.3f} ms"
        if kernel_us < compiled_us:
            return f"{note}, {timing} for the compiled step at two rows"
        self.one_row = None
        del self.graphs[1]
        self.buckets = tuple(bucket for bucket in self.buckets if bucket != 1)
        return f"off: slower than the compiled step at two rows ({timing})"

    def _one_row_difference(self, step: "OneRowStep") -> float:
        """The kernels' hidden state against the model's own step, at the 100th position of a
        sequence in the cache's first free blocks (none is in use yet; what is written there is
        overwritten before it is read), or as far as they reach: the size of the difference
        over the size of the model's (L2 norms). On a GPU the kernels' step is captured in a
        CUDA graph and replayed, so that a launch a graph cannot hold fails here."""
        blocks = max(1, min(7, self.blocks - 1))
        length = min(100, blocks * BLOCK_SIZE)
        first = SCRATCH_BLOCK + 1 if self.blocks > 1 else SCRATCH_BLOCK
        table = torch.full((1, self.table_width), SCRATCH_BLOCK, dtype=torch.int32)
        table[0, :blocks] = torch.arange(first, first + blocks, dtype=torch.int32)
        generator = torch.Generator().manual_seed(0)
        vocab = self.model.config.vocab_size
        tokens = torch.randint(0, vocab, (1, length), generator=generator).to(self.device)
        positions = torch.arange(length, device=self.device).view(1, -1)
        table = table.to(self.device)
        slots = slots_of(table, positions, BLOCK_SIZE)
        cached = length - 1
        self.model.hidden(
            tokens[:, :cached], Layout(positions[:, :cached], slots[:, :cached], table)
        )
        row = (tokens[:, cached:], positions[:, cached:], slots[:, cached:], table)
        expected = self._last_hidden(*row).float()
        if self.device.type == "cuda":  # as the engine will run it: in a CUDA graph
            graph, output = _captured(step, row, warm_ups=1, pool=None)
            graph.replay()
            got = output.float()
        else:  # the kernels interpreted (a test)
            got = step(*row).float()
        return float((got - expected).norm() / expected.norm())

    def _cache_blocks(self, concurrency: int, max_seq_len: int, dtype: torch.dtype) -> int:
        """Blocks for concurrency full-length sequences, or what fits in the free memory (the
        GPU's, or the machine's on the CPU); the same on every rank (the smallest), since every
        rank must hold every block."""
        config = self.model.config
        wanted = concurrency * -(-max_seq_len // BLOCK_SIZE) + 1  # + the scratch block
        kv_heads = config.n_kv_heads // self.world_size
        element = torch.finfo(dtype).bits // 8
        block_bytes = 2 * config.n_layers * BLOCK_SIZE * kv_heads * config.head_dim * element
        if self.device.type == "cuda":
            free_bytes, _ = torch.cuda.mem_get_info(self.device)
        else:  # each of the world's processes holds its own cache in the same memory
            free_bytes = psutil.virtual_memory().available // self.world_size
        blocks = min(wanted, int(free_bytes * _KV_MEMORY_SHARE) // block_bytes)
        if self.world_size > 1:
            count = torch.tensor([blocks], device=self.device)
            dist.all_reduce(count, op=dist.ReduceOp.MIN)
            blocks = int(count)
        if blocks < 2:
            where = "GPU" if self.device.type == "cuda" else "main"
            raise UserError(f"no {where} memory left for the KV cache; lower --max-seq-len")
        return blocks

    # ---- a step ----------------------------------------------------------------------------

    def share(self, inputs: StepInputs | None) -> StepInputs | None:
        """Rank 0 sends the step (None: stop) and every rank returns it; with one process,
        the inputs themselves."""
        if self.world_size == 1:
            return inputs
        if inputs is None:
            header = torch.tensor([STOP, 0, 0, 0, 0])
            body = torch.zeros(0, dtype=torch.long)
        else:
            header, body = inputs.pack()
        header = header.to(self.device)
        dist.broadcast(header, src=0)
        fields = header.tolist()
        if fields[0] == STOP:
            return None
        _, batch, length, width, _ = fields
        if self.rank != 0:
            body = torch.empty(3 * batch * length + batch * width, dtype=torch.long)
        body = body.to(self.device)
        dist.broadcast(body, src=0)
        return StepInputs.unpack(fields, body)

    @torch.inference_mode()
    def run(self, inputs: StepInputs) -> Tensor:
        """Float32 logits: [B, vocab] for each row's last token (a decode step's first
        `concurrency` rows only), or [B, T, vocab] for all."""
        inputs = inputs.on(self.device)
        if inputs.decode and self.use_graphs:
            return self._replay(inputs)
        if inputs.decode:
            return self._decode(inputs.tokens, inputs.positions, inputs.slots, inputs.tables)
        if self.prefill_graphs and inputs.tokens.size(0) == 1 and inputs.last_only:
            length, width = inputs.tokens.size(1), inputs.tables.size(1)
            key = prefill_graph_key(length, width, self.prefill_lengths, self.table_width)
            if key is not None:
                return self._replay_prefill(inputs, *key)
        layout = Layout(inputs.positions, inputs.slots, inputs.tables)
        logits = self.model(inputs.tokens, layout, last_only=inputs.last_only).float()
        return logits[:, -1] if inputs.last_only else logits

    def _last_hidden(
        self, tokens: Tensor, positions: Tensor, slots: Tensor, tables: Tensor
    ) -> Tensor:
        """Each row's last position after the final norm: [B, dim]."""
        hidden = self.model.hidden(tokens, Layout(positions, slots, tables))
        return self.model.norm(hidden[:, -1])

    def _logits(self, hidden: Tensor) -> Tensor:
        """Float32 logits [min(B, concurrency), vocab] of the first rows of `hidden` [B, dim]."""
        return self.model.head(hidden[: self.concurrency]).float()

    def _decode(self, tokens: Tensor, positions: Tensor, slots: Tensor, tables: Tensor) -> Tensor:
        """A decode step: the (compiled) body, or the one-row kernels for one row, then the
        head on the rows that may sample."""
        if self.one_row is not None and tokens.size(0) == 1:
            return self._logits(self.one_row(tokens, positions, slots, tables))
        return self._logits(self.body(tokens, positions, slots, tables))

    def _prefill(self, tokens: Tensor, positions: Tensor, slots: Tensor, tables: Tensor) -> Tensor:
        """A one-sequence prefill step, eager (a prefill graph replays it)."""
        return self._logits(self._last_hidden(tokens, positions, slots, tables))

    def _replay(self, inputs: StepInputs) -> Tensor:
        batch = inputs.tokens.size(0)
        bucket = next(size for size in self.buckets if size >= batch)
        static = self.static
        static.tokens[:batch] = inputs.tokens
        static.positions[:batch] = inputs.positions
        static.slots[:batch] = inputs.slots
        static.tables[:batch, : inputs.tables.size(1)] = inputs.tables
        static.tables[:batch, inputs.tables.size(1) :] = SCRATCH_BLOCK
        # Padding rows: position 0 in the scratch block.
        static.tokens[batch:bucket] = 0
        static.positions[batch:bucket] = 0
        static.slots[batch:bucket] = SCRATCH_BLOCK * BLOCK_SIZE
        static.tables[batch:bucket] = SCRATCH_BLOCK
        graph, logits = self.graphs[bucket]
        graph.replay()
        return logits[:batch]

    def _replay_prefill(self, inputs: StepInputs, bucket: int, width: int) -> Tensor:
        padded = pad_prefill(inputs, bucket, width)
        static = self.prefill_static
        static.tokens[:, :bucket] = padded.tokens
        static.positions[:, :bucket] = padded.positions
        static.slots[:, :bucket] = padded.slots
        static.tables[:, :width] = padded.tables
        graph, logits = self.prefill_graphs[bucket, width]
        graph.replay()
        return logits

    @torch.inference_mode()
    def _capture_prefill(
        self, bucket: int, width: int, pool: "_POOL_HANDLE"
    ) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        """A one-sequence prefill of `bucket` tokens over a table `width` blocks wide, warmed
        up eagerly, then captured."""
        static = self.prefill_static
        arguments = (
            static.tokens[:, :bucket],
            static.positions[:, :bucket],
            static.slots[:, :bucket],
            static.tables[:, :width],
        )
        return _captured(self._prefill, arguments, warm_ups=2, pool=pool)

    @torch.inference_mode()
    def _capture(self, bucket: int) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        """Warm up on a side stream (kernels chosen, compiled, workspaces allocated), then
        capture. Every rank captures at the same step, so the collectives inside line up."""
        static = self.static
        arguments = (
            static.tokens[:bucket],
            static.positions[:bucket],
            static.slots[:bucket],
            static.tables[:bucket],
        )
        if bucket > 1:  # one compiled graph serves every bucket above one (batch symbolic)
            for argument in arguments:
                torch._dynamo.mark_dynamic(argument, 0)
        return _captured(self._decode, arguments, warm_ups=3, pool=None)

    def follow(self) -> None:
        """Ranks 1..N-1: run rank 0's steps until it says stop."""
        while (inputs := self.share(None)) is not None:
            self.run(inputs)

    def close(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            # A CUDA graph that captured an NCCL collective holds a reference on its
            # communicator, and NCCL's teardown waits for it forever: free the graphs first.
            for graph, _ in self.graphs.values():
                graph.reset()
            self.graphs = {}
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            dist.destroy_process_group()


_Output = TypeVar("_Output")


def _replays(graph: torch.cuda.CUDAGraph, times: int) -> None:
    for _ in range(times):
        graph.replay()


def pdl_choice(asked: bool, controls: bool, capability: tuple[int, int]) -> tuple[bool, str]:
    """Whether the kernel's launches use programmatic dependent launch, and what the engine's
    state adds of it ("" where not asked for): it needs Triton's grid dependency controls
    (`controls`) and a GPU of compute capability 9.0 or later (Hopper), where the PTX they
    compile to exists; elsewhere the kernel runs without it."""
    if not asked:
        return False, ""
    if not controls:
        return False, ", no PDL (this Triton has no grid dependency controls)"
    if capability < (9, 0):
        major, minor = capability
        return False, f", no PDL (sm_{major}{minor}: it needs compute capability 9.0 or later)"
    return True, ", PDL"


def _captured(
    step: Callable[..., _Output],
    arguments: tuple[Tensor, ...],
    warm_ups: int,
    pool: "_POOL_HANDLE | None",
) -> tuple[torch.cuda.CUDAGraph, _Output]:
    """`step` run `warm_ups` times on a side stream (kernels chosen, compiled, workspaces
    allocated), then captured as a CUDA graph; with its output, which each replay rewrites."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warm_ups):
            step(*arguments)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        logits = step(*arguments)
    torch.cuda.synchronize()
    return graph, logits


def _load(
    spec: Spec,
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
