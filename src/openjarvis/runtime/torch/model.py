"""One decoder-only transformer for the Llama, Qwen 2/3 and Gemma 3 families, gpt-fast style.

A config dataclass with named presets, then the modules from the outside in; shapes in comments.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from openjarvis.runtime.torch.paged import Layout, PagedKV, row_joins, uses_decode_kernel
from openjarvis.runtime.torch.qkv import rms_norm

__all__ = [
    "PRESETS",
    "Attention",
    "FeedForward",
    "ModelConfig",
    "RMSNorm",
    "Transformer",
    "TransformerBlock",
    "checkpoint_parts",
    "config_for",
]

Activation = Literal["silu", "gelu_tanh"]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Everything that shapes the network. Family quirks are plain fields, off by default."""

    name: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float = 1e-5
    rope_base: float = 10_000.0
    # Llama 3.1-style frequency scaling or Gemma 3's linear position scaling (global layers).
    rope_scaling: dict[str, float | str] | None = None
    activation: Activation = "silu"
    qkv_bias: bool = False  # Qwen 2
    qk_norm: bool = False  # Qwen 3, Gemma 3: RMSNorm over each head's q and k
    tie_embeddings: bool = False
    max_seq_len: int = 4096
    # Gemma: norms scale by (1 + w), embeddings by sqrt(dim), and each block has sandwich norms.
    norm_weight_offset: float = 0.0
    scale_embeddings: bool = False
    sandwich_norms: bool = False
    query_scale: float | None = None  # None: head_dim ** -0.5
    attn_logit_softcap: float | None = None  # Gemma 2
    final_logit_softcap: float | None = None  # Gemma 2
    # Sliding-window attention: the window in tokens (a query sees itself and window-1 before it).
    sliding_window: int | None = None
    # Every `global_every`-th layer attends globally, the others use the window (Gemma 3: 6).
    # 0 with a window set: every layer slides (Mistral).
    global_every: int = 0
    rope_local_base: float | None = None  # Gemma 3's sliding layers use their own RoPE base
    extra: dict[str, object] = field(default_factory=dict)  # loader notes (e.g. eos ids)

    def __post_init__(self) -> None:
        assert self.n_heads % self.n_kv_heads == 0, "query heads must be a multiple of KV heads"
        assert self.global_every >= 0
        assert self.sliding_window is None or self.sliding_window > 0

    def is_sliding(self, layer: int) -> bool:
        if self.sliding_window is None:
            return False
        return self.global_every == 0 or (layer + 1) % self.global_every != 0

    @property
    def parameter_count(self) -> int:
        attention = self.dim * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        mlp = 3 * self.dim * self.intermediate_size
        embeddings = self.vocab_size * self.dim * (1 if self.tie_embeddings else 2)
        return self.n_layers * (attention + mlp) + embeddings


def _gemma3(
    name: str,
    *,
    vocab_size: int,
    dim: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
) -> ModelConfig:
    return ModelConfig(
        name=name,
        vocab_size=vocab_size,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        rope_local_base=10_000.0,
        activation="gelu_tanh",
        qk_norm=True,
        tie_embeddings=True,
        norm_weight_offset=1.0,
        scale_embeddings=True,
        sandwich_norms=True,
        query_scale=256**-0.5,  # query_pre_attn_scalar = 256
        sliding_window=512,
        global_every=6,
        max_seq_len=32_768,
    )


