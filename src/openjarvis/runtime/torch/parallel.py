"""Tensor parallelism as a pass over a plain model: heads and MLP columns split over N processes,
attention-out and MLP-down row-parallel (each sums its partial products over the processes: an
all-reduce, or for one token a GEMV fused with it), the output head split by vocabulary.
"""

from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from openjarvis.errors import UserError
from openjarvis.runtime.torch.model import Transformer, TransformerBlock

__all__ = [
    "Cut",
    "RowParallelLinear",
    "SplitSizes",
    "all_gather_last_dim",
    "check_divisible",
    "tensor_parallel",
]

# How a full checkpoint tensor becomes this process's piece of it: cut(name, full) -> shard.
Cut = Callable[[str, Tensor], Tensor]
Reduce = Callable[[Tensor], Tensor]
# One token's row-parallel product summed over the group: (x with K elements, weight [N, K])
# -> [N]; chosen per (N, K) at start-up, or None for the GEMV followed by the all-reduce.
DecodeGemv = Callable[[Tensor, Tensor], Tensor]

# Column-parallel (output features split): q, k, v, gate, up (checkpoint names: each is cut
# on its own, and a process's stacked wqkv or w13 holds its cuts one after another).
# Row-parallel (input features split, partial sums all-reduced): attention-out, down.
_COLUMN = (
    "attention.wq.",
    "attention.wk.",
    "attention.wv.",
    "feed_forward.w1.",
    "feed_forward.w3.",
)
_ROW = ("attention.wo.weight", "feed_forward.w2.weight")


class SplitSizes(Protocol):
    """The sizes tensor parallelism splits: a ModelConfig's, or those read from a GGUF header."""

    @property
    def n_heads(self) -> int: ...
    @property
    def n_kv_heads(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...


def check_divisible(model_config: SplitSizes, world_size: int) -> None:
    """Raise a UserError naming the first size that does not split into world_size parts."""
    sizes = {
        "attention heads": model_config.n_heads,
        "KV heads": model_config.n_kv_heads,
        "MLP width": model_config.intermediate_size,
    }
    for what, size in sizes.items():
        if size % world_size:
            raise UserError(
                f"{what} ({size}) do not divide over {world_size} processes; "
                f"choose a --tp that divides {size}"
            )


class RowParallelLinear(nn.Linear):
    """A linear layer whose input features are split over the processes: each multiplies its
    slice, and the partial products are summed over the group (the bias-free layers only)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        reduce: Reduce,
        decode_gemv: DecodeGemv | None,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(in_features, out_features, bias=False, device=device, dtype=dtype)
        self.reduce = reduce
        self.decode_gemv = decode_gemv

    def forward(self, x: Tensor) -> Tensor:
        if self.decode_gemv is not None and x.numel() == self.in_features:  # one token
            return self.decode_gemv(x, self.weight).view(*x.shape[:-1], self.out_features)
        return self.reduce(F.linear(x, self.weight))


def tensor_parallel(
    rank: int,
    world_size: int,
    all_reduce: Reduce,
    all_gather: Reduce,
    decode_gemv: Callable[[int, int], DecodeGemv | None] | None = None,
) -> Callable[[Transformer], Cut]:
    """The pass, for loading.build_model(shard=...): it reshapes a model built on the meta
    device and returns how to cut full tensors. World size 1 changes nothing.

    `decode_gemv(n, k)` gives the fused decode product for a row-parallel layer of that shape
    (per process), or None where the GEMV and the all-reduce stay separate (always, without it)."""

    def apply(model: Transformer) -> Cut:
        if world_size == 1:
            return lambda name, full: full
        config = model.config
        check_divisible(config, world_size)
        for layer in model.layers:
            assert isinstance(layer, TransformerBlock)
            attention, mlp = layer.attention, layer.feed_forward
            attention.n_heads //= world_size
            attention.n_kv_heads //= world_size
            attention.wqkv = _resized(attention.wqkv, out_parts=world_size)
            mlp.w13 = _resized(mlp.w13, out_parts=world_size)
            attention.wo = _row_parallel(attention.wo, world_size, all_reduce, decode_gemv)
            mlp.w2 = _row_parallel(mlp.w2, world_size, all_reduce, decode_gemv)
        # The output head is the largest single matrix a decode step reads: split it by
        # vocabulary (untying it from the embedding, which stays whole) and gather the logits.
        split_vocab = config.vocab_size % world_size == 0
        if split_vocab:
            model.output = _resized(model.output, out_parts=world_size)
            model.gather_logits = all_gather

        def cut(name: str, full: Tensor) -> Tensor:
            if name.startswith("layers.") and any(part in name for part in _COLUMN):
                return full.chunk(world_size, dim=0)[rank]
            if name.startswith("layers.") and name.endswith(_ROW):
                return full.chunk(world_size, dim=1)[rank]
            if name == "output.weight" and split_vocab:
                return full.chunk(world_size, dim=0)[rank]
            return full

        return cut

    return apply


def _resized(linear: nn.Linear, out_parts: int = 1, in_parts: int = 1) -> nn.Linear:
    """A fresh (meta) Linear with its output or input features divided."""
    return nn.Linear(
        linear.in_features // in_parts,
        linear.out_features // out_parts,
        bias=linear.bias is not None,
        device=linear.weight.device,
        dtype=linear.weight.dtype,
    )


def _row_parallel(
    linear: nn.Linear,
    world_size: int,
    reduce: Reduce,
    decode_gemv: Callable[[int, int], DecodeGemv | None] | None,
) -> RowParallelLinear:
    """A fresh (meta) row-parallel layer for one process's slice of `linear`'s input."""
    if linear.bias is not None:  # each process would add it: N times in the sum
        raise ValueError("a row-parallel layer with a bias is not supported")
    k, n = linear.in_features // world_size, linear.out_features
    fused = decode_gemv(n, k) if decode_gemv is not None else None
    return RowParallelLinear(k, n, reduce, fused, linear.weight.device, linear.weight.dtype)


@torch.library.custom_op("openjarvis::all_gather_last_dim", mutates_args=())
def _all_gather_last_dim(x: Tensor) -> Tensor:
    pieces = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, x.contiguous())
    return torch.cat(pieces, dim=-1)


@_all_gather_last_dim.register_fake
def _(x: Tensor) -> Tensor:
    return x.new_empty(*x.shape[:-1], x.shape[-1] * dist.get_world_size())


def all_gather_last_dim() -> Reduce:
    """Concatenate every process's x along its last axis (the vocabulary split of the logits),
    over the default group; a registered operator, so torch.compile traces around it."""
    return torch.ops.openjarvis.all_gather_last_dim
