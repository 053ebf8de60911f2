"""The paged KV cache: fixed-size blocks shared by all sequences, found through a block table
per sequence, and attention over it (vLLM's layout, as nano-vllm keeps it).

Block 0 is scratch: padding rows of a batch write there and read from there, so that a step's
shapes can stay fixed (CUDA graphs) without touching any sequence's blocks.
"""

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "BLOCK_SIZE",
    "SCRATCH_BLOCK",
    "BlockPool",
    "Layout",
    "PagedKV",
    "chain_key",
    "row_joins",
    "slots_of",
    "uses_decode_kernel",
]

SCRATCH_BLOCK = 0
BLOCK_SIZE = 16  # positions per KV block (the decode kernel needs a power of two >= 16)


# New tokens per row up to which a step's queries each run the decode kernel as rows of their
# own: a decode step, or a short prompt's (or a cached prefix's new) tokens, where attention over
# gathered blocks ran one thread block over every key (cuDNN's flash attention on the H200: 16
# new tokens after 1,136 cached took 2.0 ms of a 6 ms prefill step).
KERNEL_QUERIES = 16


def uses_decode_kernel(tokens: Tensor, head_dim: int, softcap: float | None) -> bool:
    """A GPU step of at most KERNEL_QUERIES tokens per row (`tokens` [B, T, ...]) runs the
    paged decode kernel, which reads only the blocks a row uses and needs no mask, where its
    tiles fit the head (a power of two of at least 16); everything else gathers the blocks."""
    fits = head_dim >= 16 and head_dim & (head_dim - 1) == 0
    return tokens.size(1) <= KERNEL_QUERIES and tokens.is_cuda and softcap is None and fits


def row_joins(tables: Tensor, length: int) -> Tensor:
    """[B * length] bool for a step of B rows of `length` queries each (row b's queries one
    after another): query i reads the same blocks as query i - 1, because it is the next
    token of the same row or its row's table equals the previous row's."""
    # Compared with the table a row down (the first row with the last: it never joins). No
    # slice of B - 1 rows: at B = 2 it would be one row, which torch.compile fixes in the graph.
    previous = torch.roll(tables, 1, dims=0)
    first = torch.arange(tables.size(0), device=tables.device) == 0
    rows = (tables == previous).all(dim=1) & ~first
    if length == 1:
        return rows
    joins = rows[:, None].repeat(1, length)
    joins[:, 1:] = True
    return joins.reshape(-1)


def slots_of(tables: Tensor, positions: Tensor, block_size: int) -> Tensor:
    """The cache slots [B, T] of each row's positions [B, T] through its table [B, W] (long):
    the rule `Layout` states, for steps built from tensors."""
    return tables.long().gather(1, positions // block_size) * block_size + positions % block_size


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a step's tokens sit: B rows of T new tokens each (T = 1 for a decode step).

    A token at position p of a sequence lives in slot block_table[p // block_size] *
    block_size + p % block_size; a query at p sees the keys at positions 0..p of its row."""

    positions: Tensor  # [B, T] long
    slots: Tensor  # [B, T] long: the slot each new key and value goes to
    block_tables: Tensor  # [B, W] int32: the blocks of each row's sequence, in order
    # [B * T] bool, for the decode kernel: which queries read the same blocks as the one
    # before (row_joins); the model computes it once a step.
    joins: Tensor | None = None

    def masks(self, block_size: int, window: int | None) -> Tensor:
        """Which cached keys each query sees: [B, T, W * block_size] bool."""
        keys = torch.arange(self.block_tables.size(1) * block_size, device=self.positions.device)
        query = self.positions[:, :, None]  # [B, T, 1]
        visible = keys[None, None, :] <= query
        if window is not None:
            visible &= (query - keys[None, None, :]) < window
        return visible


class PagedKV(nn.Module):
    """One layer's keys and values: [blocks, block_size, kv_heads, head_dim] each."""

    k: Tensor
    v: Tensor

    def __init__(
        self,
        blocks: int,
        block_size: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.block_size = block_size
        shape = (blocks, block_size, n_kv_heads, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device))
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device))

    def attend(
        self,
        q: Tensor,
        layout: Layout,
        mask: Tensor | None,
        window: int | None,
        scale: float,
        softcap: float | None,
    ) -> Tensor:
        """q: [B, T, heads, head_dim] -> [B, T, heads, head_dim], over the cached keys: by
        the decode kernel, or by gathering the rows' blocks and attending with `mask`."""
        if uses_decode_kernel(q, q.size(-1), softcap):
            import openjarvis.kernels.paged_attention  # noqa: F401 - registers the operator

            batch, length, heads, head_dim = q.shape
            tables = layout.block_tables
            joins = layout.joins
            if joins is None:
                joins = row_joins(tables, length)
            if length > 1:  # each query a row of its own, over its sequence's blocks
                tables = tables.repeat_interleave(length, dim=0)
            context = layout.positions.reshape(-1) + 1  # a query sees its own key and those before
            out = torch.ops.openjarvis.paged_decode_attention(
                q.reshape(batch * length, heads, head_dim),
                self.k,
                self.v,
                tables,
                context,
                joins,
                scale,
                window or 0,
            )
            return out.view(batch, length, heads, head_dim)
        assert mask is not None, "the gathered path needs the step's mask"
        return self.gathered(q, layout, mask, scale, softcap)

    def gathered(
        self, q: Tensor, layout: Layout, mask: Tensor, scale: float, softcap: float | None
    ) -> Tensor:
        """Attention over each row's blocks gathered into one tensor (prefill, the CPU, and
        the reference the decode kernel is checked against)."""
        batch, length, heads, head_dim = q.shape
        kv_heads = self.k.size(2)
        # [B, W, block, kv, hd] -> [B, kv, S, hd]
        k = self.k[layout.block_tables].flatten(1, 2).transpose(1, 2)
        v = self.v[layout.block_tables].flatten(1, 2).transpose(1, 2)
        # Grouped-query attention without copying K and V: the queries that share a KV head
        # are stacked along the length axis, and the mask is tiled to match.
        group = heads // kv_heads
        q = q.transpose(1, 2).reshape(batch, kv_heads, group * length, head_dim)
        group_mask = mask.repeat(1, group, 1)[:, None]  # [B, 1, group * T, S]
        if softcap is None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=group_mask, scale=scale)
        else:
            scores = (q @ k.transpose(-1, -2)) * scale  # [B, kv_heads, group * T, S]
            scores = torch.tanh(scores / softcap) * softcap
            scores = scores.masked_fill(~group_mask, float("-inf"))
            y = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
        return y.reshape(batch, heads, length, head_dim).transpose(1, 2)