PRESETS: dict[str, ModelConfig] = {
    "llama-3-8b": ModelConfig(
        "llama-3-8b", vocab_size=128_256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
        head_dim=128, intermediate_size=14_336, rope_base=500_000.0, max_seq_len=8192,
    ),
    "llama-3.2-1b": ModelConfig(
        "llama-3.2-1b", vocab_size=128_256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8,
        head_dim=64, intermediate_size=8192, rope_base=500_000.0, tie_embeddings=True,
        rope_scaling={
            "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
        },
        max_seq_len=8192,
    ),
    "llama-3-70b": ModelConfig(
        "llama-3-70b", vocab_size=128_256, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8,
        head_dim=128, intermediate_size=28_672, rope_base=500_000.0, max_seq_len=8192,
    ),
    "qwen2.5-7b": ModelConfig(
        "qwen2.5-7b", vocab_size=152_064, dim=3584, n_layers=28, n_heads=28, n_kv_heads=4,
        head_dim=128, intermediate_size=18_944, norm_eps=1e-6, rope_base=1_000_000.0,
        qkv_bias=True, max_seq_len=32_768,
    ),
    "qwen3-8b": ModelConfig(
        "qwen3-8b", vocab_size=151_936, dim=4096, n_layers=36, n_heads=32, n_kv_heads=8,
        head_dim=128, intermediate_size=12_288, norm_eps=1e-6, rope_base=1_000_000.0,
        qk_norm=True, max_seq_len=40_960,
    ),
    "gemma-3-270m": _gemma3(
        "gemma-3-270m", vocab_size=262_144, dim=640, n_layers=18, n_heads=4, n_kv_heads=1,
        head_dim=256, intermediate_size=2048,
    ),
    # Tiny configs for tests: small enough for CPU, with every family quirk switched on.
    "tiny-llama": ModelConfig(
        "tiny-llama", vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
        intermediate_size=96, max_seq_len=128,
    ),
    "tiny-qwen3": ModelConfig(
        "tiny-qwen3", vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
        intermediate_size=96, norm_eps=1e-6, rope_base=1_000_000.0, qk_norm=True,
        tie_embeddings=True, max_seq_len=128,
    ),
    "tiny-gemma3": replace(
        _gemma3(
            "tiny-gemma3", vocab_size=256, dim=64, n_layers=3, n_heads=4, n_kv_heads=2,
            head_dim=16, intermediate_size=96,
        ),
        sliding_window=4, global_every=3, query_scale=16**-0.5, max_seq_len=128,
    ),
    # Head counts divisible by 2, 3 and 4, so that one config tests several TP world sizes.
    "tiny-tp": ModelConfig(
        "tiny-tp", vocab_size=240, dim=96, n_layers=2, n_heads=24, n_kv_heads=12, head_dim=8,
        intermediate_size=192, qkv_bias=True, qk_norm=True, max_seq_len=64,
    ),
}  # fmt: skip


def checkpoint_parts(config: ModelConfig, name: str) -> list[tuple[str, int | None]]:
    """The checkpoint tensors a parameter is made of, in order, each with its rows in the
    whole model: q, k and v are stacked in wqkv, gate and up in w13, so that one product reads
    what three (or two) did (gpt-fast's wqkv; vLLM's merged gate-up). [(name, None)] for a
    parameter that is one tensor."""
    q_rows, kv_rows = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    if ".attention.wqkv." in name:
        parts = ((".wq.", q_rows), (".wk.", kv_rows), (".wv.", kv_rows))
        return [(name.replace(".wqkv.", part), rows) for part, rows in parts]
    if ".feed_forward.w13." in name:
        rows = config.intermediate_size
        return [(name.replace(".w13.", ".w1."), rows), (name.replace(".w13.", ".w3."), rows)]
    return [(name, None)]


def config_for(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}") from None


