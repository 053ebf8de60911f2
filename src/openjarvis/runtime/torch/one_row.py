"""A decode step of one row on the GPU through the fused layer kernel (kernels/decode_layer.py):
five launches a layer instead of the compiled step's dozen kernels, then the last residual add
and the final norm. A one-sequence step is otherwise launch-bound for small models and loses a
few microseconds a product for large ones (on an H200, with programmatic dependent launch: the
embedded Gemma 3 270M 0.426 ms a step against 0.706 for the compiled step, the Llama-3-8B shape
4.135 against 4.709; docs/benchmarks.md). The runner captures it in bucket 1's CUDA graph where
`supported` says the model fits the kernel.
"""

import torch
from torch import Tensor

from openjarvis.kernels.decode_layer import (
    PHASES,
    DecodeScratch,
    LayerTensors,
    decode_layer,
    final_norm,
    launch_constants,
    supports,
)
from openjarvis.runtime.torch.model import ModelConfig, RMSNorm, Transformer, TransformerBlock

__all__ = ["LAUNCHES", "OneRowStep", "kernel_constants", "supported"]

# A layer's phases one launch each: with programmatic dependent launch they beat one
# persistent launch a layer on every shape measured on an H200 (the embedded shape's 18 layers
# 0.351 ms against 0.513, the 8B's 32 layers 3.915 against 4.080; benchmarks/one_row_phases.py,
# docs/benchmarks.md): the grid barriers cost more than the launches they replace.
LAUNCHES = tuple(range(1, PHASES + 1))


def supported(model: Transformer) -> str | None:
    """None where the kernel runs this model's one-row steps, else why not."""
    config = model.config
    if config.qkv_bias:
        return "a q/k/v bias"
    if config.attn_logit_softcap is not None:
        return "attention logit soft-capping"
    fits = supports(
        dim=config.dim, heads=config.n_heads, kv_heads=config.n_kv_heads,
        head_dim=config.head_dim, hidden=config.intermediate_size,
    )  # fmt: skip
    return None if fits else "a shape the kernel's tiles do not fit"


def kernel_constants(config: ModelConfig, *, block: int, programs: int) -> dict[str, object]:
    """The layer kernel's constants for a middle layer of this model (its down output pending,
    the residual in scratch) on `programs` programs, the cache in blocks of `block` positions:
    what a compile of it without a GPU needs, but PHASE and PDL (kernels/sm90.py)."""
    constants = launch_constants(
        dim=config.dim, heads=config.n_heads, kv_heads=config.n_kv_heads,
        head_dim=config.head_dim, hidden=config.intermediate_size, block=block,
        programs=programs, qk_norm=config.qk_norm, sandwich=config.sandwich_norms,
        offset=config.norm_weight_offset != 0, activation=config.activation,
    )  # fmt: skip
    return {**constants, "HAS_PENDING": True, "EMBED": False}


def _weight(module: torch.nn.Module) -> Tensor | None:
    return module.weight if isinstance(module, RMSNorm) else None


class OneRowStep:
    """tokens, positions, slots [1, 1] and tables [1, W] -> the row's hidden state after the
    final norm [1, dim], keys and values written to the caches: what the runner's
    `_last_hidden` gives for one row. `programs`: the kernel's grid (one per multiprocessor on
    a GPU); `phases`: which phases a launch runs, `pdl` whether each launch may start while the
    one before runs (kernels.decode_layer.decode_layer)."""

    def __init__(
        self,
        model: Transformer,
        programs: int,
        phases: tuple[int, ...] = LAUNCHES,
        pdl: bool = False,
    ) -> None:
        config = model.config
        self.model = model
        self.phases = phases
        self.pdl = pdl
        self.layers: list[LayerTensors] = []
        for index, block in enumerate(model.layers):
            assert isinstance(block, TransformerBlock)
            attention, mlp = block.attention, block.feed_forward
            assert attention.kv_cache is not None, "call setup_caches() first"
            sliding = config.is_sliding(index)
            cos, sin = model.rope_cos, model.rope_sin
            if sliding:
                cos, sin = model.rope_local_cos, model.rope_local_sin
            self.layers.append(
                LayerTensors(
                    attention_norm=block.attention_norm.weight,
                    wqkv=attention.wqkv.weight,
                    q_norm=_weight(attention.q_norm),
                    k_norm=_weight(attention.k_norm),
                    wo=attention.wo.weight,
                    post_attention_norm=_weight(block.post_attention_norm),
                    ffn_norm=block.ffn_norm.weight,
                    w13=mlp.w13.weight,
                    w2=mlp.w2.weight,
                    post_ffn_norm=_weight(block.post_ffn_norm),
                    k_cache=attention.kv_cache.k,
                    v_cache=attention.kv_cache.v,
                    cos=cos,
                    sin=sin,
                    window=(config.sliding_window or 0) if sliding else 0,
                )
            )
        first = model.layers[0]
        assert isinstance(first, TransformerBlock)
        self.scale = first.attention.scale
        # Gemma scales embeddings by sqrt(dim) rounded to the model's dtype (model.py).
        self.embedding_scale = 1.0
        if config.scale_embeddings:
            self.embedding_scale = float(model.embedding_scale.item())
        weight = model.tok_embeddings.weight
        self.scratch = DecodeScratch(
            dim=config.dim, heads=config.n_heads, kv_heads=config.n_kv_heads,
            head_dim=config.head_dim, hidden=config.intermediate_size,
            layers=config.n_layers, programs=programs, dtype=weight.dtype, device=weight.device,
        )  # fmt: skip

    def __call__(self, tokens: Tensor, positions: Tensor, slots: Tensor, tables: Tensor) -> Tensor:
        assert tokens.shape == (1, 1), "one row of one token"
        model, config, scratch = self.model, self.model.config, self.scratch
        if 0 in self.phases:  # the persistent launch's barrier counters
            scratch.barriers.zero_()
        # The first layer reads its residual from the embedding table itself.
        embed = (tokens.view(1), model.tok_embeddings.weight, self.embedding_scale)
        pending: tuple[Tensor, Tensor | None] | None = None
        for index, layer in enumerate(self.layers):
            decode_layer(
                layer, scratch, index, pending=pending, embed=embed if index == 0 else None,
                positions=positions.view(1), slots=slots.view(1), table=tables[0],
                heads=config.n_heads, scale=self.scale, eps=config.norm_eps,
                weight_offset=config.norm_weight_offset, activation=config.activation,
                phases=self.phases, pdl=self.pdl,
            )  # fmt: skip
            pending = (scratch.down, layer.post_ffn_norm)
        post_ffn = self.layers[-1].post_ffn_norm
        normed = final_norm(
            scratch, post_ffn, model.norm.weight, config.norm_eps, config.norm_weight_offset
        )
        return normed.view(1, -1)
