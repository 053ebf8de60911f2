"""A Triton kernel compiled for an H100/H200 (sm_90) on a machine without a GPU, and what one
program of it takes there: registers a thread, bytes spilled to local memory, shared memory.

The compile sees the code as the GPU machine will, where Triton's interpreter runs it as Python
(an `if` on a float constexpr passes there and fails here). The figures say how many programs
of a launch fit a multiprocessor at once, and whether its loop's loads are copied ahead into
shared memory (Triton's software pipelining), which it does only for loads it can prove
aligned: a launch tells it which pointers and integers are, and so does this compile. The
one-row layer kernel's launches can only overlap (programmatic dependent launch) where a
program of the next fits beside one of the last (kernels/decode_layer.py,
benchmarks/kernel_resources.py). The figures are ptxas's for this Triton's bundled toolchain;
another Triton version allocates differently.
"""

import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

__all__ = ["Resources", "compile_sm90", "fit_together"]

# One H100/H200 multiprocessor (sm_90): its register file, shared memory, threads.
_REGISTERS = 65_536
_SHARED = 233_472  # 228 KB, of which each resident program also reserves 1 KB
_RESERVED = 1_024
_THREADS = 2_048

# Our kernels' arguments that are not pointers to bf16, by name (the same name, the same type
# in every kernel): what Triton would infer from the tensors and numbers of a launch.
_TYPES = {
    "token_ptr": "*i64", "position_ptr": "*i64", "slot_ptr": "*i64", "positions_ptr": "*i64",
    "slots_ptr": "*i64", "context_ptr": "*i64", "table": "*i32", "table_ptr": "*i32",
    "arrivals": "*i32", "bar": "*i32", "joins_ptr": "*i1", "cos_ptr": "*fp32",
    "sin_ptr": "*fp32", "best": "*fp32", "total": "*fp32", "acc": "*fp32", "best_ptr": "*fp32",
    "total_ptr": "*fp32", "acc_ptr": "*fp32", "embed_scale": "fp32", "scale": "fp32",
    "eps": "fp32", "window": "i32", "qkv_stride": "i32", "batch": "i32", "table_stride": "i32",
    "kv_block_stride": "i32", "kv_token_stride": "i32",
}  # fmt: skip
# Integer arguments whose values in our launches are multiples of 16 (cache strides: kv heads x
# head_dim; windows of 0 or 512), which a launch tells Triton as it does aligned pointers.
_MULTIPLES_OF_16 = {"kv_block_stride", "kv_token_stride", "qkv_stride", "window"}


@dataclass(frozen=True, slots=True)
class Resources:
    """One program's needs on sm_90."""

    registers: int  # a thread
    spilled: int  # bytes a thread keeps on its stack (register spills)
    shared: int  # bytes a program
    warps: int
    copies_ahead: bool = False  # loads copied to shared memory ahead of use (cp.async)

    def register_cost(self) -> int:
        """Registers a program holds: a warp's are allocated 256 at a time."""
        per_warp = -(-self.registers * 32 // 256) * 256
        return per_warp * self.warps

    def per_sm(self) -> int:
        """Programs of this launch one multiprocessor holds at once."""
        return min(
            _REGISTERS // self.register_cost(),
            _SHARED // (self.shared + _RESERVED),
            _THREADS // (32 * self.warps),
        )


def fit_together(first: Resources, second: Resources) -> bool:
    """Whether a program of each fits one multiprocessor at once."""
    return (
        first.register_cost() + second.register_cost() <= _REGISTERS
        and first.shared + second.shared + 2 * _RESERVED <= _SHARED
        and 32 * (first.warps + second.warps) <= _THREADS
    )


def compile_sm90(
    kernel: triton.JITFunction,
    constants: Mapping[str, object],
    *,
    warps: int,
    stages: int | None = None,
    pdl: bool = False,
) -> Resources:
    """`kernel` with `constants` for its constexpr arguments, its others typed by name
    (`_TYPES`; a pointer to bf16 where not named there)."""
    names = kernel.arg_names
    signature = {n: "constexpr" if n in constants else _TYPES.get(n, "*bf16") for n in names}
    # A launch tells Triton which pointers are 16-byte aligned (torch's allocations are) and
    # which integers are multiples of 16, which lets it load 16 bytes at a time and copy
    # ahead (cp.async): each pointer is, here, and the integers of `_MULTIPLES_OF_16`.
    aligned = [["tt.divisibility", 16]]
    attrs = {
        (i,): aligned
        for i, n in enumerate(names)
        if signature[n].startswith("*") or n in _MULTIPLES_OF_16
    }
    source = ASTSource(fn=kernel, signature=signature, constexprs=dict(constants), attrs=attrs)
    options: dict[str, object] = {"num_warps": warps}
    if stages is not None:
        options["num_stages"] = stages
    if pdl:
        options["launch_pdl"] = True
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    # Triton's CUDA back end carries cuobjdump; its resource line is the one place a
    # GPU-less compile states registers and stack.
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        report = subprocess.run(
            [tool, "-res-usage", cubin.name], capture_output=True, text=True, check=True
        ).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", report)
    assert found, f"no resource line in cuobjdump's report: {report!r}"
    registers, stack, static_shared = (int(g) for g in found.groups())
    # Triton's shared memory is dynamic (metadata.shared); the static is the kernel's own.
    shared = static_shared + int(compiled.metadata.shared)
    ahead = "cp.async" in compiled.asm["ptx"]
    return Resources(registers, stack, shared, warps, copies_ahead=ahead)