class Transformer(nn.Module):
    """tokens [B, T] at the layout's positions [B, T] -> logits [B, T, vocab] (or [B, 1,
    vocab]); keys and values live in a paged cache (paged.py)."""

    # Buffers registered by init_buffers (declared for the type checker).
    rope_cos: Tensor
    rope_sin: Tensor
    rope_local_cos: Tensor
    rope_local_sin: Tensor
    embedding_scale: Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps, config.norm_weight_offset)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # Tensor parallelism shards the output head by vocabulary and sets this to an all-gather.
        self.gather_logits: Callable[[Tensor], Tensor] = _unchanged
        self.block_size = 0  # set by setup_caches
        self.init_buffers()

    def init_buffers(self) -> None:
        """(Re)compute the RoPE tables, in float32 on the model's device:
        after building on the meta device, and after any dtype change."""
        config = self.config
        device = self.tok_embeddings.weight.device
        local_base = config.rope_local_base or config.rope_base
        tables = {
            "rope": _rope_table(config, config.rope_base, config.rope_scaling),
            # Gemma 3 scales positions on global layers only; its local layers use plain RoPE.
            "rope_local": _rope_table(config, local_base, None),
        }
        for prefix, (cos, sin) in tables.items():  # [S, head_dim] each
            self.register_buffer(f"{prefix}_cos", cos.to(device), persistent=False)
            self.register_buffer(f"{prefix}_sin", sin.to(device), persistent=False)
        # Gemma rounds the embedding scale to the activations' dtype before multiplying.
        dtype = self.tok_embeddings.weight.dtype
        scale = torch.tensor(config.dim**0.5, dtype=dtype, device=device)
        self.register_buffer("embedding_scale", scale, persistent=False)

    def setup_caches(self, blocks: int, block_size: int, dtype: torch.dtype) -> None:
        """Allocate the paged KV caches: `blocks` blocks of `block_size` positions per layer
        ([blocks, block_size, kv_heads, head_dim] each for keys and values)."""
        self.block_size = block_size
        device = self.tok_embeddings.weight.device
        for layer in self.layers:
            assert isinstance(layer, TransformerBlock)
            attention = layer.attention
            attention.kv_cache = PagedKV(
                blocks, block_size, attention.n_kv_heads, self.config.head_dim, dtype, device
            )

    def forward(self, tokens: Tensor, layout: Layout, last_only: bool = False) -> Tensor:
        x = self.hidden(tokens, layout)
        if last_only:
            x = x[:, -1:]
        return self.head(self.norm(x))

    def hidden(self, tokens: Tensor, layout: Layout) -> Tensor:
        """The last layer's output [B, T, dim], before the final norm."""
        config = self.config
        positions = layout.positions  # [B, T]
        assert tokens.shape == positions.shape, "one position per token"
        assert self.block_size > 0, "call setup_caches() first"
        x = self.tok_embeddings(tokens)  # [B, T, dim]
        if config.scale_embeddings:
            x = x * self.embedding_scale
        # Which keys each query sees (not needed where the decode kernel reads the blocks).
        causal = sliding = None
        if uses_decode_kernel(tokens, config.head_dim, config.attn_logit_softcap):
            joins = row_joins(layout.block_tables, tokens.size(1))
            layout = Layout(layout.positions, layout.slots, layout.block_tables, joins)
        else:
            causal = layout.masks(self.block_size, None)  # [B, T, S]
            sliding = causal
            if config.sliding_window is not None:
                sliding = layout.masks(self.block_size, config.sliding_window)
        rope_global = (self.rope_cos, self.rope_sin)  # [max_seq_len, hd] each
        rope_local = (self.rope_local_cos, self.rope_local_sin)
        for i, layer in enumerate(self.layers):
            is_sliding = config.is_sliding(i)
            mask = sliding if is_sliding else causal
            rope = rope_local if is_sliding else rope_global
            window = config.sliding_window if is_sliding else None
            x = layer(x, layout, rope, mask, window)
        return x

    def head(self, x: Tensor) -> Tensor:
        """Normed hidden states [..., dim] -> logits [..., vocab] in the model's dtype."""
        logits = self.gather_logits(self.output(x))
        if self.config.final_logit_softcap is not None:
            cap = self.config.final_logit_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        offset = config.norm_weight_offset
        self.attention_norm = RMSNorm(config.dim, config.norm_eps, offset)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps, offset)
        # Gemma normalises each sub-layer's output too, before the residual add.
        self.post_attention_norm: nn.Module = nn.Identity()
        self.post_ffn_norm: nn.Module = nn.Identity()
        if config.sandwich_norms:
            self.post_attention_norm = RMSNorm(config.dim, config.norm_eps, offset)
            self.post_ffn_norm = RMSNorm(config.dim, config.norm_eps, offset)

    def forward(
        self,
        x: Tensor,
        layout: Layout,
        rope: tuple[Tensor, Tensor],
        mask: Tensor | None,
        window: int | None,
    ) -> Tensor:
        h = x + self.post_attention_norm(
            self.attention(self.attention_norm(x), layout, rope, mask, window)
        )
        return h + self.post_ffn_norm(self.feed_forward(self.ffn_norm(h)))


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # Head counts are per process: tensor parallelism divides them (parallel.py).
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        # q, k and v in one product: [heads + 2 * kv_heads] * head_dim output features.
        qkv_features = (config.n_heads + 2 * config.n_kv_heads) * config.head_dim
        self.wqkv = nn.Linear(config.dim, qkv_features, bias=config.qkv_bias)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)
        self.q_norm: nn.Module = nn.Identity()
        self.k_norm: nn.Module = nn.Identity()
        if config.qk_norm:
            offset = config.norm_weight_offset
            self.q_norm = RMSNorm(config.head_dim, config.norm_eps, offset)
            self.k_norm = RMSNorm(config.head_dim, config.norm_eps, offset)
        self.scale = config.query_scale or config.head_dim**-0.5
        self.kv_cache: PagedKV | None = None

    def forward(
        self,
        x: Tensor,
        layout: Layout,
        rope: tuple[Tensor, Tensor],
        mask: Tensor | None,
        window: int | None,
    ) -> Tensor:
        assert self.kv_cache is not None, "call setup_caches() first"
        batch, length, _ = x.shape  # [B, T, dim]
        heads, head_dim = self.n_heads, self.head_dim
        qkv = self.wqkv(x).view(batch * length, -1)
        # One operator norms q and k (with the norm modules' weights), rotates both, writes k
        # and v to the cache and returns q (qkv.py: one kernel on the GPU).
        q_norm, k_norm = self.q_norm, self.k_norm
        norms: tuple[Tensor | None, Tensor | None] = (None, None)
        if isinstance(q_norm, RMSNorm) and isinstance(k_norm, RMSNorm):
            norms = (q_norm.weight, k_norm.weight)
        cache, config = self.kv_cache, self.config
        q = torch.ops.openjarvis.rope_write_kv(
            qkv, layout.positions.reshape(-1), *rope, *norms, config.norm_eps,
            config.norm_weight_offset, layout.slots.reshape(-1), cache.k, cache.v, heads,
        )  # fmt: skip
        q = q.view(batch, length, heads, head_dim)
        softcap = self.config.attn_logit_softcap
        y = self.kv_cache.attend(q, layout, mask, window, self.scale, softcap)  # [B, T, h, hd]
        # Under tensor parallelism wo is row-parallel and sums its partial products itself.
        return self.wo(y.reshape(batch, length, heads * head_dim))


