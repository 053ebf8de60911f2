"""The torch engine's settings, one frozen dataclass that the engine, its runners (every rank,
pickled for spawn) and its callers share (nano-vllm's config.py).
"""

from dataclasses import dataclass, replace
from typing import Literal

import torch

__all__ = ["AllReduceChoice", "TimedChoice", "TorchSettings"]

AllReduceChoice = Literal["auto", "nccl", "peer"]
# A kernel the engine may use: "auto" where timed faster at start, "on" always, "off" never.
TimedChoice = Literal["auto", "on", "off"]


@dataclass(frozen=True, slots=True)
class TorchSettings:
    device: str = "auto"  # "auto": cuda when a GPU is visible, else cpu
    dtype: str = "auto"  # "auto": bfloat16 on cuda, float32 on cpu
    tp: int = 1  # tensor-parallel processes, one per GPU (gloo processes on the CPU)
    max_seq_len: int = 4096
    # Sequences decoded together at most (the engine's concurrency); the KV cache holds this
    # many full-length sequences where memory allows.
    concurrency: int = 64
    prefill_tokens: int = 2048  # prompt tokens per prefill step (longer prompts: in chunks)
    # Prompt tokens a decode step takes beside its decode rows, each a row of one query: a new
    # sequence's prompt joins the running batch instead of stalling it in a step of its own
    # (vLLM's chunked prefill mixed into decode batches). 0: prompts prefill in steps of their
    # own. A prompt with nothing decoding beside it prefills in its own steps either way.
    # None: `prefill_tokens` on the GPU, where the decode kernel reads each row's own keys, so
    # a step takes as many prompt tokens whether prompts join decode steps or not (with the
    # 8B shape and 64 prompts of 512 tokens arriving at once, 2,048 prompt rows a step got
    # the last first token 1.0 s after the first, 256 rows 1.4 s: docs/benchmarks.md); 0 on
    # the CPU, where each one-query row gathers its sequence's whole table (a HumanEval prompt
    # joining a step of the embedded model made it take 0.80-0.83 s; a prompt's own prefill
    # step took 0.24-0.26 s).
    decode_prompt_rows: int | None = None
    # Keep the KV blocks of prompts by content and reuse a shared prefix (chat turns, a system
    # prompt); a benchmark measures every request from a cold cache instead (off).
    reuse_prompt_cache: bool = True
    cuda_graphs: bool = True  # replay decode steps from CUDA graphs, one per batch bucket (GPU)
    # Also replay prefill steps from CUDA graphs, one sequence per step, one graph per prompt
    # length bucket (GPU, one process): an eager prefill step is launch-bound, 69-101 ms for the
    # embedded model on an H200 whatever its length, a replayed one 9-12 ms, the same tokens
    # (docs/benchmarks.md).
    prefill_graphs: bool = True
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
    fused_gemv: TimedChoice = "auto"
    # Decode steps of one row through the fused layer kernel (kernels/decode_layer.py, five
    # launches a layer) where the model fits it (GPU, one process): a small model's
    # one-sequence step is otherwise hundreds of kernels each too short to fill the GPU.
    # "auto": where its steps replay faster at start than the compiled step's (at two rows).
    one_row_kernel: TimedChoice = "auto"
    # Each of those launches starting while the one before runs, its weights loaded before it
    # waits (programmatic dependent launch: Hopper on, Triton 3.4 on; left out, and said, on an
    # older GPU or Triton). On an H200 it took the Llama-3-8B shape's one sequence from 220 to 236
    # tok/s, and the embedded shape's 18 layers from 0.451 to 0.351 ms (docs/benchmarks.md).
    one_row_pdl: bool = True
    seed: int = 0  # random-weights mode only
    # Run the engine's core (scheduler, step loop, rank 0's model) in a process of its own, so
    # that the step loop has an interpreter to itself. None: on the GPU, where the host's pace
    # is the GPU's; in the caller's process on the CPU, where a step is the host's computing.
    engine_process: bool | None = None

    def resolved(self) -> "TorchSettings":
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = self.dtype
        if dtype == "auto":
            dtype = "bfloat16" if device == "cuda" else "float32"
        compile = device == "cuda" if self.compile is None else self.compile
        process = device == "cuda" if self.engine_process is None else self.engine_process
        prompt_rows = self.decode_prompt_rows
        if prompt_rows is None:
            prompt_rows = self.prefill_tokens if device == "cuda" else 0
        return replace(
            self,
            device=device,
            dtype=dtype,
            compile=compile,
            engine_process=process,
            decode_prompt_rows=prompt_rows,
        )
