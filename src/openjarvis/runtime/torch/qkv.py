"""The step between the q/k/v product and attention: each head's RMSNorm of q and k (where the
model has them), RoPE on both, the keys and values into their cache slots. One operator: a
Triton kernel on the GPU (kernels/rope_kv.py), the torch functions below elsewhere; both opaque
to torch.compile, which would otherwise treat the in-place cache write as a copy of the whole
cache (one sequence decoded at 50.5 instead of 139.9 tok/s on the H200, docs/benchmarks.md).
"""

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["apply_rope", "rms_norm", "rope_write_kv"]


def rms_norm(x: Tensor, weight: Tensor, eps: float, weight_offset: float) -> Tensor:
    """x / rms(x) * (offset + w) over the last dimension, in float32, back in x's dtype."""
    # Four kernels where the formula written out took ten (torch fuses rms_norm on a GPU, and
    # the products take the weight's own dtype): an eager step runs ~110 norms.
    normed = F.rms_norm(x.float(), (x.size(-1),), eps=eps)
    if weight_offset:  # normed * (1 + w), one kernel
        return torch.addcmul(normed, normed, weight).to(x.dtype)
    return (normed * weight).to(x.dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the two halves of each head (the Hugging Face layout), in float32: the first half
    becomes first * cos - second * sin, the second second * cos + first * sin. x: [N, heads,
    hd]; cos and sin [N, hd] (the cosines twice over, the sines negated then as they are)."""
    first, second = x.chunk(2, dim=-1)
    swapped = torch.cat((second, first), dim=-1)
    return torch.addcmul(x * cos[:, None], swapped, sin[:, None]).to(x.dtype)


@torch.library.custom_op("openjarvis::rope_write_kv", mutates_args=("k_cache", "v_cache"))
def rope_write_kv(
    qkv: Tensor,
    positions: Tensor,
    cos: Tensor,
    sin: Tensor,
    q_weight: Tensor | None,
    k_weight: Tensor | None,
    eps: float,
    weight_offset: float,
    slots: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    heads: int,
) -> Tensor:
    """qkv [N, (heads + 2 * kv_heads) * head_dim] -> q [N, heads, head_dim], normed (with the
    weights) and rotated; k likewise and v as it is into rows `slots` ([N]) of the caches
    ([blocks, block_size, kv_heads, head_dim]). cos, sin: RoPE tables [positions, head_dim],
    float32, indexed by `positions` ([N])."""
    tokens = qkv.size(0)
    kv_heads, head_dim = k_cache.shape[-2:]
    k_rows, v_rows = k_cache.view(-1, kv_heads, head_dim), v_cache.view(-1, kv_heads, head_dim)
    if qkv.is_cuda:
        from openjarvis.kernels.rope_kv import rope_write_kv as kernel

        q = qkv.new_empty(tokens, heads, head_dim)
        norms = None if q_weight is None or k_weight is None else (q_weight, k_weight)
        kernel(qkv, positions, cos, sin, norms, eps, weight_offset, slots, k_rows, v_rows, q)
        return q
    q, k, v = qkv.view(tokens, heads + 2 * kv_heads, head_dim).split(
        (heads, kv_heads, kv_heads), dim=1
    )
    if q_weight is not None and k_weight is not None:
        q = rms_norm(q, q_weight, eps, weight_offset)
        k = rms_norm(k, k_weight, eps, weight_offset)
    rows_cos, rows_sin = cos[positions], sin[positions]
    q, k = apply_rope(q, rows_cos, rows_sin), apply_rope(k, rows_cos, rows_sin)
    k_rows.index_copy_(0, slots, k)
    v_rows.index_copy_(0, slots, v)
    return q


@rope_write_kv.register_fake
def _(
    qkv: Tensor,
    positions: Tensor,
    cos: Tensor,
    sin: Tensor,
    q_weight: Tensor | None,
    k_weight: Tensor | None,
    eps: float,
    weight_offset: float,
    slots: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    heads: int,
) -> Tensor:
    return qkv.new_empty(qkv.size(0), heads, k_cache.size(-1))