class FeedForward(nn.Module):
    """Gated MLP: w2(act(w1 x) * w3 x), w1 and w3 stacked in w13; SwiGLU (silu) or GeGLU
    (tanh-approximated gelu)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        # gate and up in one product: [2 * intermediate] output features, gate first.
        self.w13 = nn.Linear(config.dim, 2 * config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.dim, bias=False)  # down
        self.activation = config.activation

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)  # [B, T, intermediate] each
        gate = F.silu(gate) if self.activation == "silu" else F.gelu(gate, approximate="tanh")
        return self.w2(gate * up)  # row-parallel under tensor parallelism


class RMSNorm(nn.Module):
    """x / rms(x) * (offset + w), computed in float32; Gemma stores w - 1 (offset 1)."""

    def __init__(self, dim: int, eps: float, weight_offset: float = 0.0) -> None:
        super().__init__()
        assert weight_offset in (0.0, 1.0), "a weight stored as w or as w - 1"
        self.eps = eps
        self.weight_offset = weight_offset
        self.weight = nn.Parameter(torch.ones(dim) if weight_offset == 0.0 else torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps, self.weight_offset)


def _rope_table(
    config: ModelConfig, base: float, scaling: dict[str, float | str] | None
) -> tuple[Tensor, Tensor]:
    """cos and sin of position x frequency, laid out for `qkv.apply_rope`: [max_seq_len, head_dim]
    each, float32, the cosines twice over and the sines negated then as they are."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (base ** (torch.arange(half, dtype=torch.float64) * 2 / config.head_dim))
    positions = torch.arange(config.max_seq_len, dtype=torch.float64)
    scaling = scaling or {}
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        positions = positions / float(scaling["factor"])
    elif kind == "llama3":
        inv_freq = _llama3_frequencies(inv_freq, scaling)
    elif kind != "default":
        raise ValueError(f"RoPE scaling {kind!r} is not supported (default, linear, llama3 are)")
    angles = torch.outer(positions, inv_freq)
    cos, sin = angles.cos().float(), angles.sin().float()
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def _llama3_frequencies(inv_freq: Tensor, scaling: dict[str, float | str]) -> Tensor:
    """Llama 3.1's long-context frequencies: long wavelengths slowed by `factor`, short ones
    kept, and a smooth blend between the two bands."""
    factor = float(scaling["factor"])
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    blend = (original / wavelength - low) / (high - low)
    blended = (1 - blend) * inv_freq / factor + blend * inv_freq
    slowed = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    in_band = (wavelength <= original / low) & (wavelength >= original / high)
    return torch.where(in_band, blended, slowed)


def _unchanged(x: Tensor) -> Tensor:
    return x
