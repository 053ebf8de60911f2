"""The torch engine's core: rank 0's runner, the KV block pool, the scheduler and the step loop,
built from a Spec, with the followers (ranks 1..N-1) in processes of their own. The engine runs
it in a process of its own on a GPU (core_process.py; vLLM V1's EngineCore split) and in the
caller's process on the CPU.
"""

from dataclasses import dataclass
from multiprocessing.process import BaseProcess

import torch
import torch.multiprocessing as multiprocessing

from openjarvis.runtime.roofline import Bandwidth
from openjarvis.runtime.torch.decode_roofline import device_bandwidth
from openjarvis.runtime.torch.loop import Publish, StepCounts, StepLoop
from openjarvis.runtime.torch.model import ModelConfig
from openjarvis.runtime.torch.paged import BLOCK_SIZE, BlockPool
from openjarvis.runtime.torch.runner import Runner, Spec
from openjarvis.runtime.torch.scheduler import Scheduler, Sequence
from openjarvis.runtime.types import StepLedger

__all__ = ["CoreInfo", "EngineCore"]


@dataclass(frozen=True, slots=True)
class CoreInfo:
    """What the engine reports about its core (picklable: it crosses from the core's process)."""

    config: ModelConfig
    # Rank 0's GPU, measured the first time before the model and KV cache take its memory;
    # None on the CPU: not measured, so the engine reports no MBU.
    bandwidth: Bandwidth | None
    kv_cache_blocks: int
    cuda_graph_buckets: list[int]
    prefill_graph_buckets: list[int]
    prefill_graphs: int
    all_reduce_table: dict[str, str] | None
    fused_gemv_table: dict[str, str] | None
    one_row_kernel: str  # "on: ...", or "off: " and why


class EngineCore:
    """Steps the sequences enqueued from any thread of this process."""

    def __init__(self, spec: Spec, publish: Publish | None = None) -> None:
        settings = spec.settings
        self._tp = settings.tp
        cuda = settings.device == "cuda"
        bandwidth = device_bandwidth(torch.device("cuda", 0) if cuda else torch.device("cpu"))
        self._workers: list[BaseProcess] = []
        if settings.tp > 1:
            context = multiprocessing.get_context("spawn")
            for rank in range(1, settings.tp):
                worker = context.Process(target=_follow, args=(rank, spec), daemon=True)
                worker.start()
                self._workers.append(worker)
        try:
            self.runner = Runner(0, spec)
        except BaseException:
            self._stop_workers()
            raise
        runner = self.runner
        config = runner.model.config
        pool = BlockPool(runner.blocks, BLOCK_SIZE, reuse=settings.reuse_prompt_cache)
        self.scheduler = Scheduler(
            pool,
            settings.concurrency,
            settings.prefill_tokens,
            config.max_seq_len,
            prefill_rows=1 if runner.prefill_graphs else None,
            prompt_rows=runner.prompt_rows,
        )
        self.loop = StepLoop(runner, self.scheduler, chains=settings.tp == 1, publish=publish)
        self.info = CoreInfo(
            config=config,
            bandwidth=bandwidth,
            kv_cache_blocks=runner.blocks,
            cuda_graph_buckets=sorted(runner.graphs),
            prefill_graph_buckets=list(runner.prefill_lengths),
            prefill_graphs=len(runner.prefill_graphs),
            all_reduce_table=runner.all_reduce_table,
            fused_gemv_table=runner.fused_gemv_table,
            one_row_kernel=runner.one_row_note,
        )

    @property
    def ledger(self) -> StepLedger:
        return self.loop.ledger

    def enqueue(self, sequence: Sequence) -> None:
        self.loop.enqueue(sequence)

    def cancel(self, sequence: Sequence) -> None:
        """The consumer left (or has read the end): the sequence's blocks go back."""
        sequence.cancelled = True

    def counts(self) -> StepCounts:
        return self.loop.counts.copy()

    def close(self) -> None:
        self.loop.close()
        if self._tp > 1 and self.loop.failure is None:
            self.runner.share(None)  # the followers leave their loops
        # Every rank tears its process group down at the same time: NCCL's teardown waits for
        # the peers, so joining the workers first would wait forever.
        self.runner.close()
        self._stop_workers()

    def _stop_workers(self) -> None:
        for worker in self._workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
        self._workers = []


def _follow(rank: int, spec: Spec) -> None:
    follower = Runner(rank, spec)
    try:
        follower.follow()
    finally:
        follower.close()