class BlockPool:
    """Which blocks are free, and which hold a known prefix (automatic prefix caching, as vLLM
    keeps it): a full block is published under a key that chains the keys of the blocks before
    it with its own tokens, so one key names a whole prefix at its positions. Blocks are
    reference counted; an unreferenced block keeps its content until a blank one runs out, and
    then the least recently freed is evicted. Block 0 (scratch) is never handed out."""

    def __init__(self, blocks: int, block_size: int, reuse: bool = True) -> None:
        """`reuse` off: nothing is published or found (every prompt computed in full)."""
        assert blocks >= 2, "one scratch block and at least one for sequences"
        self.block_size = block_size
        self.blocks = blocks
        self.reuse = reuse
        self._blank = list(range(blocks - 1, SCRATCH_BLOCK, -1))  # pop() hands out 1, 2, ...
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced, content kept
        self._references = [0] * blocks
        self._key_of: dict[int, bytes] = {}  # block -> the prefix key it is published under
        self._block_of: dict[bytes, int] = {}

    @property
    def free(self) -> int:
        """Blocks that `take` can hand out: blank ones and unreferenced cached ones."""
        return len(self._blank) + len(self._evictable)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def prefix_keys(self, tokens: list[int]) -> list[bytes]:
        """The keys of the full blocks of `tokens`, in order."""
        keys: list[bytes] = []
        size = self.block_size
        for start in range(0, len(tokens) - size + 1, size):
            keys.append(chain_key(keys[-1] if keys else b"", tokens[start : start + size]))
        return keys

    def cached(self, keys: list[bytes]) -> list[int]:
        """The blocks holding the longest run of `keys` from the first: the cached prefix."""
        found: list[int] = []
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def can_take(self, count: int, cached: list[int]) -> bool:
        """`take(count, cached)` would succeed: the fresh blocks, and the cached ones nobody
        holds (they leave the free blocks too), are free."""
        idle = sum(1 for block in cached if self._references[block] == 0)
        return count - len(cached) + idle <= self.free

    def take(self, count: int, cached: list[int] | None = None) -> list[int]:
        """`count` blocks: the `cached` ones first (shared, their references counted), then
        fresh ones, blank before evicted."""
        cached = cached or []
        assert self.can_take(count, cached), "check `can_take` before taking"
        for block in cached:
            if self._references[block] == 0:
                del self._evictable[block]
            self._references[block] += 1
        fresh = [self._fresh() for _ in range(count - len(cached))]
        return [*cached, *fresh]

    def _fresh(self) -> int:
        if self._blank:
            block = self._blank.pop()
        else:
            block, _ = self._evictable.popitem(last=False)  # least recently freed
            del self._block_of[self._key_of.pop(block)]
        self._references[block] = 1
        return block

    def publish(self, block: int, key: bytes) -> None:
        """Block `block` is full and holds the prefix `key` names. A prefix already held by
        another block (computed twice at once) stays with that block."""
        assert self._references[block] > 0, "only a held block is published"
        if not self.reuse or key in self._block_of or block in self._key_of:
            return
        self._block_of[key] = block
        self._key_of[block] = key

    def give_back(self, blocks: list[int]) -> None:
        """Drop one reference to each block; a block nobody holds is free again, its content
        kept while it is published. The later blocks of a sequence are the first evicted."""
        for block in reversed(blocks):
            self._references[block] -= 1
            assert self._references[block] >= 0, f"block {block} given back twice"
            if self._references[block] > 0:
                continue
            if block in self._key_of:
                self._evictable[block] = None
            else:
                self._blank.append(block)


def chain_key(parent: bytes, tokens: list[int]) -> bytes:
    """A block's key: its parent's key and its own tokens, hashed (128 bits, so two prefixes
    that differ never meet in practice, and the key stays the same in every process)."""
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(array("q", tokens).tobytes())
    return digest.digest()
