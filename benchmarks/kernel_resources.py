"""What a program of each of the one-row layer kernel's phases takes on an H100/H200 (sm_90):
registers a thread, bytes spilled, shared memory, how many fit a multiprocessor, and whether a
program of each phase fits beside one of the phase before (what programmatic dependent launch
needs to load a phase's weights while the last phase runs). Compiled by this machine's Triton
for sm_90: no GPU needed; the figures are that Triton's (the GPU machine's may differ: run it
with the same version). Then attention (phase B) at other key tiles and warps, and the paged
attention kernel of the compiled step for comparison.

`PYTHONPATH=src python3 benchmarks/kernel_resources.py [--preset gemma-3-270m]`
"""

import argparse
import json

import triton

__all__ = ["main"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="gemma-3-270m")
    parser.add_argument("--programs", type=int, default=132, help="the grid: one per SM")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a launch constant of kernels/decode_layer.py for this run (_TILE=16, _WARPS=4, ...)",
    )
    args = parser.parse_args()
    from openjarvis.kernels import decode_layer
    from openjarvis.kernels.decode_layer import PHASES, decode_layer_kernel, warps
    from openjarvis.kernels.paged_attention import (
        _paged_attention_kernel,
        rows_per_program,
        tile_for,
    )
    from openjarvis.kernels.sm90 import Resources, compile_sm90, fit_together
    from openjarvis.runtime.torch.model import config_for
    from openjarvis.runtime.torch.one_row import kernel_constants

    for change in args.set:
        name, value = change.split("=")
        assert isinstance(getattr(decode_layer, name), int), f"not a launch constant: {name}"
        setattr(decode_layer, name, int(value))
    config = config_for(args.preset)
    layer = kernel_constants(config, block=16, programs=args.programs)
    print(f"Triton {triton.__version__}, {args.preset}, {args.programs} programs", *args.set)

    def phase(number: int, **changes: int) -> Resources:
        count = changes.pop("warps", warps(number))
        constants = {**layer, **changes, "PHASE": number, "PDL": False}
        return compile_sm90(decode_layer_kernel, constants, warps=count)

    def show(label: str, found: Resources, extra: str = "") -> None:
        print(
            f"{label:<34} {found.warps:>5} {found.registers:>9} {found.spilled:>7} "
            f"{found.shared:>8} {found.per_sm():>6} {'yes' if found.copies_ahead else '':>6}"
            f"  {extra}"
        )
        record = {"label": label, "warps": found.warps, "registers": found.registers}
        record |= {"spilled": found.spilled, "shared": found.shared, "per_sm": found.per_sm()}
        record |= {"copies_ahead": found.copies_ahead}
        print(json.dumps(record))

    header = f"{'launch':<34} {'warps':>5} {'registers':>9} {'spilled':>7} {'shared':>8}"
    print(f"{header} {'per SM':>6} {'ahead':>6}")
    launches = {number: phase(number) for number in range(1, PHASES + 1)}
    for number, found in launches.items():
        before = launches[number - 1 if number > 1 else PHASES]  # A follows the last layer's E
        fits = "fits beside the phase before" if fit_together(before, found) else ""
        show(f"phase {'ABCDE'[number - 1]} ({number})", found, fits)
    show("all five, persistent (0)", phase(0))
    for tile in (16, 32, 64, 128):
        for count in (4, 8):
            show(f"attention, {tile} keys a tile", phase(2, TILE=tile, warps=count))
    group = config.n_heads // config.n_kv_heads
    group_pad = triton.next_power_of_2(group)
    paged = {
        "GROUP": group, "GROUP_PAD": group_pad, "ROWS": rows_per_program(1, group),
        "HEAD_DIM": config.head_dim, "BLOCK": 16, "TILE": tile_for(config.head_dim),
        "ONE_SPLIT": False,
    }  # fmt: skip
    found = compile_sm90(_paged_attention_kernel, paged, warps=4, stages=2)
    show(f"compiled step's attention, {paged['TILE']} keys", found)


if __name__ == "__main__":
    main()
