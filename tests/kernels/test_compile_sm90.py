"""The one-row layer kernel and the RoPE/KV kernel compiled for an H100/H200 (sm_90) without a
GPU: Triton's front end and ptxas see the code as the GPU machine will, where the interpreter
runs it as Python (an `if` on a float constexpr passes there and fails to compile here)."""

import os

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("the interpreter's kernels are Python: no compile", allow_module_level=True)


def _layer(preset: str) -> dict[str, object]:
    from openjarvis.runtime.torch.model import config_for
    from openjarvis.runtime.torch.one_row import kernel_constants

    return kernel_constants(config_for(preset), block=16, programs=132)


@pytest.mark.parametrize(
    ("phase", "pdl"), [(0, False), *((p, False) for p in range(1, 6)), (4, True)]
)
def test_the_layer_kernel_compiles_for_sm90(phase: int, pdl: bool) -> None:
    from openjarvis.kernels.decode_layer import decode_layer_kernel, gdc_wait, warps
    from openjarvis.kernels.sm90 import compile_sm90

    if pdl and gdc_wait is None:
        pytest.skip("this Triton has no grid dependency controls")
    # Gemma 3 270M (the engine's one measured model), its first layer reading the embedding.
    constants = {**_layer("gemma-3-270m"), "EMBED": True, "PHASE": phase, "PDL": pdl}
    found = compile_sm90(decode_layer_kernel, constants, warps=warps(phase), pdl=pdl)
    assert 0 < found.registers <= 255 and found.per_sm() >= 1


def test_other_model_families_compile_for_sm90() -> None:
    """Llama's SwiGLU without q/k norms or sandwich norms, Qwen 3's q/k norms: each phase."""
    from openjarvis.kernels.decode_layer import decode_layer_kernel, warps
    from openjarvis.kernels.sm90 import compile_sm90

    for preset in ("tiny-llama", "tiny-qwen3"):
        for phase in range(1, 6):
            constants = {**_layer(preset), "PHASE": phase, "PDL": False}
            compile_sm90(decode_layer_kernel, constants, warps=warps(phase))


def test_the_final_norm_and_rope_kernels_compile_for_sm90() -> None:
    from openjarvis.kernels.decode_layer import _final_norm_kernel
    from openjarvis.kernels.rope_kv import _rope_write_kv_kernel
    from openjarvis.kernels.sm90 import compile_sm90

    final = {"DIM": 640, "DIM_P": 1024, "SANDWICH": True, "OFFSET": True}
    compile_sm90(_final_norm_kernel, final, warps=4)
    rope = {
        "HEADS": 4, "KV_HEADS": 1, "HEAD_DIM": 256, "HEAD_PAD": 256, "ROTATED_PAD": 8,
        "KV_PAD": 1, "NORM": True, "OFFSET": True,
    }  # fmt: skip
    compile_sm90(_rope_write_kv_kernel, rope, warps=4)


def test_a_program_s_fit_follows_its_registers_and_shared_memory() -> None:
    from openjarvis.kernels.sm90 import Resources, fit_together

    light = Resources(registers=121, spilled=0, shared=512, warps=8)  # 128 a thread: 32,768
    heavy = Resources(registers=255, spilled=368, shared=73_728, warps=8)  # the whole file
    assert light.register_cost() == 32_768 and light.per_sm() == 2
    assert heavy.register_cost() == 65_536 and heavy.per_sm() == 1
    assert fit_together(light, light) and not fit_together(light, heavy)
    wide = Resources(registers=32, spilled=0, shared=120_000, warps=4)
    assert wide.per_sm() == 1 and not fit_together(wide, wide)


def test_the_compiled_step_s_attention_copies_its_loads_ahead_as_launched() -> None:
    """The paged attention kernel (Gemma 3 270M's heads of 256, 4 query heads a KV head)
    compiled with the facts a launch gives Triton: its loop's loads are pipelined through
    shared memory (cp.async), which they are not without them (scalar loads, nothing ahead)."""
    from openjarvis.kernels.paged_attention import _paged_attention_kernel, tile_for
    from openjarvis.kernels.sm90 import compile_sm90

    constants = {
        "GROUP": 4, "GROUP_PAD": 4, "ROWS": 4, "HEAD_DIM": 256, "BLOCK": 16,
        "TILE": tile_for(256), "ONE_SPLIT": False,
    }  # fmt: skip
    found = compile_sm90(_paged_attention_kernel, constants, warps=4, stages=2)
    assert found.copies_ahead and found.spilled == 0
