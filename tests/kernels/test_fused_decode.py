"""The fused norm + product kernel for few-row decode steps (kernels/experimental/fused_decode):
its torch reference against the model's own modules (anywhere), and the kernel against the
reference (on a GPU, or on the CPU under TRITON_INTERPRET=1 where Triton is installed)."""

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import Tensor  # noqa: E402

from openjarvis.runtime.torch.model import (  # noqa: E402
    FeedForward,
    ModelConfig,
    RMSNorm,
    config_for,
)
from tests.kernels.triton_device import KERNEL_MARKS, kernel_device  # noqa: E402

Glu = str | None


def reference(
    x: Tensor,
    weight: Tensor,
    *,
    eps: float,
    pending: Tensor | None = None,
    x_out: Tensor | None = None,
    post: Tensor | None = None,
    pre: Tensor | None = None,
    offset: float = 0.0,
    glu: Glu = None,
    bias: Tensor | None = None,
) -> Tensor:
    """What `norm_gemv` computes, in torch, rounding where the model rounds."""

    def norm(value: Tensor, scale: Tensor) -> Tensor:
        normed = F.rms_norm(value.float(), (value.size(-1),), eps=eps)
        if offset:  # normed * (1 + w)
            return torch.addcmul(normed, normed, scale).to(value.dtype)
        return (normed * scale).to(value.dtype)

    value = x
    if pending is not None:
        value = x + (pending if post is None else norm(pending, post))
        assert x_out is not None
        x_out.copy_(value)
    if pre is not None:
        value = norm(value, pre)
    product = F.linear(value, weight, bias)
    if glu is None:
        return product
    gate, up = product.chunk(2, dim=-1)
    gate = F.silu(gate) if glu == "silu" else F.gelu(gate, approximate="tanh")
    return gate * up


def _norm(config: ModelConfig, generator: torch.Generator) -> RMSNorm:
    norm = RMSNorm(config.dim, config.norm_eps, config.norm_weight_offset)
    with torch.no_grad():
        norm.weight.normal_(0.0, 0.3, generator=generator)
    return norm.to(torch.bfloat16)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_the_reference_is_the_model_s_residual_norm_and_mlp(name: str) -> None:
    """h = x + post_norm(out); ffn(ffn_norm(h)) through model.py's modules in bf16 (Gemma's
    sandwich norm, its offset and its gelu; Llama's plain residual and silu) equals the
    reference's one call, and its new residual h too."""
    config = config_for(name)
    generator = torch.Generator().manual_seed(3)
    post = _norm(config, generator) if config.sandwich_norms else None
    pre = _norm(config, generator)
    mlp = FeedForward(config)
    with torch.no_grad():
        mlp.w13.weight.normal_(0.0, 0.2, generator=generator)
    mlp = mlp.to(torch.bfloat16)
    x = torch.randn(3, config.dim, generator=generator).to(torch.bfloat16)
    out = torch.randn(3, config.dim, generator=generator).to(torch.bfloat16)
    with torch.no_grad():
        h = x + (out if post is None else post(out))
        gate, up = mlp.w13(pre(h)).chunk(2, dim=-1)
        active = F.silu(gate) if config.activation == "silu" else F.gelu(gate, approximate="tanh")
        expected = active * up
        new_x = torch.empty_like(x)
        ours = reference(
            x,
            mlp.w13.weight,
            eps=config.norm_eps,
            pending=out,
            x_out=new_x,
            post=None if post is None else post.weight,
            pre=pre.weight,
            offset=config.norm_weight_offset,
            glu=config.activation,
        )
    assert torch.equal(new_x, h)
    assert torch.equal(ours, expected)


# Triton's interpreter turns float32 into bf16 by truncation, a GPU rounds to nearest: under the
# interpreter about half the rounded values sit one bf16 step lower, and the bounds are looser.


@KERNEL_MARKS[0]
@KERNEL_MARKS[1]
@pytest.mark.parametrize(
    ("rows", "dim", "features", "glu", "post", "offset", "bias"),
    [
        (1, 640, 1536, None, True, 1.0, False),  # Gemma 3 270M: q, k, v after sandwich norms
        (1, 640, 2048, "gelu_tanh", True, 1.0, False),  # its gate and up
        (3, 640, 640, None, False, 0.0, False),  # a product with no norm (attention out)
        (5, 200, 72, "silu", False, 0.0, False),  # odd sizes, Llama's plain residual
        (2, 200, 72, None, False, 0.0, True),  # q, k, v with Qwen 2's bias
    ],
)
def test_the_kernel_computes_the_reference(
    rows: int, dim: int, features: int, glu: Glu, post: bool, offset: float, bias: bool
) -> None:
    pytest.importorskip("triton")
    from openjarvis.kernels.experimental.fused_decode import norm_gemv

    device = kernel_device()
    generator = torch.Generator().manual_seed(rows)

    def randn(*shape: int, scale: float = 1.0) -> Tensor:
        value = torch.randn(*shape, generator=generator) * scale
        return value.to(device=device, dtype=torch.bfloat16)

    x, pending = randn(rows, dim), randn(rows, dim)
    has_norms = features != dim  # the attention-out case: a bare product
    weight = randn((2 if glu else 1) * features, dim, scale=dim**-0.5)
    arguments = {
        "eps": 1e-6,
        "pending": pending if has_norms else None,
        "post": randn(dim, scale=0.3) if post else None,
        "pre": randn(dim, scale=0.3) if has_norms else None,
        "offset": offset,
        "glu": glu,
        "bias": randn(features) if bias else None,
    }
    ours_x, expected_x = torch.empty_like(x), torch.empty_like(x)
    ours = norm_gemv(x, weight, x_out=ours_x, **arguments)  # type: ignore[arg-type]
    expected = reference(x, weight, x_out=expected_x, **arguments)  # type: ignore[arg-type]
    if has_norms:
        mismatched = (ours_x != expected_x).float().mean().item()
        assert mismatched <= (0.01 if device == "cuda" else 0.6), f"{mismatched:.1%} differ"
        assert torch.allclose(ours_x.float(), expected_x.float(), rtol=2**-6, atol=1e-2)
    error = ((ours.float() - expected.float()).norm() / expected.float().norm()).item()
    assert error < (1e-2 if device == "cuda" else 5e-2), f"relative difference {error:.2e}"
