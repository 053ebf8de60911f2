"""The one-row layer kernel and the RoPE/KV kernel compiled for an H100/H200 (sm_90) without a
GPU: Triton's front end and ptxas see the code as the GPU machine will, where the interpreter
runs it as Python (an `if` on a float constexpr passes there and fails to compile here)."""

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("torch")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

# Gemma 3 270M's shape: the engine's one measured model.
LAYER = {
    "DIM": 640, "DIM_P": 1024, "HEADS": 4, "KV_HEADS": 1, "HEAD_DIM": 256, "HIDDEN": 2048,
    "HIDDEN_P": 2048, "ATT_P": 1024, "BLOCK": 16, "TILE": 64, "SPLITS": 132, "QUERIES": 16,
    "N_QKV": 16, "N_O": 8, "N_13": 16, "N_2": 8, "HAS_PENDING": True, "SANDWICH": True,
    "QK_NORM": True, "OFFSET": True, "GLU": 2, "EMBED": True,
}  # fmt: skip
TYPES = {
    "token_ptr": "*i64", "position_ptr": "*i64", "slot_ptr": "*i64", "positions_ptr": "*i64",
    "slots_ptr": "*i64", "table": "*i32", "arrivals": "*i32", "bar": "*i32", "cos_ptr": "*fp32",
    "sin_ptr": "*fp32", "best": "*fp32", "total": "*fp32", "acc": "*fp32",
    "embed_scale": "fp32", "scale": "fp32", "eps": "fp32", "window": "i32", "qkv_stride": "i32",
}  # fmt: skip


def _compile(kernel: object, constants: dict[str, object], pdl: bool = False) -> None:
    names = kernel.arg_names  # type: ignore[attr-defined]
    signature = {n: "constexpr" if n in constants else TYPES.get(n, "*bf16") for n in names}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    options = {"num_warps": 8, **({"launch_pdl": True} if pdl else {})}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    assert compiled.asm["cubin"]


@pytest.mark.parametrize(
    ("phase", "pdl"), [(0, False), *((p, False) for p in range(1, 6)), (4, True)]
)
def test_the_layer_kernel_compiles_for_sm90(phase: int, pdl: bool) -> None:
    from openjarvis.kernels.decode_layer import decode_layer_kernel, gdc_wait

    if pdl and gdc_wait is None:
        pytest.skip("this Triton has no grid dependency controls")
    _compile(decode_layer_kernel, {**LAYER, "PHASE": phase, "PDL": pdl}, pdl)


def test_the_final_norm_and_rope_kernels_compile_for_sm90() -> None:
    from openjarvis.kernels.decode_layer import _final_norm_kernel
    from openjarvis.kernels.rope_kv import _rope_write_kv_kernel

    _compile(_final_norm_kernel, {"DIM": 640, "DIM_P": 1024, "SANDWICH": True, "OFFSET": True})
    _compile(_rope_write_kv_kernel, {
        "HEADS": 4, "KV_HEADS": 1, "HEAD_DIM": 256, "HEAD_PAD": 256, "ROTATED_PAD": 8,
        "KV_PAD": 1, "NORM": True, "OFFSET": True,
    })  # fmt: skip
